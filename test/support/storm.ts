import { setTimeout as sleep } from 'node:timers/promises';
import { AuditLog } from '../../core/audit.js';
import { Keys, type Redis } from '../../core/redis.js';
import { waitFor } from '../../tryit/processes.js';

/**
 * An alert storm for the fault tests: fatal Xids on the victims over the agents' fast path, minor
 * Xids and GPU-temperature webhooks about bystanders, and senders that retry whatever was not
 * answered 202 until a deadline, as Alertmanager and the agents do.
 */

export interface StormRequest {
  readonly url: string;
  readonly body: unknown;
  /** The node a fast-path event is about (whose agent sends it); absent for a webhook. */
  readonly node?: string;
}

export interface Delivery {
  /** The signal ids of the 202 answer; empty when none came before the deadline. */
  readonly ids: string[];
  /** Every answer's status, or the error's name when there was none. */
  readonly statuses: (number | string)[];
}

/**
 * `count` requests against the controller at `url`: every eighth a fatal Xid 79 on the next
 * victim, every other even one a minor Xid on a bystander, the odd ones a webhook of
 * `alertsPerWebhook` GPU-temperature alerts about a bystander.
 */
export function stormRequests(url: string, count: number, victims: readonly string[], bystanders: readonly string[], alertsPerWebhook: number): StormRequest[] {
  const requests: StormRequest[] = [];
  const start = Date.now();
  for (let index = 0; index < count; index += 1) {
    const time = new Date(start + index).toISOString();
    const bystander = bystanders[index % bystanders.length] as string;
    if (index % 8 === 0) {
      const node = victims[(index / 8) % victims.length] as string;
      requests.push({
        url: `${url}/api/v1/signals`,
        node,
        body: { kind: 'xid', node, gpu: '0000:3a:00', xid: 79, message: 'GPU has fallen off the bus.', time },
      });
    } else if (index % 2 === 0) {
      requests.push({
        url: `${url}/api/v1/signals`,
        node: bystander,
        body: { kind: 'xid', node: bystander, gpu: '0000:18:00', xid: 13, message: 'Graphics Exception', time },
      });
    } else {
      const alerts = Array.from({ length: alertsPerWebhook }, (_, gpu) => ({
        status: 'firing',
        labels: {
          alertname: 'SteadfastGpuTemperatureHigh',
          node: bystander,
          gpu: String(gpu),
          pci_bus_id: `0000:1${gpu}:00`,
          severity: 'warning',
          domain: 'gpu',
        },
        annotations: { summary: 'A GPU runs hot.' },
        startsAt: time,
      }));
      requests.push({ url: `${url}/api/v1/alerts`, body: { version: '4', status: 'firing', receiver: 'steadfast-controller', alerts } });
    }
  }
  return requests;
}

/** Who sends a storm request: Alertmanager a webhook, the node's own agent a fast-path event. */
export function stormCredential(credentials: { readonly alertmanager: string; agentToken(node: string): string }, request: StormRequest): string {
  return request.node === undefined ? credentials.alertmanager : credentials.agentToken(request.node);
}

/** Sends until answered 202 or past the deadline. */
export async function deliverUntilAccepted(request: StormRequest, credential: string, deadline: number, timeoutMs: number): Promise<Delivery> {
  const statuses: (number | string)[] = [];
  while (Date.now() < deadline) {
    try {
      const response = await fetch(request.url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${credential}` },
        body: JSON.stringify(request.body),
        signal: AbortSignal.timeout(timeoutMs),
      });
      const body = (await response.json()) as { ids?: string[] };
      statuses.push(response.status);
      if (response.status === 202) return { ids: body.ids ?? [], statuses };
    } catch (error) {
      statuses.push(error instanceof Error ? error.name : 'error');
    }
    await sleep(250);
  }
  return { ids: [], statuses };
}

/** `senders` concurrent senders working through `requests`, pausing `pauseMs` between their requests; one result per request. */
export function sendStorm(
  requests: readonly StormRequest[],
  senders: number,
  pauseMs: number,
  deliver: (request: StormRequest) => Promise<Delivery>,
): { results: Delivery[]; done: Promise<void> } {
  const queue = [...requests];
  const results: Delivery[] = [];
  const workers = Array.from({ length: senders }, async () => {
    for (let request = queue.shift(); request; request = queue.shift()) {
      results.push(await deliver(request));
      await sleep(pauseMs);
    }
  });
  return { results, done: Promise.all(workers).then(() => undefined) };
}

/**
 * Waits until every accepted signal id is in the audit under `prefix`, or `timeoutMs` passes;
 * returns the audited signal refs and the accepted ids still missing.
 */
export async function waitForAudited(
  reader: Redis,
  prefix: string,
  accepted: ReadonlySet<string>,
  timeoutMs: number,
): Promise<{ refs: string[]; missing: string[] }> {
  const audit = new AuditLog(reader, new Keys(prefix));
  const until = Date.now() + timeoutMs;
  for (;;) {
    const refs = (await audit.read({ limit: 10_000, type: 'signal' })).map((entry) => entry.ref);
    const missing = [...accepted].filter((id) => !refs.includes(id));
    if (missing.length === 0 || Date.now() > until) return { refs, missing };
    await sleep(250);
  }
}

/** Waits until `count` requests of a storm have been answered (202 or given up on), so that a fault injected next falls inside it. */
export async function waitForAnswered(results: readonly Delivery[], count: number, timeoutMs = 30_000): Promise<void> {
  await waitFor(
    `${count} requests of the storm to be answered`,
    () => Promise.resolve(results.length >= count),
    timeoutMs,
    20,
    () => Promise.resolve(`${results.length} answered`),
  );
}

/**
 * Waits until slurmctld logged a drain of every one of `nodes`; returns the drain count per node
 * then, so that a test can hold each to one (a second drain comes from the same decisions, which
 * are all made by the time the signals are audited).
 */
export async function waitForDrains(drainCounts: () => Map<string, number>, nodes: readonly string[], timeoutMs = 30_000): Promise<Map<string, number>> {
  await waitFor(
    'every faulty node to be drained',
    () => Promise.resolve(nodes.every((node) => drainCounts().has(node))),
    timeoutMs,
    100,
    () => Promise.resolve(`drained: ${[...drainCounts().keys()].join(', ') || 'none'}`),
  );
  return drainCounts();
}
