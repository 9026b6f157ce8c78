import { describe, expect, it } from 'vitest';
import { runMachineFault } from '../../tryit/lab/scenarios.js';
import { expectRecovered, protectedLabForTest } from './protected-lab.js';

/**
 * Scenario 1 end to end, as root: a fatal Xid 79 appended to node-1's kernel log while the PyTorch
 * example trains on node-1 and node-2 → node-1's agent reports it on the fast path → the ladder
 * stops the job (scancel), drains node-1, activates a warm standby from the Slurm reservation,
 * relaunches with real sbatch on the new node list → the run resumes from the newest complete
 * checkpoint, its first step is the next one, with the loss the interrupted run had there.
 */
describe('lab scenario: a machine fault (fatal Xid) under a training job', () => {
  const lab = protectedLabForTest(210);

  it('drains the node, puts a standby in its place, relaunches with sbatch and resumes from the newest checkpoint', async () => {
    const report = await runMachineFault(lab());
    expectRecovered(report, 2);
    expect(report.resumedFromStep).toBeGreaterThanOrEqual(20);
    expect((report.resumedFromStep ?? 1) % 10).toBe(0);
    expect(report.lostIterations).toBeLessThanOrEqual(20);
    // Every step of the recovery happened; the alert that comes the Prometheus way is only shown.
    expect(report.timeline.filter((step) => !step.label.startsWith('the Prometheus path')).map((step) => step.afterMs)).not.toContain(null);
    const job = await lab().jobRecord();
    expect(job.nodes).not.toContain('node-1');
    expect(job.nodes.some((node) => node === 'node-3' || node === 'node-4')).toBe(true);
    expect((await lab().sinfo('node-1')).state).toMatch(/^drain/);
  }, 360_000);
});
