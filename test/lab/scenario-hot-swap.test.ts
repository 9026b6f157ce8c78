import { describe, expect, it } from 'vitest';
import { HOT_SWAP_LAB, runHotSwap, runHotSwapSpareDies } from '../../tryit/lab/scenario-hot-swap.js';
import { expectRecovered, protectedLabForTest } from './protected-lab.js';

/**
 * The hot swap end to end, as root, on real slurmd nodes: the PyTorch example with in-memory
 * checkpoints every step on node-1 and node-2, idle spare processes on node-3 and node-4 of the
 * same Slurm allocation, the ranks' rendezvous store on the bridge. A fatal Xid on node-1, and its
 * rank killed → the controller opens a recovery epoch with node-3 in node-1's place → the spare
 * restores rank 0's shard from its replica, rank 1 from its own memory, and the one Slurm job
 * trains on with an unfaulted run's losses. Then the second case: a fault on node-2 whose spare
 * is killed as it is called → the swap cannot finish → stop, evict, relaunch from the disk checkpoint.
 */
describe('lab scenario: hot swap onto a spare inside the running job', () => {
  const lab = protectedLabForTest(211, HOT_SWAP_LAB);

  it('swaps the spare in for the failed node: one Slurm job, no rank restarted, at most one step again, the same losses', async () => {
    const report = await runHotSwap(lab());
    expectRecovered(report, 1);
    expect(report.ranksRestarted).toBe(0);
    expect(report.reexecutedIterations).toBeLessThanOrEqual(1);
    expect(report.lossMatches).toBe(true);
    const job = await lab().jobRecord();
    expect(job.nodes).toEqual(['node-3', 'node-2']);
    expect((await lab().sinfo('node-1')).state).toMatch(/^drain/);
  }, 300_000);

  it('falls back to stop and relaunch when the spare dies during the swap', async () => {
    const report = await runHotSwapSpareDies(lab());
    expectRecovered(report, 2);
    const job = await lab().jobRecord();
    expect(job.nodes).not.toContain('node-2');
  }, 360_000);
});
