import { describe, expect, it } from 'vitest';
import { runCrash } from '../../tryit/lab/scenarios.js';
import { expectRecovered, protectedLabForTest } from './protected-lab.js';

/**
 * Scenario 2 end to end, as root: rank 1 raises a CUDA-style RuntimeError → srun's failure in the
 * job log → the batch host's agent reports the worker failure → no culprit: the controller runs
 * the stop-time checks on every node's agent (a torch computation, the neighbours reachable) →
 * they pass → reattempt in place with sbatch → training goes on from the newest checkpoint.
 */
describe('lab scenario: a crash without a culprit', () => {
  const lab = protectedLabForTest(212);

  it('diagnoses every node, finds nothing and reattempts in place from the newest checkpoint', async () => {
    const report = await runCrash(lab());
    expectRecovered(report, 2);
    expect(report.timeline.map((step) => step.afterMs)).not.toContain(null);
    expect(await lab().jobRecord()).toMatchObject({ state: 'running', version: 'v1', nodes: ['node-1', 'node-2'] });
    expect((await lab().slurmJob(report.slurmJobIds[0] ?? '')).state).toBe('FAILED');
  }, 360_000);
});
