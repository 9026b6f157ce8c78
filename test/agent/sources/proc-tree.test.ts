import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  ProcessIdentityCache,
  classifyTrainingTree,
  isLauncher,
  parseRankEnvironment,
  parseResidentBytes,
  parseStatLine,
  readProcessTable,
  type ProcessEntry,
  type ProcessRole,
} from '../../../agent/sources/proc-tree.js';
import {
  CHECKPOINT_WRITER_PID,
  COMPILE_WORKER_PID,
  LAUNCHER_PID,
  RANK_PIDS,
  RANK_WITHOUT_ENVIRON,
  ZOMBIE_PID,
  statLine,
  writeTorchrunProcfs,
} from '../fake-procfs.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'steadfast-proc-'));
});
afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

function entry(pid: number, ppid: number, argv: string[], extra: Partial<ProcessEntry> = {}): ProcessEntry {
  return { pid, ppid, comm: 'python3', state: 'S', utimeTicks: 0, stimeTicks: 0, numThreads: 1, startTimeTicks: pid, argv, ...extra };
}

function roles(table: readonly ProcessEntry[], gpuPids?: ReadonlySet<number>): Record<number, [ProcessRole, number | undefined]> {
  return Object.fromEntries(classifyTrainingTree(table, gpuPids).processes.map((node) => [node.process.pid, [node.role, node.rank]]));
}

describe('parseStatLine', () => {
  it('reads comm up to the last parenthesis, so comms with spaces and parentheses keep the fields after them in place', () => {
    const stat = parseStatLine(
      '900 ((sd-pam) x) y) S 1 900 900 0 -1 4194560 0 0 0 0 15 25 0 0 20 0 1 0 555 0 0 18446744073709551615 0 0 0 0 0 0 0 4096 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0',
    );
    expect(stat).toEqual({ pid: 900, comm: '(sd-pam) x) y', state: 'S', ppid: 1, utimeTicks: 15, stimeTicks: 25, numThreads: 1, startTimeTicks: 555 });
  });

  it('rejects lines that are cut short or carry non-numbers where numbers belong', () => {
    expect(parseStatLine('')).toBeUndefined();
    expect(parseStatLine('12 (bash) S 1 12')).toBeUndefined();
    expect(parseStatLine('x (bash) S 1 12 12 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 5')).toBeUndefined();
    expect(parseStatLine('12 (bash) S one 12 12 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 5')).toBeUndefined();
  });

  it('never throws on arbitrary text', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 400 }), (text) => {
        parseStatLine(text);
      }),
      { numRuns: 1000 },
    );
  });

  it('gives back pid, comm, ppid and CPU ticks of any line the kernel could write, whatever the comm holds', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 4_194_304 }),
        fc.integer({ min: 0, max: 4_194_304 }),
        fc.string({ unit: 'binary', maxLength: 15 }),
        fc.nat(),
        fc.nat(),
        (pid, ppid, comm, utimeTicks, stimeTicks) => {
          const parsed = parseStatLine(statLine({ pid, ppid, comm, argv: [], utimeTicks, stimeTicks }));
          expect(parsed).toMatchObject({ pid, ppid, comm, utimeTicks, stimeTicks });
        },
      ),
      { numRuns: 500 },
    );
  });
});

describe('status and environ parsing', () => {
  it('turns VmRSS kB into bytes and reports nothing for a zombie without Vm lines', () => {
    expect(parseResidentBytes('Name:\tpython3\nVmRSS:\t  18874368 kB\nThreads:\t96\n')).toBe(18_874_368 * 1024);
    expect(parseResidentBytes('Name:\tpt_data_worker\nState:\tZ (zombie)\nThreads:\t1\n')).toBeUndefined();
  });

  it('reads RANK, LOCAL_RANK and SLURM_PROCID and ignores values that are not ranks', () => {
    expect(parseRankEnvironment('PATH=/bin\0RANK=12\0LOCAL_RANK=4\0SLURM_PROCID=12\0')).toEqual({ rank: 12, localRank: 4, slurmProcId: 12 });
    expect(parseRankEnvironment('RANK=\0LOCAL_RANK=-1\0SLURM_PROCID=x\0')).toEqual({ rank: undefined, localRank: undefined, slurmProcId: undefined });
  });

  it('reads where the rank writes its faulthandler dumps: STEADFAST_STACK_DIR, and TMPDIR, TEMP or TMP in that order, absolute paths only', () => {
    expect(parseRankEnvironment('RANK=0\0STEADFAST_STACK_DIR=/scratch/stacks\0TEMP=/var/tmp\0TMP=/tmp2\0')).toMatchObject({
      stackDirectory: '/scratch/stacks',
      tempDirectory: '/var/tmp',
    });
    expect(parseRankEnvironment('TMPDIR=\0TMP=/tmp2\0')).toMatchObject({ stackDirectory: undefined, tempDirectory: '/tmp2' });
    expect(parseRankEnvironment('STEADFAST_STACK_DIR=stacks\0TMPDIR=../tmp\0')).toMatchObject({ stackDirectory: undefined, tempDirectory: undefined });
  });
});

describe('launcher recognition', () => {
  it.each([
    [['/usr/bin/python3', '/usr/local/bin/torchrun', '--nproc-per-node=8', 'train.py']],
    [['torchrun', '--standalone', 'train.py']],
    [['/usr/bin/python3', '-u', '-m', 'torch.distributed.run', 'train.py']],
    [['python', '-X', 'faulthandler', '-m', 'torch.distributed.launch', '--nproc_per_node=8', 'train.py']],
    [['/usr/bin/python', '/usr/local/bin/deepspeed', '--num_gpus=8', 'train.py']],
    [['/usr/bin/python', '-u', '-m', 'deepspeed.launcher.launch', '--world_info=eyJsb2NhbGhvc3QiOiBbMF19', 'train.py']],
  ])('recognises %j as a launcher', (argv) => {
    expect(isLauncher(entry(10, 1, argv, { comm: 'pt_main_thread' }))).toBe(true);
  });

  it.each([
    [['/usr/bin/python3', '-u', 'train.py', '--launcher', 'torchrun']],
    [['/usr/bin/python3', '-c', 'import torch.distributed.run']],
    [['/bin/bash', 'run_torchrun.sh']],
  ])('does not take %j for a launcher', (argv) => {
    expect(isLauncher(entry(10, 1, argv))).toBe(false);
  });
});

describe('classifyTrainingTree', () => {
  it('classifies the torchrun node: launcher, 8 ranks with their global ranks, 16 workers, the checkpoint writer, and nothing else', async () => {
    writeTorchrunProcfs(dir);
    const tree = classifyTrainingTree(await readProcessTable(dir));
    const byRole = (role: ProcessRole): number[] =>
      tree.processes
        .filter((node) => node.role === role)
        .map((node) => node.process.pid)
        .sort((a, b) => a - b);
    expect(byRole('launcher')).toEqual([LAUNCHER_PID]);
    expect(byRole('rank')).toEqual(RANK_PIDS);
    expect(byRole('dataloader')).toEqual(Array.from({ length: 16 }, (_, index) => 200 + index));
    expect(byRole('checkpoint_writer')).toEqual([CHECKPOINT_WRITER_PID]);
    expect(tree.processes).toHaveLength(26);
    expect(tree.byPid(102)?.rank).toBe(9);
    expect(tree.byPid(RANK_WITHOUT_ENVIRON)).toMatchObject({ role: 'rank', rank: undefined });
    expect(tree.byPid(ZOMBIE_PID)).toMatchObject({ role: 'dataloader', rank: 13, process: { state: 'Z', argv: [] } });
    expect(tree.byPid(CHECKPOINT_WRITER_PID)?.rank).toBe(8);
    // The compile worker and its child inherit RANK but are not ranks.
    expect(tree.byPid(COMPILE_WORKER_PID)).toBeUndefined();
    expect(tree.byPid(311)).toBeUndefined();
    expect(tree.byPid(700)).toBeUndefined();
  });

  it('takes a Python process with RANK in its environment for a rank when no launcher is seen, but not a shell with the same environment', () => {
    const environment = { rank: 3, localRank: 3 };
    expect(
      roles([
        entry(50, 1, ['/bin/bash', 'job.sh'], { comm: 'bash', environment }),
        entry(51, 50, ['/usr/bin/python3', 'train.py'], { comm: 'pt_main_thread', environment }),
        entry(52, 51, ['/usr/bin/python3', 'train.py'], { comm: 'pt_data_worker', environment }),
      ]),
    ).toEqual({ 51: ['rank', 3], 52: ['dataloader', 3] });
  });

  it('takes Python tasks started by slurmstepd for ranks numbered by SLURM_PROCID, and a launcher they run for a launcher', () => {
    expect(
      roles([
        entry(40, 1, ['slurmstepd: [1234.0]'], { comm: 'slurmstepd' }),
        entry(41, 40, ['/usr/bin/python3', 'train.py'], { environment: { slurmProcId: 17 } }),
        entry(42, 40, ['/usr/bin/python3', 'train.py'], { environment: undefined }),
        entry(43, 40, ['/usr/bin/python3', '-m', 'torch.distributed.run', 'train.py']),
        entry(44, 43, ['/usr/bin/python3', '-u', 'train.py'], { environment: { rank: 0, localRank: 0, slurmProcId: 2 } }),
      ]),
    ).toEqual({ 41: ['rank', 17], 42: ['rank', undefined], 43: ['launcher', undefined], 44: ['rank', 0] });
  });

  it('nests deepspeed launchers and takes legacy --local_rank arguments for the rank', () => {
    expect(
      roles([
        entry(60, 1, ['/usr/bin/python', '/usr/local/bin/deepspeed', 'train.py']),
        entry(61, 60, ['/usr/bin/python', '-u', '-m', 'deepspeed.launcher.launch', 'train.py']),
        entry(62, 61, ['/usr/bin/python', '-u', 'train.py', '--local_rank=1']),
        entry(63, 61, ['/usr/bin/python', '-u', 'train.py', '--local-rank', '0']),
      ]),
    ).toEqual({ 60: ['launcher', undefined], 61: ['launcher', undefined], 62: ['rank', 1], 63: ['rank', 0] });
  });

  it('survives a parent loop in a corrupt table without hanging', () => {
    expect(roles([entry(70, 71, ['python3', '-m', 'torch.distributed.run']), entry(71, 70, ['python3'])])).toEqual({});
  });
});

describe('readProcessTable', () => {
  it('skips non-pid entries and processes whose stat is gone, and reads command lines once per process', async () => {
    writeTorchrunProcfs(dir);
    const cache = new ProcessIdentityCache();
    const first = await readProcessTable(dir, cache);
    expect(first.map((process) => process.pid)).not.toContain(999);
    expect(first.find((process) => process.pid === 900)?.comm).toBe('(sd-pam)');
    expect(first.find((process) => process.pid === 910)?.comm).toBe('tmux: server');
    // A cached command line is reused while the pid keeps its start time.
    rmSync(join(dir, '101', 'cmdline'));
    const second = await readProcessTable(dir, cache);
    expect(second.find((process) => process.pid === 101)?.argv).toContain('pretrain_gpt.py');
  });

  it('fails when the procfs root cannot be listed', async () => {
    await expect(readProcessTable(join(dir, 'missing'))).rejects.toThrow(/ENOENT/);
  });
});

describe('ranks found by the GPU they hold', () => {
  const plain = (pid: number, ppid: number, argv: string[]) => entry(pid, ppid, argv, { environment: {} });

  it('takes a process with a compute context for a rank, whatever its environment, and nothing else on the node', () => {
    const table = [
      entry(100, 1, ['/bin/bash'], { comm: 'bash', environment: {} }),
      plain(200, 100, ['python3', 'train.py']),
      plain(300, 100, ['python3', 'other.py']),
      entry(400, 1, ['./gpu_burn'], { comm: 'gpu_burn', environment: {} }),
    ];
    expect(roles(table)).toEqual({});
    expect(roles(table, new Set([200]))).toEqual({ 200: ['rank', undefined] });
    // Not Python, and still on a GPU: what holds a GPU is accounted for.
    expect(roles(table, new Set([200, 400]))).toEqual({ 200: ['rank', undefined], 400: ['rank', undefined] });
  });

  it('takes a Python parent of GPU holders that holds none itself for their launcher (torch.multiprocessing.spawn)', () => {
    const spawnChild = (pid: number) =>
      plain(pid, 200, ['python3', '-c', 'from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=9)', '--multiprocessing-fork']);
    const table = [
      plain(200, 1, ['python3', 'launch.py']),
      spawnChild(201),
      spawnChild(202),
      plain(203, 200, ['python3', '-c', 'from multiprocessing.resource_tracker import main;main(4)']),
    ];
    // Its other children (multiprocessing's resource tracker) are not ranks.
    expect(roles(table, new Set([201, 202]))).toEqual({ 200: ['launcher', undefined], 201: ['rank', undefined], 202: ['rank', undefined] });
    // A pid nvidia-smi lists that is not in this table (another pid namespace) changes nothing.
    expect(roles(table, new Set([999]))).toEqual({});
  });

  it("keeps the roles the rank variables give, and a rank's own children its workers", () => {
    const table = [
      entry(200, 1, ['python3', 'train.py'], { environment: { rank: 3 } }),
      entry(201, 200, ['python3', 'train.py'], { comm: 'pt_data_worker', environment: { rank: 3 } }),
    ];
    expect(roles(table, new Set([200]))).toEqual({ 200: ['rank', 3], 201: ['dataloader', 3] });
  });
});
