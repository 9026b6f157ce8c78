import { describe, expect, it } from 'vitest';
import { GPU_RESET_LAB, runGpuReset } from '../../tryit/lab/scenario-gpu-reset.js';
import { expectRecovered, protectedLabForTest } from './protected-lab.js';

/**
 * The GPU reset rung on the lab, as root: a fatal Xid 48 (its cure a GPU reset) on node-1 while the
 * PyTorch example trains on node-1 and node-2, GPU resets on → the ladder stops the job (scancel),
 * node-1's agent resets the GPU (its gpu-reset endpoint on a simulated nvidia-smi: the lab has no
 * GPUs), the job relaunches with real sbatch on the same two nodes and resumes from the newest
 * checkpoint; nothing is drained and no standby is used.
 */
describe('lab scenario: a GPU reset in place under a training job', () => {
  const lab = protectedLabForTest(215, GPU_RESET_LAB);

  it('resets the GPU through the node agent, relaunches on the same nodes and resumes from the newest checkpoint', async () => {
    const report = await runGpuReset(lab());
    expectRecovered(report, 2);
    expect(report.resumedFromStep).toBeGreaterThanOrEqual(20);
    expect((report.resumedFromStep ?? 1) % 10).toBe(0);
    expect(report.timeline.map((step) => step.afterMs)).not.toContain(null);
    expect((await lab().jobRecord()).nodes).toEqual(['node-1', 'node-2']);
  }, 360_000);
});
