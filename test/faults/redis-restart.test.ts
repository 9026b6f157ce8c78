import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AuditLog } from '../../core/audit.js';
import { silentLogger } from '../../core/log.js';
import { Keys, workerConnection, type Redis } from '../../core/redis.js';
import { Controller } from '../../controller/service.js';
import { ControlPlane } from '../../sim/control-plane.js';

/**
 * Redis dies (SIGKILL) and comes back in the middle of an alert storm. It runs with AOF and
 * `appendfsync always` (sim/parts.ts), and the intake answers 202 only once a request's signals
 * are stored: every signal that was ever answered 202 must reach the audit after the restart,
 * once, and the fatal ones must drain their node in Slurm exactly once. Senders retry whatever
 * was not answered 202 (503 while Redis is away), as Alertmanager and the agents do.
 */

const VICTIMS = Array.from({ length: 30 }, (_, index) => `r-${String(index + 1).padStart(2, '0')}`);
const BYSTANDERS = Array.from({ length: 10 }, (_, index) => `b-${String(index + 1).padStart(2, '0')}`);
const PREFIX = 'storm';

interface Sent {
  readonly url: string;
  readonly body: unknown;
}

describe('Redis restarted in the middle of an alert storm', () => {
  let plane: ControlPlane;
  let controller: Controller;
  let url: string;
  let reader: Redis;

  beforeAll(async () => {
    plane = await ControlPlane.start({ nodes: [...VICTIMS, ...BYSTANDERS], ownRedis: true });
    controller = new Controller({ config: plane.controllerConfig(PREFIX), logger: silentLogger() });
    url = `http://127.0.0.1:${(await controller.start()).port}`;
    reader = workerConnection(plane.redisUrl);
    // It reconnects by itself once Redis is back; while it is away there is nothing to do.
    reader.on('error', () => undefined);
  }, 60_000);

  afterAll(async () => {
    reader?.disconnect();
    await controller?.close();
    await plane?.stop();
  });

  /** Sends until answered 202, like a sender whose retries outlast the outage; returns the stored ids and the statuses seen. */
  async function deliver(request: Sent, deadline: number): Promise<{ ids: string[]; statuses: (number | string)[] }> {
    const statuses: (number | string)[] = [];
    while (Date.now() < deadline) {
      try {
        const response = await fetch(request.url, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer ${plane.credentials.operator}` },
          body: JSON.stringify(request.body),
          signal: AbortSignal.timeout(5000),
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

  it('loses no signal it answered 202 for, and drains each faulty node once', async () => {
    const requests: Sent[] = [];
    const start = Date.now();
    for (let index = 0; index < 240; index += 1) {
      const time = new Date(start + index).toISOString();
      const bystander = BYSTANDERS[index % BYSTANDERS.length] as string;
      if (index % 8 === 0) {
        const node = VICTIMS[(index / 8) % VICTIMS.length] as string;
        requests.push({ url: `${url}/api/v1/signals`, body: { kind: 'xid', node, gpu: '0000:3a:00', xid: 79, message: 'GPU has fallen off the bus.', time } });
      } else if (index % 2 === 0) {
        requests.push({ url: `${url}/api/v1/signals`, body: { kind: 'xid', node: bystander, gpu: '0000:18:00', xid: 13, message: 'Graphics Exception', time } });
      } else {
        const alerts = [0, 1].map((gpu) => ({
          status: 'firing',
          labels: { alertname: 'SteadfastGpuTemperatureHigh', node: bystander, gpu: String(gpu), pci_bus_id: `0000:1${gpu}:00`, severity: 'warning', domain: 'gpu' },
          annotations: { summary: 'A GPU runs hot.' },
          startsAt: time,
        }));
        requests.push({ url: `${url}/api/v1/alerts`, body: { version: '4', status: 'firing', receiver: 'steadfast-controller', alerts } });
      }
    }

    // Eight senders work through the storm over about six seconds; Redis is killed after two.
    const deadline = Date.now() + 40_000;
    const queue = [...requests];
    const results: { ids: string[]; statuses: (number | string)[] }[] = [];
    const senders = Array.from({ length: 8 }, async () => {
      for (let request = queue.shift(); request; request = queue.shift()) {
        results.push(await deliver(request, deadline));
        await sleep(200);
      }
    });
    await sleep(2000);
    const sentBeforeCrash = results.length;
    await plane.crashRedis(1000);
    await Promise.all(senders);

    const accepted = new Set(results.flatMap((result) => result.ids));
    const refusedDuringOutage = results.filter((result) => result.statuses.some((status) => status !== 202)).length;
    expect(results).toHaveLength(requests.length);
    expect(results.every((result) => result.ids.length > 0), 'every request was eventually answered 202').toBe(true);
    // The crash did fall in the storm: requests were answered before it and some were turned away during it.
    expect(sentBeforeCrash).toBeGreaterThan(0);
    expect(refusedDuringOutage).toBeGreaterThan(0);

    const audit = new AuditLog(reader, new Keys(PREFIX));
    const audited = await (async () => {
      const until = Date.now() + 60_000;
      for (;;) {
        const refs = (await audit.read({ limit: 10_000, type: 'signal' })).map((entry) => entry.ref);
        const missing = [...accepted].filter((id) => !refs.includes(id));
        if (missing.length === 0 || Date.now() > until) return { refs, missing };
        await sleep(250);
      }
    })();
    expect(audited.missing, 'accepted signals that never reached the audit').toEqual([]);
    expect(new Set(audited.refs).size).toBe(audited.refs.length);

    await sleep(1000);
    const drains = plane.slurmDrainCounts();
    for (const node of VICTIMS) expect(drains.get(node), `Slurm drains of ${node}`).toBe(1);
    for (const node of BYSTANDERS) expect(drains.has(node), `${node} drained`).toBe(false);
  }, 120_000);
});
