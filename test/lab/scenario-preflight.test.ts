import { describe, expect, it } from 'vitest';
import { PREFLIGHT_LAB, runPreflight } from '../../tryit/lab/scenario-preflight.js';
import { expectRecovered, protectedLabForTest } from './protected-lab.js';

/**
 * The preflight across nodes on the lab, as root: four compute nodes and a standby, node-3's link
 * slowed to 16 Mbit/s with tc tbf from lab up. The job's first run starts with its
 * preflight (gloo on CPU across the nodes' namespaces): the all-reduce is slow, the pairwise
 * bisection names node-3, a healthy node reports it, the run exits 10; the controller drains
 * node-3 with a preflight reason and relaunches the job with real sbatch on node-1, node-2, node-4
 * and the standby, whose preflight passes and which trains.
 */
describe('lab scenario: a bad link found by the preflight before the first iteration', () => {
  const lab = protectedLabForTest(216, PREFLIGHT_LAB);

  it('names the slowed node, drains it and starts the job on the other nodes and a standby', async () => {
    const report = await runPreflight(lab());
    expectRecovered(report, 2);
    expect(report.timeline.map((step) => step.afterMs)).not.toContain(null);
    const nodes = (await lab().jobRecord()).nodes;
    expect(nodes).not.toContain('node-3');
    expect(nodes).toHaveLength(4);
    expect((await lab().sinfo('node-3')).reason).toMatch(/preflight/);
  }, 360_000);
});
