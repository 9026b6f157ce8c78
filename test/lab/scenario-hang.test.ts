import { describe, expect, it } from 'vitest';
import { OWN_LAB, runHang } from '../../tryit/lab/scenarios.js';
import { expectRecovered, protectedLabForTest } from './protected-lab.js';

/**
 * Scenario 3 end to end, as root, on 3 compute nodes (with 2 ranks the odd stack is a tie) and a
 * stalled-progress bound of 10 s: rank 1 sleeps forever before its next all-reduce → the other
 * ranks block in it → SteadfastTrainingStalled through Alertmanager → a performance fault → stack
 * aggregation over every rank's faulthandler dumps → node-2 over-evicted → a standby in its
 * place, relaunched with sbatch, resumed from the newest checkpoint.
 */
describe('lab scenario: a hang', () => {
  const lab = protectedLabForTest(213, OWN_LAB.hang);

  it('finds the hung rank by its stack, over-evicts its node and resumes on a standby', async () => {
    const report = await runHang(lab());
    expectRecovered(report, 2);
    expect(report.timeline.map((step) => step.afterMs)).not.toContain(null);
    expect(await lab().jobRecord()).toMatchObject({ state: 'running', nodes: ['node-1', 'node-4', 'node-3'] });
    expect((await lab().slurmJob(report.slurmJobIds[0] ?? '')).state).toMatch(/CANCELLED/);
  }, 360_000);
});
