import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * Builds a /proc tree in a temp dir for the process collector tests; not a test file itself.
 * The lines follow proc(5) on a 5.15 kernel: 52 stat fields, status with Vm* lines except for
 * zombies and kernel threads, NUL-separated cmdline and environ.
 */

export interface FakeProcess {
  readonly pid: number;
  readonly ppid: number;
  readonly comm: string;
  readonly argv: readonly string[];
  readonly state?: string;
  readonly utimeTicks?: number;
  readonly stimeTicks?: number;
  readonly threads?: number;
  /** kB; absent for zombies and kernel threads. */
  readonly rssKb?: number;
  /** Written to environ when given; otherwise the file is missing, as when it cannot be read. */
  readonly environ?: Readonly<Record<string, string>>;
}

export function statLine(process: FakeProcess): string {
  const state = process.state ?? 'S';
  const rssPages = Math.floor((process.rssKb ?? 0) / 4);
  const fields = [
    process.pid,
    `(${process.comm})`,
    state,
    process.ppid,
    process.ppid,
    process.ppid,
    0,
    -1,
    4194560,
    81234,
    0,
    12,
    0,
    process.utimeTicks ?? 0,
    process.stimeTicks ?? 0,
    0,
    0,
    20,
    0,
    process.threads ?? 1,
    0,
    1234567 + process.pid,
    (process.rssKb ?? 0) * 1024 * 3,
    rssPages,
    '18446744073709551615',
    1,
    1,
    0,
    0,
    0,
    0,
    0,
    16781312,
    17642,
    0,
    0,
    0,
    17,
    3,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
  ];
  return `${fields.join(' ')}\n`;
}

function statusText(process: FakeProcess): string {
  const state = process.state ?? 'S';
  const lines = [
    `Name:\t${process.comm}`,
    'Umask:\t0022',
    `State:\t${state} (${state === 'Z' ? 'zombie' : 'sleeping'})`,
    `Tgid:\t${process.pid}`,
    `Pid:\t${process.pid}`,
    `PPid:\t${process.ppid}`,
  ];
  if (process.rssKb !== undefined) {
    lines.push(
      `VmPeak:\t${process.rssKb * 3} kB`,
      `VmSize:\t${process.rssKb * 3} kB`,
      `VmHWM:\t${process.rssKb} kB`,
      `VmRSS:\t${String(process.rssKb).padStart(8)} kB`,
    );
  }
  lines.push(`Threads:\t${process.threads ?? 1}`);
  return `${lines.join('\n')}\n`;
}

export function writeFakeProcfs(root: string, processes: readonly FakeProcess[]): void {
  for (const process of processes) {
    const dir = join(root, String(process.pid));
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'stat'), statLine(process));
    writeFileSync(join(dir, 'status'), statusText(process));
    writeFileSync(join(dir, 'comm'), `${process.comm}\n`);
    writeFileSync(join(dir, 'cmdline'), process.argv.map((arg) => `${arg}\0`).join(''));
    if (process.environ !== undefined) {
      writeFileSync(
        join(dir, 'environ'),
        Object.entries(process.environ)
          .map(([key, value]) => `${key}=${value}\0`)
          .join(''),
      );
    }
  }
}

const PYTHON = '/usr/bin/python3';
const TRAINING_ARGS = ['pretrain_gpt.py', '--tensor-model-parallel-size', '8', '--save', '/checkpoints/gpt-175b', '--load', '/checkpoints/gpt-175b'];
/** torchrun starts each rank as `sys.executable -u <script> <args>`. */
export const RANK_ARGV = [PYTHON, '-u', ...TRAINING_ARGS];
export const LAUNCHER_PID = 100;
export const RANK_PIDS = [101, 102, 103, 104, 105, 106, 107, 108];
/** Rank pid 108's environ is missing (unreadable): its rank is unknown. */
export const RANK_WITHOUT_ENVIRON = 108;
export const ZOMBIE_PID = 211;
export const CHECKPOINT_WRITER_PID = 300;
export const COMPILE_WORKER_PID = 310;

/**
 * Node 1 of a 2-node torchrun job: launcher 100, ranks 101–108 (global ranks 8–15), two
 * dataloader workers per rank (200 + 2i, 201 + 2i; one of them a zombie), a checkpoint writer
 * under rank 8, an inductor compile worker (and its child) under rank 9, and unrelated
 * processes, some with spaces and parentheses in their comm.
 */
export function torchrunNode(): FakeProcess[] {
  const processes: FakeProcess[] = [
    { pid: 1, ppid: 0, comm: 'systemd', argv: ['/sbin/init', 'splash'], utimeTicks: 2210, stimeTicks: 5120, rssKb: 13200 },
    { pid: 2, ppid: 0, comm: 'kthreadd', argv: [] },
    { pid: 850, ppid: 1, comm: 'sshd', argv: ['sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups'], rssKb: 9100 },
    { pid: 900, ppid: 1, comm: '(sd-pam)', argv: ['(sd-pam)'], rssKb: 5200 },
    { pid: 910, ppid: 1, comm: 'tmux: server', argv: ['tmux'], rssKb: 4300 },
    { pid: 95, ppid: 910, comm: 'bash', argv: ['-bash'], rssKb: 5400 },
    {
      pid: 700,
      ppid: 1,
      comm: 'python3',
      argv: ['/opt/conda/bin/python', '-m', 'jupyterlab', '--no-browser'],
      utimeTicks: 900,
      stimeTicks: 100,
      rssKb: 210000,
    },
    { pid: 710, ppid: 1, comm: 'nvidia-persiste', argv: ['/usr/bin/nvidia-persistenced', '--user', 'nvidia-persistenced'], rssKb: 1800 },
    {
      pid: LAUNCHER_PID,
      ppid: 95,
      // Every process that imported torch renames its main thread, so the comm of torchrun says nothing.
      comm: 'pt_main_thread',
      argv: [PYTHON, '/usr/local/bin/torchrun', '--nnodes=2', '--nproc-per-node=8', '--rdzv-backend=c10d', '--rdzv-endpoint=node-0:29500', ...TRAINING_ARGS],
      utimeTicks: 1520,
      stimeTicks: 310,
      threads: 6,
      rssKb: 352000,
    },
  ];
  RANK_PIDS.forEach((pid, local) => {
    processes.push({
      pid,
      ppid: LAUNCHER_PID,
      comm: 'pt_main_thread',
      argv: RANK_ARGV,
      utimeTicks: 3_600_000 + local * 100,
      stimeTicks: 120_000,
      threads: 96,
      rssKb: 18_874_368,
      ...(pid === RANK_WITHOUT_ENVIRON
        ? {}
        : { environ: { PATH: '/usr/bin', RANK: String(8 + local), LOCAL_RANK: String(local), WORLD_SIZE: '16', MASTER_ADDR: 'node-0' } }),
    });
    for (const worker of [0, 1]) {
      const workerPid = 200 + 2 * local + worker;
      const zombie = workerPid === ZOMBIE_PID;
      processes.push({
        pid: workerPid,
        ppid: pid,
        // torch ≥ 2.x names dataloader workers pt_data_worker; older ones keep the rank's comm.
        comm: local < 6 ? 'pt_data_worker' : 'python3',
        argv: zombie ? [] : RANK_ARGV,
        state: zombie ? 'Z' : 'S',
        utimeTicks: 50_000 + worker * 10,
        stimeTicks: 8_000,
        threads: zombie ? 1 : 4,
        ...(zombie ? {} : { rssKb: 2_621_440 }),
      });
    }
  });
  processes.push(
    {
      pid: CHECKPOINT_WRITER_PID,
      ppid: 101,
      comm: 'ckpt_writer',
      argv: [PYTHON, '-c', 'from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=8, pipe_handle=12)', '--multiprocessing-fork'],
      utimeTicks: 700,
      stimeTicks: 2_300,
      threads: 3,
      rssKb: 1_048_576,
    },
    {
      pid: COMPILE_WORKER_PID,
      ppid: 102,
      comm: 'python3',
      argv: [PYTHON, '/usr/lib/python3/dist-packages/torch/_inductor/compile_worker/__main__.py', '--kind=fork', '--workers=32', '--parent=102'],
      rssKb: 400_000,
      environ: { RANK: '9', LOCAL_RANK: '1' },
    },
    {
      pid: 311,
      ppid: COMPILE_WORKER_PID,
      comm: 'python3',
      argv: [PYTHON, '/usr/lib/python3/dist-packages/torch/_inductor/compile_worker/__main__.py'],
      environ: { RANK: '9', LOCAL_RANK: '1' },
      rssKb: 300_000,
    },
  );
  return processes;
}

/** Writes the torchrun node plus what a real /proc also holds: non-pid entries and a half-gone process. */
export function writeTorchrunProcfs(root: string): void {
  writeFakeProcfs(root, torchrunNode());
  mkdirSync(join(root, 'sys', 'kernel'), { recursive: true });
  mkdirSync(join(root, 'self'), { recursive: true });
  writeFileSync(join(root, 'meminfo'), 'MemTotal:       2113631672 kB\n');
  // A process that exited between readdir and the read of its stat.
  mkdirSync(join(root, '999'), { recursive: true });
}
