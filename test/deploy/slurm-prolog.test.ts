import { execFile } from 'node:child_process';
import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildFixtureNode, type FixtureNode } from '../../tryit/fixture-node.js';

const REPO = join(import.meta.dirname, '..', '..');
const PROLOG = join(REPO, 'deploy', 'slurm', 'prolog.sh');
const FATAL_XID = "[ 3001.000000] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n";
const run = promisify(execFile);

/** The shipped Slurm prolog, run as slurmd runs it (no arguments, SLURMD_NODENAME set), on fixture nodes. */
describe('deploy/slurm/prolog.sh', () => {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-prolog-'));
  let node: FixtureNode;
  let bin: string;

  beforeAll(() => {
    node = buildFixtureNode(join(root, 'node'));
    bin = join(root, 'steadfast');
    writeFileSync(bin, `#!/bin/sh\nexec ${process.execPath} --import tsx ${join(REPO, 'cli', 'main.ts')} "$@"\n`, { mode: 0o755 });
  });
  afterAll(() => rmSync(root, { recursive: true, force: true }));

  const prolog = async () => {
    const env = {
      ...process.env,
      SLURMD_NODENAME: 'gpu-p1',
      STEADFAST_BIN: bin,
      STEADFAST_PREFLIGHT_ARGS: `--expect-gpus 8 --path.sysfs ${node.sysfs} --path.procfs ${node.procfs} --path.kmsg ${node.kmsg} --nvidia-smi.xml ${node.nvidiaSmiXml}`,
    };
    // The script's own state file is under /var/lib; point it into the test's folder.
    try {
      const { stdout } = await run('sh', [PROLOG, '--xid.state-file', join(root, 'state.json')], { env, cwd: REPO });
      return { exitCode: 0, stdout };
    } catch (error) {
      const failed = error as { code: number; stdout: string };
      return { exitCode: failed.code, stdout: failed.stdout };
    }
  };

  it('exits 0 on a healthy node', async () => {
    expect(await prolog()).toEqual({ exitCode: 0, stdout: 'gpu-p1: healthy\n' });
  });

  it('exits non-zero and prints the reason on a node with a fatal Xid in its kernel log', async () => {
    appendFileSync(node.kmsg, FATAL_XID);
    expect(await prolog()).toEqual({ exitCode: 1, stdout: 'gpu-p1: steadfast check: fatal Xid 79 on GPU 0000:18:00\n' });
  });
});
