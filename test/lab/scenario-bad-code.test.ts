import { describe, expect, it } from 'vitest';
import { runBadCode } from '../../tryit/lab/scenarios.js';
import { expectRecovered, protectedLabForTest } from './protected-lab.js';

/**
 * Scenario 5 end to end, as root: an urgent code update (POST /api/v1/jobs/:id/code-updates) to a
 * version whose ranks raise a TypeError at their first step → the ladder stops the job and
 * relaunches it on the new version through `{version}` → srun's failure in the batch host's log,
 * read by that node's agent → user code → rollback to v1 → training goes on from the newest
 * checkpoint of the run before the update.
 */
describe('lab scenario: bad code from an urgent update', () => {
  const lab = protectedLabForTest(211);

  it('rolls back to the last good version and training goes on from the newest checkpoint', async () => {
    const report = await runBadCode(lab());
    expectRecovered(report, 3);
    expect(report.timeline.map((step) => step.afterMs)).not.toContain(null);
    expect(await lab().jobRecord()).toMatchObject({ state: 'running', version: 'v1', nodes: ['node-1', 'node-2'] });
    const bad = await lab().slurmJob(report.slurmJobIds[1] ?? '');
    expect(bad.state).toBe('FAILED');
  }, 360_000);
});
