import { describe, expect, it } from 'vitest';
import { FAIL_SLOW_LAB, runFailSlow } from '../../tryit/lab/scenario-fail-slow.js';
import { expectRecovered, protectedLabForTest } from './protected-lab.js';

/**
 * The fail-slow scenario end to end, as root, on its own lab (the job registered with 8
 * micro-batches, fail-slow checks every second, mitigation costs of seconds): node-2 computes
 * slower → rank 1's pushed compute times → Prometheus → the controller's online fail-slow
 * analyzer → S2, a rebalanced plan the real train.py follows, and the iteration time comes back
 * down; then node-2 much slower → S3 → S4 → node-2 evicted onto the standby, resumed from the
 * newest checkpoint.
 */
describe('lab scenario: fail-slow', () => {
  const lab = protectedLabForTest(214, FAIL_SLOW_LAB);

  it('rebalances micro-batches away from a slow machine, then evicts it onto a standby when the slow-down outgrows S2', async () => {
    const report = await runFailSlow(lab());
    process.stdout.write(
      `iteration seconds: ${JSON.stringify(report.iterationSeconds)}; slow rank's share on the plan ${report.planned.slowRank}/${report.planned.microbatches}\n`,
    );
    expectRecovered(report, 2);
    expect(report.timeline.map((step) => step.afterMs)).not.toContain(null);
    // The plan gave the slow rank fewer than its even 4 of 8.
    expect(report.planned.slowRank).toBeLessThan(4);
    const { before, slowed, rebalanced } = report.iterationSeconds;
    expect([before, slowed, rebalanced]).not.toContain(null);
    // Slowed iterations were slower than healthy ones, and the plan made them faster again.
    expect(slowed as number).toBeGreaterThan(before as number);
    expect(rebalanced as number).toBeLessThan(slowed as number);
    expect(await lab().jobRecord()).toMatchObject({ state: 'running', nodes: ['node-1', 'node-3'] });
    expect((await lab().slurmJob(report.slurmJobIds[0] ?? '')).state).toMatch(/CANCELLED/);
    // The relaunched run, without the slow machine, trains on the even split again.
    const served = await lab().api('/api/v1/jobs/lab-train/microbatches');
    expect(served.body).toMatchObject({ strategy: 'even', assignment: [4, 4] });
  }, 540_000);
});
