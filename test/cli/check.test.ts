import { appendFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkCommand } from '../../cli/check.js';
import { buildFixtureNode, type FixtureNode } from '../../tryit/fixture-node.js';
import { slurmNode, startSlurm, type SlurmPart } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';
import { StandInNvml } from '../../tryit/nvml/stand-in.js';
import { runCli } from '../support/cli.js';

const FATAL_XID = "[ 2001.000000] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n";
const NODE = 'gpu-c1';

/**
 * `steadfast check` as Slurm's HealthCheckProgram on a fixture node (8 GPUs from a captured
 * nvidia-smi, a kernel log), draining through a real slurmctld.
 */
describe('steadfast check on a fixture node', () => {
  const group = new ProcessGroup();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-check-'));
  let node: FixtureNode;
  let slurm: SlurmPart;
  const state = join(root, 'check-xid-state.json');

  const check = (...extra: string[]) =>
    runCli(checkCommand(), [
      '--node',
      NODE,
      '--path.sysfs',
      node.sysfs,
      '--path.procfs',
      node.procfs,
      '--path.kmsg',
      node.kmsg,
      '--nvidia-smi.xml',
      node.nvidiaSmiXml,
      '--xid.state-file',
      state,
      ...extra,
    ]);

  beforeAll(async () => {
    node = buildFixtureNode(join(root, 'node'));
    slurm = await startSlurm(group, root, [NODE]);
  });
  afterAll(async () => {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  });

  it('exits 0 on a node with all its GPUs and no fatal Xid', async () => {
    const result = await check('--expect-gpus', '8');
    expect(result).toMatchObject({ exitCode: 0, stdout: `${NODE}: healthy\n` });
  });

  it('exits 1 naming the GPUs missing when fewer are listed than the node has', async () => {
    const result = await check('--expect-gpus', '9');
    expect(result.exitCode).toBe(1);
    expect(result.stdout).toBe(`${NODE}: steadfast check: GPU lost: 8 of 9 GPUs listed\n`);
  });

  it('exits 1 when the GPUs cannot be read at all', async () => {
    const result = await runCli(checkCommand(), [
      '--node',
      NODE,
      '--path.procfs',
      node.procfs,
      '--path.kmsg',
      node.kmsg,
      '--nvidia-smi.path',
      join(root, 'no-nvidia-smi'),
      '--xid.state-file',
      state,
      '--expect-gpus',
      '8',
    ]);
    expect(result.exitCode).toBe(1);
    expect(result.stdout).toContain('steadfast check: GPUs unreadable:');
  });

  it('drains the node with the fatal Xid as the reason, once: a resumed node is not drained again for the same Xid', async () => {
    appendFileSync(node.kmsg, FATAL_XID);
    const result = await check('--drain', '--slurm-conf', slurm.conf);
    expect(result.stderr).toBe('');
    expect(result.exitCode).toBe(1);
    expect(result.stdout).toBe(`${NODE}: steadfast check: fatal Xid 79 on GPU 0000:18:00 (drained)\n`);
    expect(await slurmNode(slurm, NODE)).toEqual({ state: 'drained~', reason: 'steadfast check: fatal Xid 79 on GPU 0000:18:00' });

    const again = await check('--drain', '--slurm-conf', slurm.conf);
    expect(again).toMatchObject({ exitCode: 0, stdout: `${NODE}: healthy\n` });
  });

  it('keeps a fatal Xid news for the next check when the drain fails', async () => {
    appendFileSync(node.kmsg, FATAL_XID.replace('2001.000000', '2002.000000').replace(': 79,', ': 48,'));
    const failed = await check('--drain', '--slurm-conf', slurm.conf, '--scontrol', join(root, 'no-scontrol'));
    expect(failed.exitCode).toBe(1);
    expect(failed.stderr).toContain('no-scontrol');
    const retried = await check();
    expect(retried.exitCode).toBe(1);
    expect(retried.stdout).toContain('fatal Xid 48 on GPU 0000:18:00');
  });

  it('reads the GPUs through NVML with --gpu.source nvml, and names a GPU NVML cannot reach', async () => {
    const gpus = Array.from(
      { length: 2 },
      (_, index) => `${index} pci 00000000:${(0x18 + index).toString(16)}:00.0\n${index} minor ${index}\n${index} temp 40\n`,
    ).join('');
    const nvml = await StandInNvml.create(join(root, 'nvml'), `driver 580.159.04\ngpus 2\n${gpus}`);
    const args = [
      '--node',
      NODE,
      '--path.procfs',
      node.procfs,
      '--path.kmsg',
      node.kmsg,
      '--xid.state-file',
      state,
      '--gpu.source',
      'nvml',
      '--gpu.nvml-library',
      nvml.library,
    ];
    expect(await runCli(checkCommand(), [...args, '--expect-gpus', '2'])).toMatchObject({ exitCode: 0, stdout: `${NODE}: healthy\n` });
    await nvml.setState(`driver 580.159.04\ngpus 2\n${gpus}1 fail.handle 15\n`);
    const lost = await runCli(checkCommand(), [...args, '--expect-gpus', '2']);
    expect(lost.exitCode).toBe(1);
    expect(lost.stdout).toBe(`${NODE}: steadfast check: GPU lost: 1 of 2 GPUs listed\n`);
    const wrong = await runCli(checkCommand(), [...args, '--gpu.source', 'dcgm']);
    expect(wrong.exitCode).toBe(2);
    expect(wrong.stderr).toContain('--gpu.source: must be one of');
  });

  it('refuses a node name that could become an option or a second argument to scontrol, naming the flag', async () => {
    for (const name of ['-all', 'a;reboot']) {
      const result = await runCli(checkCommand(), [`--node=${name}`, '--drain']);
      expect(result.exitCode).toBe(2);
      expect(result.stderr).toContain('invalid --node');
    }
  });
});
