import { describe, expect, it } from 'vitest';
import type { JobSpec } from '../../../core/job.js';
import type { Signal } from '../../../core/signal.js';
import { signalSchema } from '../../../core/signal.js';
import { classifySignal } from '../../../controller/policy/fault-class.js';
import { SuspectWatch } from '../../../analyzers/workers/suspect-watch.js';
import type { FeatureReading } from '../../../analyzers/multisignal-source.js';

const JOB_NODES = ['g00', 'g01', 'g02', 'g03', 'g04', 'g05', 'g06', 'g07'];
const job = (name: string, nodes: string[]): JobSpec => ({ name, nodes, ranksPerNode: 8, launcher: 'accept', codeVersion: 'v1' }) as JobSpec;

/** Healthy nodes with small differences; `hot` runs hot, slow and retransmitting. */
function reading(hot: string | undefined, idle: string[] = []): FeatureReading {
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
  if (hot) Object.assign(matrix[hot] as object, { gpu_temperature_celsius: 92, gpu_power_watts: 380, training_iteration_seconds: 1.4, rdma_transport_retries_per_second: 40 });
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

  it('hands a suspect on a job\'s node to the ladder as a performance anomaly (aggregation, not eviction)', () => {
    const signal = { id: 's-1', kind: 'suspect_node', node: 'g05', job: 'big', severity: 'warning', time: new Date(0).toISOString(), receivedAt: new Date(0).toISOString(), fingerprint: 'suspect_node/g05/-/0', source: 'analyzer', evidence: { score: 12.5 } } as const;
    expect(classifySignal(signal)).toMatchObject({ verdict: 'fault', faultClass: 'performance', node: 'g05' });
  });
});
