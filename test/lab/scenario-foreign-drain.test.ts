import { describe, expect, it } from 'vitest';
import { FOREIGN_DRAIN_LAB, runForeignDrain } from '../../tryit/lab/scenario-foreign-drain.js';
import { expectRecovered, protectedLabForTest } from './protected-lab.js';

/**
 * Others' drains on the lab, as root: an administrator drains node-1 of the training job by hand
 * ("admin: fan replacement"), then a fatal Xid 48 hits it → node-1's agent resets the GPU (a
 * simulated nvidia-smi), the job is not relaunched on the drained node but on a standby in its
 * place (real sbatch), and node-1 stays drained with the administrator's reason first. Then a
 * node outside the job, drained by another administrator, has a reset that fails (the simulated
 * GPU does not come back): steadfast's drain reason is appended after theirs.
 */
describe("lab scenario: others' drains are kept", () => {
  const lab = protectedLabForTest(219, FOREIGN_DRAIN_LAB);

  it("resets the GPU, moves the job off the administrator's drained node, keeps their reason first and appends its own after a failed reset", async () => {
    const report = await runForeignDrain(lab());
    expectRecovered(report, 2);
    expect(report.timeline.map((step) => step.afterMs)).not.toContain(null);
    const nodes = (await lab().jobRecord()).nodes;
    expect(nodes).not.toContain('node-1');
    expect(nodes).toHaveLength(2);
    expect((await lab().sinfo('node-1')).reason.startsWith('admin: fan replacement')).toBe(true);
  }, 420_000);
});
