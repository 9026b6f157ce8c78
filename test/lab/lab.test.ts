import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { labCommand } from '../../tryit/cli/lab.js';
import { repoRoot } from '../../core/paths.js';
import { labProcesses } from '../../tryit/lab/daemons.js';
import { labDown, type LabStatus } from '../../tryit/lab/index.js';
import { labLayout } from '../../tryit/lab/layout.js';
import { nodeCommand } from '../../tryit/lab/slurm.js';
import { listLinks, listNetns } from '../../tryit/lab/network.js';
import { ProcessGroup, freePort, httpOk, waitFor } from '../../tryit/processes.js';
import { runCli } from '../support/cli.js';
import { until } from '../support/until.js';

/**
 * The lab end to end, as root: `steadfast lab up` (2 nodes and a standby, each a network
 * namespace with a real slurmd), the PyTorch example submitted with real sbatch onto the two
 * nodes, its iterations seen in the job's log and in the series a real agent got from the ranks'
 * pushes, a stack dump taken with SIGUSR1, scancel, a rank started by hand without rank variables
 * found by the GPU a stand-in nvidia-smi lists it on and traced, `steadfast lab down`, and
 * nothing left.
 */

const run = promisify(execFile);
const JOB = 'lab-e2e';

beforeAll(() => {
  // Namespaces, veths, a bridge and slurmd need root, as on the machines steadfast's CI runs on.
  if (process.getuid?.() !== 0) throw new Error('the lab tests need root (network namespaces, veths, slurmd): run npm test as root');
});

describe('steadfast lab: a real Slurm cluster in network namespaces', () => {
  const group = new ProcessGroup();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-lab-test-'));
  const dir = join(root, 'lab');
  // Names and a subnet of its own, so the test never meets a lab someone runs by hand.
  const prefix = `sft${randomBytes(2).toString('hex')}`;
  const subnet = `10.209.${randomBytes(1)[0] ?? 0}`;
  const lab = ['--dir', dir, '--prefix', prefix];
  const env = { SLURM_CONF: join(dir, 'slurm.conf') };
  let agentUrl = '';
  // The agent's POST endpoints are closed by default: the ranks present its web token.
  const webTokenFile = join(root, 'agent-web-token');
  let jobId = '';

  const jobLog = (): string => {
    const file = join(dir, 'jobs', `${JOB}-${jobId}.out`);
    return existsSync(file) ? readFileSync(file, 'utf8') : '';
  };
  const lastIteration = (log: string, rank: number): number =>
    Math.max(0, ...[...log.matchAll(new RegExp(`\\[rank ${rank}\\] iteration (\\d+) `, 'g'))].map((match) => Number(match[1])));

  /** Real sbatch of the example from the repository root; its job id. */
  const submit = async (checkpoints: string, stacks: string, args: readonly string[]): Promise<string> => {
    const { stdout } = await run(
      'sbatch',
      [
        '--parsable',
        `--job-name=${JOB}`,
        `--output=${join(dir, 'jobs', '%x-%j.out')}`,
        'examples/pytorch/train.sbatch',
        '--checkpoint-every',
        '5',
        '--step-sleep',
        '0.02',
        ...args,
      ],
      {
        cwd: repoRoot(),
        env: {
          ...process.env,
          ...env,
          STEADFAST_AGENT_URL: agentUrl,
          STEADFAST_AGENT_TOKEN_FILE: webTokenFile,
          STEADFAST_CHECKPOINT_DIR: checkpoints,
          STEADFAST_STACK_DIR: stacks,
        },
      },
    );
    const id = stdout.trim().split(';')[0] ?? '';
    expect(id).toMatch(/^\d+$/);
    return id;
  };
  // No accounting storage in the lab: scontrol remembers finished jobs for MinJobAge (300 s).
  const jobState = async (id: string): Promise<string> => (await run('scontrol', ['show', 'job', id], { env: { ...process.env, ...env } })).stdout;

  beforeAll(async () => {
    const up = await runCli(labCommand(), ['up', ...lab, '--nodes', '2', '--standbys', '1', '--subnet', subnet]);
    expect(up.stderr).toBe('');
    expect(up.exitCode).toBe(0);
    // An agent on the host, on the bridge's address, where the ranks in the namespaces reach it.
    const port = await freePort();
    agentUrl = `http://${subnet}.1:${port}`;
    const off = ['gpu', 'xid', 'rdma', 'nfs', 'process'].map((name) => `--no-collector.${name}`);
    writeFileSync(webTokenFile, `${randomBytes(24).toString('hex')}\n`, { mode: 0o600 });
    group.start(
      'agent',
      process.execPath,
      [
        '--import',
        'tsx',
        join(repoRoot(), 'cli', 'main.ts'),
        'agent',
        '--node',
        'lab-host',
        `--web.listen-address=${subnet}.1:${port}`,
        '--web.token-file',
        webTokenFile,
        ...off,
      ],
      join(root, 'agent.log'),
      {
        cwd: repoRoot(),
      },
    );
    await waitFor('the agent to answer /healthz', () => httpOk(`${agentUrl}/healthz`), 30_000, 200);
  }, 60_000);

  afterAll(async () => {
    // Whatever failed above, nothing of the lab may outlive the test.
    await labDown({ dir, prefix }).catch(() => undefined);
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  }, 60_000);

  it('shows two idle nodes and the standby held in the reservation', async () => {
    const status = await runCli(labCommand(), ['status', ...lab, '--json']);
    expect(status.exitCode).toBe(0);
    const parsed = JSON.parse(status.stdout) as LabStatus;
    expect(parsed.phase).toBe('up');
    expect(parsed.nodes.map((node) => `${node.name} ${node.state}`)).toEqual(['node-1 idle', 'node-2 idle', 'node-3 maint']);
    expect(parsed.standbyReservation).toEqual({ name: 'steadfast-standby', nodes: ['node-3'] });
    expect(parsed.processes.map((entry) => [entry.what, entry.running])).toEqual([
      ['slurmctld', true],
      ['slurmd node-1', true],
      ['slurmd node-2', true],
      ['slurmd node-3', true],
    ]);
    expect(parsed.namespaces.every((ns) => ns.exists && ns.processes === 1)).toBe(true);
  });

  it('runs the PyTorch example with sbatch on the two nodes: iterations in the log and the agent, a stack dump, scancel, resume', async () => {
    const checkpoints = join(root, 'checkpoints');
    const stacks = join(root, 'stacks');
    mkdirSync(stacks);
    jobId = await submit(checkpoints, stacks, []);

    // Alone this takes ~5 s; under a full test run on two cores, importing torch alone can take
    // several seconds per rank.
    const log = await until(
      'both ranks past iteration 10',
      async () => jobLog(),
      (text) => lastIteration(text, 0) >= 10 && lastIteration(text, 1) >= 10,
      60_000,
    );
    expect(log).toMatch(/\[rank 0\] pid \d+ on node-1, world 2, master node-1:/);
    expect(log).toMatch(/\[rank 1\] pid \d+ on node-2, world 2, master node-1:/);
    expect(log).toMatch(/\[rank 0\] resume: nothing/);
    expect(readdirSync(checkpoints)).toContain('step-00000010');

    // The ranks pushed their steps across the bridge to the agent, one series per rank.
    const metrics = await until(
      'the agent to have both ranks past iteration 10',
      async () => (await fetch(`${agentUrl}/metrics`)).text(),
      (text) =>
        [0, 1].every((rank) => Number(new RegExp(`steadfast_training_iteration\\{training_job="${JOB}",rank="${rank}"\\} (\\d+)`).exec(text)?.[1] ?? 0) >= 10),
      10_000,
    );
    expect(metrics).toMatch(new RegExp(`steadfast_training_iteration_seconds\\{training_job="${JOB}",rank="1"\\} 0\\.\\d+`));

    // A stack dump without py-spy: SIGUSR1 to rank 1, its faulthandler writes every thread (read
    // until the main thread's frame is whole: the file is written while it is read).
    const MAIN_FRAME = /File ".*examples\/pytorch\/train\.py", line \d+ in main/;
    const pid = Number(/\[rank 1\] pid (\d+)/.exec(log)?.[1]);
    process.kill(pid, 'SIGUSR1');
    const dump = await until(
      'the stack dump',
      async () =>
        readdirSync(stacks)
          .map((name) => readFileSync(join(stacks, name), 'utf8'))
          .join(''),
      (text) => MAIN_FRAME.test(text),
      5000,
    );
    expect(dump).toMatch(MAIN_FRAME);

    await run('scancel', [jobId], { env: { ...process.env, ...env } });
    await until(
      'the job to be cancelled',
      () => jobState(jobId),
      (text) => /JobState=CANCELLED/.test(text),
      20_000,
    );

    // Submitted again, it resumes from the newest step both ranks saved, runs 3 more iterations,
    // and the job's state is the training's (train.sbatch exits with srun's status).
    const saved = Math.max(
      ...readdirSync(checkpoints)
        .filter((name) => readdirSync(join(checkpoints, name)).length === 2)
        .map((name) => Number(name.slice(5))),
    );
    jobId = await submit(checkpoints, stacks, ['--iterations', String(saved + 3)]);
    const finished = await until(
      'the resumed job to complete',
      () => jobState(jobId),
      (text) => /JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT)/.test(text),
      60_000,
    );
    expect(finished).toMatch(/JobState=COMPLETED .*\n(.*\n)*.*ExitCode=0:0/);
    expect(jobLog()).toContain(`[rank 0] resume: newest complete step on disk → step ${saved}`);
    expect(jobLog()).toContain(`[rank 1] iteration ${saved + 1} `);
    expect(jobLog()).toContain(`[rank 1] done after iteration ${saved + 3}`);
  }, 150_000);

  it('finds a PyTorch rank started by hand with no rank variables by the GPU nvidia-smi lists it on, traces it and shows its GPU', async () => {
    // `python3 train.py` on node-1, as someone would start it there: no RANK, LOCAL_RANK or
    // SLURM_PROCID, no launcher; a world of one.
    const layout = labLayout({ dir, nodes: 2, standbys: 1, prefix, subnet });
    const node = layout.nodes[0];
    if (node === undefined) throw new Error('the lab has no node-1');
    const stacks = join(root, 'plain-stacks');
    mkdirSync(stacks);
    const rankLog = join(root, 'plain-rank.log');
    const train = [
      '/usr/bin/python3',
      'examples/pytorch/train.py',
      '--job',
      'plain',
      '--iterations',
      '1000000',
      '--checkpoint-every',
      '1000000',
      '--checkpoint-dir',
      join(root, 'plain-checkpoints'),
      '--step-sleep',
      '0.05',
    ];
    const { command, args } = nodeCommand(layout, node, train);
    const rank = group.start('plain-rank', command, args, rankLog, {
      cwd: repoRoot(),
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: root, PYTHONUNBUFFERED: '1', STEADFAST_STACK_DIR: stacks },
    });
    // nsenter, unshare and sh each exec the next: the pid is the rank's.
    const pid = rank.pid ?? 0;
    await until(
      'the hand-started rank to train',
      async () => (existsSync(rankLog) ? readFileSync(rankLog, 'utf8') : ''),
      (text) => /\[rank 0\] iteration \d+ /.test(text),
      90_000,
    );
    expect(
      readFileSync(`/proc/${pid}/environ`, 'utf8')
        .split('\0')
        .filter((entry) => /^(RANK|LOCAL_RANK|SLURM_PROCID)=/.test(entry)),
    ).toEqual([]);

    // A stand-in nvidia-smi: a real capture (a Tesla T4 with one Python compute process) in which
    // that process is the rank.
    const xml = join(root, 'nvidia-smi.xml');
    writeFileSync(
      xml,
      readFileSync(join(repoRoot(), 'test', 'fixtures', 'realworld', 'nvidia-smi-xml', 'telegraf_tesla-t4_515.105.01.xml'), 'utf8').replace(
        '<pid>5762</pid>',
        `<pid>${pid}</pid>`,
      ),
    );
    const smi = join(root, 'nvidia-smi');
    writeFileSync(smi, `#!/bin/sh\n[ "$1" = "-q" ] && [ "$2" = "-x" ] && exec cat ${xml}\nexit 2\n`, { mode: 0o755 });
    const port = await freePort();
    const url = `http://127.0.0.1:${port}`;
    const off = ['xid', 'rdma', 'nfs', 'nvlink', 'training'].map((name) => `--no-collector.${name}`);
    group.start(
      'gpu-agent',
      process.execPath,
      [
        '--import',
        'tsx',
        join(repoRoot(), 'cli', 'main.ts'),
        'agent',
        '--node',
        'node-1',
        `--web.listen-address=127.0.0.1:${port}`,
        '--web.token-file',
        webTokenFile,
        '--nvidia-smi.path',
        smi,
        '--process.stack-tool',
        'faulthandler',
        ...off,
      ],
      join(root, 'gpu-agent.log'),
      { cwd: repoRoot() },
    );
    const metrics = await until(
      'the agent to show the rank with its GPU',
      async () => ((await httpOk(`${url}/healthz`).catch(() => false)) ? (await fetch(`${url}/metrics`)).text() : ''),
      (text) => text.includes(`steadfast_training_process_info{pid="${pid}",role="rank"`),
      60_000,
    );
    expect(metrics).toMatch(new RegExp(`^steadfast_training_process_info\\{pid="${pid}",role="rank",comm="[^"]+",gpu="0"\\} 1$`, 'm'));
    expect(metrics).toContain(
      `steadfast_gpu_process_info{gpu="0",pci_bus_id="0000:00:1e",UUID="GPU-d37e67a5-91dd-3774-a5cb-99096249601a",pid="${pid}",type="C",name="python"} 1`,
    );

    const response = await fetch(`${url}/api/v1/trace`, {
      method: 'POST',
      headers: { authorization: `Bearer ${readFileSync(webTokenFile, 'utf8').trim()}`, 'content-type': 'application/json' },
      body: JSON.stringify({ timeoutSeconds: 15 }),
    });
    expect(response.status).toBe(200);
    const answer = (await response.json()) as {
      tool: string;
      dumps: Array<{ pid: number; role: string; ok: boolean; dump?: string; error?: string; gpus?: unknown }>;
    };
    expect(answer.tool).toBe('faulthandler');
    const dump = answer.dumps.find((entry) => entry.pid === pid);
    expect(dump).toMatchObject({ role: 'rank', ok: true, gpus: [{ gpu: '0', pciBusId: '0000:00:1e', uuid: 'GPU-d37e67a5-91dd-3774-a5cb-99096249601a' }] });
    expect(dump?.dump).toMatch(/File ".*examples\/pytorch\/train\.py", line \d+ in main/);
    await group.stop('gpu-agent');
    await group.stop('plain-rank');
  }, 180_000);

  it('lab down leaves no process, namespace, veth or bridge behind, and a second down is harmless', async () => {
    const down = await runCli(labCommand(), ['down', ...lab]);
    expect(down.stderr).toBe('');
    expect(down.exitCode).toBe(0);
    expect((await listNetns()).filter((name) => name.startsWith(`${prefix}-`))).toEqual([]);
    expect((await listLinks()).filter((name) => name.startsWith(`${prefix}-`))).toEqual([]);
    // No slurmctld, slurmd, slurmstepd or rank: nothing running with the lab's conf or SLURM_CONF.
    expect(labProcesses(env.SLURM_CONF)).toEqual([]);
    expect(existsSync(join(dir, 'lab.json'))).toBe(false);
    const again = await runCli(labCommand(), ['down', ...lab]);
    expect(again.exitCode).toBe(0);
    const status = await runCli(labCommand(), ['status', ...lab]);
    expect(status.stdout).toBe(`no lab in ${dir}\n`);
  }, 60_000);
});

describe('steadfast lab down after an up that was killed half-way', () => {
  const group = new ProcessGroup();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-lab-killed-'));
  const dir = join(root, 'lab');
  const prefix = `sfk${randomBytes(2).toString('hex')}`;
  const subnet = `10.208.${randomBytes(1)[0] ?? 0}`;

  afterAll(async () => {
    await labDown({ dir, prefix }).catch(() => undefined);
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  }, 60_000);

  it('finds what the dead up made from its state file and removes all of it', async () => {
    group.start(
      'up',
      process.execPath,
      [
        '--import',
        'tsx',
        join(repoRoot(), 'cli', 'main.ts'),
        'lab',
        'up',
        '--dir',
        dir,
        '--prefix',
        prefix,
        '--subnet',
        subnet,
        '--nodes',
        '2',
        '--standbys',
        '0',
      ],
      join(root, 'up.log'),
      {
        cwd: repoRoot(),
      },
    );
    // SIGKILL once slurmctld and a slurmd run: no handler of the dying process can clean up.
    const stateFile = join(dir, 'lab.json');
    await waitFor(
      'up to start the slurmds',
      async () => existsSync(stateFile) && Object.keys((JSON.parse(readFileSync(stateFile, 'utf8')) as { slurmd: object }).slurmd).length > 0,
      30_000,
      20,
    );
    await group.stop('up', 0, 'SIGKILL');
    const conf = join(dir, 'slurm.conf');
    expect(labProcesses(conf).length).toBeGreaterThan(0);
    expect((await listNetns()).filter((name) => name.startsWith(`${prefix}-`))).toHaveLength(2);

    const down = await runCli(labCommand(), ['down', '--dir', dir]);
    expect(down.stderr).toBe('');
    expect(down.exitCode).toBe(0);
    expect(labProcesses(conf)).toEqual([]);
    expect((await listNetns()).filter((name) => name.startsWith(`${prefix}-`))).toEqual([]);
    expect((await listLinks()).filter((name) => name.startsWith(`${prefix}-`))).toEqual([]);
  }, 60_000);
});
