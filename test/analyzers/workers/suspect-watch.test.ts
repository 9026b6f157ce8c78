import { describe, expect, it } from 'vitest';
import type { JobSpec } from '../../../core/job.js';
import type { Signal } from '../../../core/signal.js';
import { signalSchema } from '../../../core/signal.js';
import { classifySignal } from '../../../controller/policy/fault-class.js';
import { SuspectWatch } from '../../../analyzers/workers/suspect-watch.js';
import type { FeatureReading } from '../../../analyzers/multisignal/source.js';

const JOB_NODES = ['g00', 'g01', 'g02', 'g03', 'g04', 'g05', 'g06', 'g07'];
const job = (name: string, nodes: string[]): JobSpec => ({ name, nodes, ranksPerNode: 8, launcher: 'accept', codeVersion: 'v1' }) as JobSpec;

/** Healthy nodes with small differences; `hot` runs hot, slow and retransmitting; `warm` runs 15 °C warmer than its peers, for no fault. */
function reading(hot: string | undefined, idle: string[] = [], warm?: string): FeatureReading {
  const matrix: Record<string, Record<string, number>> = {};
  for (const [index, node] of [...JOB_NODES, ...idle].entries()) {
    const busy = !idle.includes(node);
    matrix[node] = {
      gpu_temperature_celsius: (busy ? 70 : 35) + (index % 3),
      gpu_power_watts: (busy ? 600 : 80) + index * 2,
      gpu_utilization: busy ? 0.95 : 0,
      training_iteration_seconds: 1.0 + index * 0.002,
      rdma_transport_retries_per_second: index % 2,
    };
  }
  if (warm) (matrix[warm] as Record<string, number>).gpu_temperature_celsius = 85;
  if (hot)
    Object.assign(matrix[hot] as object, {
      gpu_temperature_celsius: 92,
      gpu_power_watts: 380,
      training_iteration_seconds: 1.4,
      rdma_transport_retries_per_second: 40,
    });
  return { matrix, answered: ['gpu_temperature_celsius'], empty: [], failures: [], warnings: [] };
}

describe('multi-signal detection in the controller', () => {
  it('raises a node that stays unlike the peers of its job as one suspect_node signal, with the evidence, then holds off', async () => {
    let current = reading(undefined, ['idle-1', 'idle-2']);
    const enqueued: Signal[] = [];
    const watch = new SuspectWatch({ source: { read: async () => current }, enqueue: async (signals) => void enqueued.push(...signals) });
    const jobs = [job('big', JOB_NODES)];
    for (let minute = 0; minute < 5; minute += 1) expect(await watch.run(jobs, minute * 60_000)).toEqual([]);
    current = reading('g05', ['idle-1', 'idle-2']);
    for (let minute = 5; minute < 30; minute += 1) await watch.run(jobs, minute * 60_000);
    expect(enqueued).toHaveLength(1);
    const signal = signalSchema.parse(enqueued[0]);
    expect(signal).toMatchObject({ kind: 'suspect_node', node: 'g05', job: 'big', severity: 'warning', source: 'analyzer' });
    expect(Object.keys(signal.evidence)).toEqual(expect.arrayContaining(['feature.gpu_temperature_celsius', 'feature.training_iteration_seconds']));
    // The idle nodes outside the job are never compared with it, so never raised.
    expect(enqueued.map((entry) => entry.node)).not.toContain('idle-1');
  });

  it("hands a suspect on a job's node to the ladder as a performance anomaly (aggregation, not eviction)", () => {
    const signal = {
      id: 's-1',
      kind: 'suspect_node',
      node: 'g05',
      job: 'big',
      severity: 'warning',
      time: new Date(0).toISOString(),
      receivedAt: new Date(0).toISOString(),
      fingerprint: 'suspect_node/g05/-/0',
      source: 'analyzer',
      evidence: { score: 12.5 },
    } as const;
    expect(classifySignal(signal)).toMatchObject({ verdict: 'fault', faultClass: 'performance', node: 'g05' });
  });

  it("learns a job's nodes from Prometheus' history before judging them: a node that always ran warmer is not raised at the start, a node that changed is", async () => {
    const reads: number[] = [];
    const enqueued: Signal[] = [];
    const start = 10 * 3600_000;
    // History (before the watch starts): g02 already ran warm, g05 was like its peers.
    const source = { read: async (time: number) => (reads.push(time), time < start ? reading(undefined, [], 'g02') : reading('g05', [], 'g02')) };
    const watch = new SuspectWatch({ source, enqueue: async (signals) => void enqueued.push(...signals) });
    const jobs = [job('big', JOB_NODES), job('small', ['s0', 's1', 's2', 's3', 's4'])];
    for (let minute = 0; minute < 12; minute += 1) await watch.run(jobs, start + minute * 60_000);
    expect(enqueued.map((signal) => signal.node)).toEqual(['g05']);
    // The warm-up read two hours of history once, ten minutes apart, shared by both new jobs.
    const past = reads.filter((time) => time < start);
    expect(past).toEqual(Array.from({ length: 12 }, (_, index) => start - (12 - index) * 600_000));
    expect(reads.filter((time) => time >= start)).toHaveLength(12);
  });

  it('judges a node it has no history of on known-meaning levels only until its own normal is learnt, and raises it once it changes', async () => {
    const enqueued: Signal[] = [];
    let current = reading(undefined, [], 'g02');
    // Prometheus cannot answer for the past (a new cluster, short retention): the nodes are learnt online.
    const source = { read: async (time: number) => (time < 0 ? Promise.reject(new Error('no history')) : current) };
    const watch = new SuspectWatch({ source, enqueue: async (signals) => void enqueued.push(...signals) });
    const jobs = [job('big', JOB_NODES)];
    for (let minute = 0; minute < 40; minute += 1) {
      // Known-meaning levels are judged from the first minute: a fatal Xid on g03 at minute 3.
      current = reading(undefined, [], 'g02');
      for (const node of JOB_NODES) (current.matrix[node] as Record<string, number>).xid_fatal_5m = minute === 3 && node === 'g03' ? 1 : 0;
      await watch.run(jobs, minute * 60_000);
    }
    // The warm node was never raised: it was learnt before it was judged.
    expect(enqueued.map((signal) => [signal.node, signal.evidence.reason])).toEqual([['g03', 'raise']]);
    enqueued.length = 0;
    current = reading('g05', [], 'g02');
    for (let minute = 40; minute < 55; minute += 1) await watch.run(jobs, minute * 60_000);
    expect(enqueued.map((signal) => signal.node)).toEqual(['g05']);
  });

  it("does not learn a new job's nodes from history in which they sat idle: a node on a lighter pipeline stage is learnt in the job, not raised when it starts", async () => {
    const others = ['o0', 'o1', 'o2', 'o3', 'o4', 'o5'];
    const start = 10 * 3600_000;
    const row = (busy: boolean, index: number, lighter = false) => ({
      gpu_temperature_celsius: (busy ? 70 : 35) + (index % 3),
      gpu_power_watts: (busy ? (lighter ? 480 : 600) : 80) + index * 2,
      gpu_utilization: busy ? (lighter ? 0.8 : 0.95) : 0,
      rdma_transport_retries_per_second: index % 2,
      ...(busy ? { training_iteration_seconds: 1.0 + index * 0.002 } : {}),
    });
    // Before the job: its nodes idle, another job's nodes training. From the start: g05 on a lighter stage.
    const readAt = (time: number): FeatureReading => ({
      matrix: Object.fromEntries([
        ...JOB_NODES.map((node, index) => [node, row(time >= start, index, node === 'g05')]),
        ...others.map((node, index) => [node, row(true, index)]),
      ]),
      answered: ['gpu_temperature_celsius'],
      empty: [],
      failures: [],
      warnings: [],
    });
    const enqueued: Signal[] = [];
    const watch = new SuspectWatch({ source: { read: async (time) => readAt(time) }, enqueue: async (signals) => void enqueued.push(...signals) });
    for (let minute = 0; minute < 60; minute += 1) await watch.run([job('new', JOB_NODES)], start + minute * 60_000);
    expect(enqueued).toEqual([]);
  });
});
