import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SimEnvironment } from '../../tryit/environment.js';
import { runRecoveryScenario } from '../../tryit/recovery-scenario.js';
import { slurmNode } from '../../tryit/parts.js';

/** The recovery ladder on the real parts: Slurm reservations and drains, Alertmanager, Redis. */
describe('the recovery ladder end to end', () => {
  let env: SimEnvironment;

  beforeAll(async () => {
    env = await SimEnvironment.start({ nodes: 7, maxDrainsPerWindow: 8, maxJobEvictionPercent: 75 });
  }, 90_000);
  afterAll(async () => {
    await env?.stop();
  });

  it('evicts what stop-time diagnostics find, evicts onto warm standbys, tolerates one NIC flap but not two, and rolls back a bad code version', async () => {
    const steps = await runRecoveryScenario(env);
    expect(steps.filter((step) => !step.ok).map((step) => `${step.title}\n${step.lines.join('\n')}`)).toEqual([]);
    expect((await slurmNode(env.slurm, 'node-2')).reason).toMatch(/^steadfast: machine fault: fatal Xid 79/);
    expect((await slurmNode(env.slurm, 'node-3')).state).toMatch(/^drain/);
    expect((await slurmNode(env.slurm, 'node-4')).state).toMatch(/^drain/);
    const diagnosis = (await env.audit()).find((entry) => entry.data.verb === 'analysis_diagnostics');
    expect(diagnosis?.summary).toMatch(/^llama-demo: diagnostics: evict node-4; node-4 failed gpu-diag: .*GPU 5 failed the memory test/);
    expect(await env.controller.backend.standbys()).toEqual([]);
    const job = await env.controller.jobs.get('llama-demo');
    expect(job.spec.nodes).toEqual(['node-1', 'node-5', 'node-6', 'node-7']);
    expect(job.spec.codeVersion).toBe('v1');
  }, 120_000);
});
