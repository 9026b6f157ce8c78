import { setTimeout as sleep } from 'node:timers/promises';
import type { AuditEntry } from '../core/audit.js';
import { DEMO_LAUNCHER, type SimEnvironment } from './environment.js';
import { slurmNode } from './parts.js';

/**
 * The recovery ladder on the real parts: one registered job on node-1..4 with
 * warm standbys held in a Slurm reservation, then four incidents —
 *  0. a worker crash with no culprit → stop-time diagnostics on every node's agent → the node
 *     whose GPU check fails is evicted onto the first standby;
 *  1. a fatal Xid → evict, a standby takes the node's place, restart, restore from the newest
 *     complete checkpoint step;
 *  2. a NIC flap once (through the real Alertmanager) → tolerated; a second within 5 minutes →
 *     evicted onto the second standby;
 *  3. an urgent code update, then a Python exception in a worker → rollback to the last good version.
 */

export interface RecoveryStep {
  readonly title: string;
  readonly ok: boolean;
  readonly lines: string[];
}

const JOB = 'llama-demo';

async function api(env: SimEnvironment, path: string, body?: unknown): Promise<{ status: number; body: Record<string, unknown> }> {
  const response = await fetch(`${env.controllerUrl}${path}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { authorization: `Bearer ${env.credentials.operator}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

async function until(check: () => Promise<boolean>, timeoutMs = 20_000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return true;
    await sleep(100);
  }
  return false;
}

async function jobRecord(env: SimEnvironment): Promise<{ state: string; nodes: string[]; version: string }> {
  const record = await env.controller.jobs.get(JOB);
  return { state: record.state, nodes: record.spec.nodes, version: record.spec.codeVersion };
}

function newEntries(all: AuditEntry[], since: number): AuditEntry[] {
  return all.filter((entry) => Number(entry.id.split('-')[0]) >= since && (entry.type !== 'signal' || entry.summary.includes(JOB)));
}

function describe(entries: AuditEntry[]): string[] {
  return entries.filter((entry) => entry.type !== 'signal' || entry.summary.includes('job')).map((entry) => `${entry.type.padEnd(8)} ${entry.summary}`);
}

/** Sends an alert to the real Alertmanager, which routes it to the controller's webhook. */
async function fireAlert(env: SimEnvironment, labels: Record<string, string>): Promise<void> {
  const response = await fetch(`${env.alertmanager.url}/api/v2/alerts`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify([{ labels, annotations: { summary: 'injected by the demo' }, startsAt: new Date().toISOString() }]),
  });
  if (!response.ok) throw new Error(`Alertmanager refused the alert: ${response.status}`);
}

export async function runRecoveryScenario(env: SimEnvironment): Promise<RecoveryStep[]> {
  const steps: RecoveryStep[] = [];
  const names = env.nodes.map((node) => node.name);
  const [n1, n2, n3, n4, spare1, spare2, spare3] = names as [string, string, string, string, string, string, string];
  const backend = env.controller.backend;
  // One standby for the first incident; the other two are held once it is over, so each rung's
  // replacement is known in advance.
  await backend.holdStandby(spare3);
  const registered = await api(env, '/api/v1/jobs', {
    name: JOB,
    nodes: [n1, n2, n3, n4],
    ranksPerNode: 1,
    topology: { pp: 2, dp: 2, order: 'tp-dp-pp' },
    // The demo has no real training to submit: its launcher echoes the sbatch it would run.
    launcher: DEMO_LAUNCHER,
    codeVersion: 'v1',
  });
  const shards = [200, 210].flatMap((step) =>
    [0, 1, 2, 3].flatMap((rank) => [
      { step, rank, tier: 'host', holder: [n1, n2, n3, n4][rank] },
      { step, rank, tier: 'peer', holder: [n1, n2, n3, n4][3 - rank] },
    ]),
  );
  await api(env, `/api/v1/jobs/${JOB}/checkpoints`, shards);
  steps.push({
    title: `registered job ${JOB} on ${n1}..${n4} (PP=2, DP=2), standby ${spare3} held in the Slurm reservation, checkpoints up to step 210`,
    ok: registered.status === 201 && (await backend.standbys()).length === 1,
    lines: [`standbys (slurmrestd reservation): ${(await backend.standbys()).join(', ')}`],
  });

  // 0. A crash without a culprit → stop-time diagnostics on every node → the node whose GPU
  //    check fails is evicted onto the standby (ByteRobust §4.2).
  let since = Date.now();
  env.node(n4).failDiagnostics('GPU 5 failed the memory test (a silent fault: no Xid, no alert)');
  await api(env, '/api/v1/signals', {
    kind: 'worker_failed',
    node: n1,
    job: JOB,
    rank: 0,
    message: 'train.py FAILED: rank 3 exitcode -6 (SIGABRT)',
    time: new Date().toISOString(),
  });
  const diagnosed = await until(async () => {
    const job = await jobRecord(env);
    return job.state === 'running' && job.nodes.includes(spare3);
  }, 30_000);
  const slurm4 = await slurmNode(env.slurm, n4);
  steps.push({
    title: `a worker crash with no culprit → stop-time diagnostics on every node's agent → ${n4} fails its GPU check → evicted onto ${spare3}`,
    ok: diagnosed && /^drain/.test(slurm4.state) && !(await jobRecord(env)).nodes.includes(n4),
    lines: [...describe(newEntries(await env.audit(), since)), `sinfo ${n4}: ${slurm4.state} "${slurm4.reason}"`],
  });
  await backend.holdStandby(spare1);
  await backend.holdStandby(spare2);

  // 1. Fatal Xid → evict, standby, restart, restore.
  since = Date.now();
  env.node(n2).injectXid(1, 79, 'GPU has fallen off the bus.');
  const first = await until(async () => {
    const job = await jobRecord(env);
    return job.state === 'running' && job.nodes.includes(spare1);
  });
  const slurm2 = await slurmNode(env.slurm, n2);
  steps.push({
    title: `fatal Xid 79 on ${n2} → evicted, ${spare1} activated in its place, job restarted and restored`,
    ok: first && /^drain/.test(slurm2.state),
    lines: [
      ...describe(newEntries(await env.audit(), since)),
      `sinfo ${n2}: ${slurm2.state} "${slurm2.reason}"`,
      `job nodes: ${(await jobRecord(env)).nodes.join(', ')}`,
    ],
  });

  // 2. NIC flap once → tolerated; twice within 5 min → evicted.
  since = Date.now();
  const flap = { alertname: 'SteadfastRdmaPortFlapping', node: n3, device: 'mlx5_0', port: '1', severity: 'critical', domain: 'network' };
  await fireAlert(env, flap);
  const tolerated = await until(async () =>
    (await env.audit()).some((entry) => Number(entry.id.split('-')[0]) >= since && entry.type === 'decision' && entry.summary.includes('tolerate')),
  );
  const afterFirst = await slurmNode(env.slurm, n3);
  await fireAlert(env, { ...flap, device: 'mlx5_1' });
  const second = await until(async () => (await jobRecord(env)).nodes.includes(spare2) && (await jobRecord(env)).state === 'running');
  const slurm3 = await slurmNode(env.slurm, n3);
  steps.push({
    title: `NIC flap on ${n3}: the first is tolerated, the second within 5 minutes evicts it onto ${spare2}`,
    ok: tolerated && !/^drain/.test(afterFirst.state) && second && /^drain/.test(slurm3.state),
    lines: [...describe(newEntries(await env.audit(), since)), `sinfo ${n3} after the first flap: ${afterFirst.state}; after the second: ${slurm3.state}`],
  });

  // 3. Urgent update to v2, then a Python exception → rollback to v1.
  since = Date.now();
  await api(env, `/api/v1/jobs/${JOB}/code-updates`, { version: 'v2', urgent: true });
  const updated = await until(async () => (await jobRecord(env)).version === 'v2' && (await jobRecord(env)).state === 'running');
  const failure = {
    kind: 'worker_failed',
    node: n1,
    job: JOB,
    rank: 0,
    message:
      "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED; rank 0 exitcode 1: TypeError: unsupported operand type(s) for +: 'NoneType' and 'int'",
    time: new Date().toISOString(),
  };
  await api(env, '/api/v1/signals', failure);
  const rolledBack = await until(async () => (await jobRecord(env)).version === 'v1' && (await jobRecord(env)).state === 'running');
  steps.push({
    title: 'urgent code update to v2, then a TypeError in a worker → rolled back to v1 and restarted',
    ok: updated && rolledBack,
    lines: describe(newEntries(await env.audit(), since)),
  });
  const ettr = await env.controller.jobs.ettr(JOB);
  steps.push({ title: `job ${JOB} ETTR since registration ${(ettr.cumulative * 100).toFixed(1)} %`, ok: true, lines: [] });
  return steps;
}
