import { execFile } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { DoNotRetryError, RetryLaterError, errorMessage } from '../core/errors.js';
import { JOB_NAME_PATTERN } from '../core/job.js';
import { NODE_NAME_PATTERN } from '../core/names.js';
import { SLURM_PARTITION_PATTERN } from '../core/remedy-config.js';
import type { ClusterBackend, NodeState, ResumeOptions, WorkloadState } from './backend.js';
import { appendOwnReason, splitReason } from './drain-reason.js';
import { expandHostlist } from './hostlist.js';
import type { SlurmRestClient } from './slurm-rest.js';

const run = promisify(execFile);

export interface SlurmOptions {
  readonly scontrol: string;
  readonly sinfo: string;
  /** squeue and scancel, for stopping a registered job's Slurm jobs (default: by name on PATH). */
  readonly squeue?: string;
  readonly scancel?: string;
  /** Added to the environment of every Slurm command (SLURM_CONF, for instance). */
  readonly env: Readonly<Record<string, string>>;
  readonly timeoutMs: number;
  /** Reservation that holds warm standbys back from ordinary jobs. */
  readonly standbyReservation?: string;
  /**
   * slurmrestd, when configured: node state and the standby reservation are read over REST,
   * and drain/resume go over REST when the daemon offers node updates (Slurm 23.02 and later);
   * everything else stays with scontrol.
   */
  readonly rest?: SlurmRestClient | undefined;
  /**
   * How long a cancelled job may take to leave squeue (slurmstepd sends SIGTERM, then SIGKILL
   * after KillWait, 30 s by default, then runs the epilog) before the stop counts as failed.
   */
  readonly cancelWaitMs?: number;
}

/** Job states (squeue %T) in which a Slurm job has not ended yet. */
const JOB_NOT_ENDED = new Set([
  'PENDING',
  'RUNNING',
  'CONFIGURING',
  'COMPLETING',
  'SUSPENDED',
  'REQUEUED',
  'REQUEUE_HOLD',
  'REQUEUE_FED',
  'RESIZING',
  'SIGNALING',
  'STAGE_OUT',
  'STOPPED',
  'SPECIAL_EXIT',
]);

const DEFAULT_STANDBY_RESERVATION = 'steadfast-standby';
const DEFAULT_CANCEL_WAIT_MS = 120_000;
/**
 * squeue is asked again after 50 ms, then at doubling pauses up to 250 ms: a cancelled job usually
 * leaves the queue within a few hundred milliseconds, and a fixed 250 ms would spend half a poll,
 * on average, after it has gone, on the path from the fault to the relaunch.
 */
const CANCEL_POLL_FIRST_MS = 50;
const CANCEL_POLL_MAX_MS = 250;

/** Slurm states in which a node takes no new jobs (sinfo `%T`, without the `~`/`*` suffixes). */
const OUT_OF_SERVICE = new Set(['drained', 'draining', 'drain', 'down', 'fail', 'failing', 'maint']);

/** slurmrestd base states and flags (upper case) in which a node takes no new jobs. */
const REST_OUT_OF_SERVICE = new Set(['DRAIN', 'DRAINED', 'DRAINING', 'DOWN', 'FAIL', 'FAILING', 'MAINT']);

/** Someone else's part of an out-of-service node's reason (drain-reason.ts). */
function foreignPart(drained: boolean, reason: string | undefined): string | undefined {
  return drained ? splitReason(reason).foreign : undefined;
}

/** Reasons reach slurmctld as one argument; keep them printable and of a size sinfo shows. */
function cleanReason(reason: string): string {
  return reason.replace(/[^\x20-\x7e]/g, ' ').slice(0, 240);
}

/**
 * Drains through `scontrol update NodeName=… State=DRAIN Reason=…` and reads state with
 * `sinfo`, always via execFile with an argument array and a validated node name: nothing a
 * signal carries can become a shell word or an extra option.
 */
export class SlurmBackend implements ClusterBackend {
  readonly name = 'slurm';

  constructor(private readonly options: SlurmOptions) {}

  /** sbatch and the other launcher commands reach the same slurmctld as scontrol (SLURM_CONF). */
  get launchEnv(): Readonly<Record<string, string>> {
    return this.options.env;
  }

  private async exec(file: string, args: string[]): Promise<string> {
    try {
      const { stdout } = await run(file, args, {
        env: { ...process.env, ...this.options.env },
        timeout: this.options.timeoutMs,
        maxBuffer: 1024 * 1024,
      });
      return stdout;
    } catch (error) {
      // scontrol prints some refusals ("Reservation … not found") on stdout.
      const failure = error as { stderr?: string; stdout?: string };
      const said = failure.stderr?.trim() || failure.stdout?.trim();
      const message = `${file} ${args[0] ?? ''} failed: ${said || errorMessage(error)}`;
      // slurmctld answering "invalid node" will say so again on every retry.
      if (said && /invalid node name|not found|invalid reservation/i.test(said)) throw new DoNotRetryError(message);
      throw new RetryLaterError(message, error);
    }
  }

  private checkNode(node: string): void {
    if (!NODE_NAME_PATTERN.test(node)) throw new DoNotRetryError(`refusing to pass invalid node name ${JSON.stringify(node.slice(0, 80))} to Slurm`);
  }

  async partitionNodes(partition: string): Promise<string[]> {
    if (!SLURM_PARTITION_PATTERN.test(partition))
      throw new DoNotRetryError(`refusing to pass invalid partition name ${JSON.stringify(partition.slice(0, 80))} to Slurm`);
    const out = await this.exec(this.options.sinfo, ['--noheader', '--Node', `--partition=${partition}`, '--format=%N']);
    return [
      ...new Set(
        out
          .split('\n')
          .map((line) => line.trim())
          .filter((node) => NODE_NAME_PATTERN.test(node)),
      ),
    ].sort();
  }

  async nodeState(node: string): Promise<NodeState> {
    this.checkNode(node);
    if (this.options.rest) {
      const state = await this.options.rest.node(node);
      if (!state.exists) return { node, exists: false, drained: false, raw: 'unknown to slurm' };
      const drained = state.states.some((flag) => REST_OUT_OF_SERVICE.has(flag));
      return { node, exists: true, drained, reason: state.reason, raw: state.states.join('+'), foreign: foreignPart(drained, state.reason) };
    }
    const out = await this.exec(this.options.sinfo, ['--noheader', '--Node', `--nodes=${node}`, '--format=%N|%T|%E']);
    const line = out.split('\n').find((row) => row.startsWith(`${node}|`));
    if (!line) return { node, exists: false, drained: false, raw: 'unknown to slurm' };
    const [, rawState = '', reason = ''] = line.split('|');
    const state = rawState.replace(/[~*#!%$@^-]+$/, '').toLowerCase();
    const drained = OUT_OF_SERVICE.has(state);
    const known = reason && reason !== 'none' ? reason : undefined;
    return { node, exists: true, drained, reason: known, raw: rawState, foreign: foreignPart(drained, known) };
  }

  private async restUpdatesNodes(): Promise<boolean> {
    return this.options.rest !== undefined && (await this.options.rest.describe()).updatesNodes;
  }

  /**
   * Slurm keeps one Reason per node and a drain replaces it: on a node someone else drained,
   * their reason is kept first and steadfast's appended after it (`admin: fan; steadfast: …`).
   */
  async drain(node: string, reason: string, known?: NodeState): Promise<void> {
    const current = known ?? (await this.nodeState(node));
    await this.setDrain(node, appendOwnReason(current.drained ? current.reason : undefined, reason));
  }

  private async setDrain(node: string, reason: string): Promise<void> {
    this.checkNode(node);
    if (await this.restUpdatesNodes()) return this.options.rest?.updateNode(node, 'DRAIN', cleanReason(reason));
    await this.exec(this.options.scontrol, ['update', `NodeName=${node}`, 'State=DRAIN', `Reason=${cleanReason(reason)}`]);
  }

  /**
   * RESUME only when the node's reason is steadfast's alone (or `force`). With someone else's
   * reason too, steadfast's part is taken away with `State=DRAIN Reason=<theirs>`, which keeps
   * the node drained as they left it; a node out by someone else alone is not touched.
   */
  async resume(node: string, options: ResumeOptions = {}): Promise<void> {
    this.checkNode(node);
    if (options.force !== true) {
      const current = await this.nodeState(node);
      if (current.foreign !== undefined) {
        if (splitReason(current.reason).own !== undefined) await this.setDrain(node, current.foreign);
        return;
      }
    }
    if (await this.restUpdatesNodes()) return this.options.rest?.updateNode(node, 'RESUME');
    await this.exec(this.options.scontrol, ['update', `NodeName=${node}`, 'State=RESUME']);
  }

  /**
   * `scontrol reboot ASAP nextstate=… reason=… NODE`: Slurm drains the node, reboots it through
   * its RebootProgram once no job runs there, and returns it in the next state.
   */
  async reboot(node: string, reason: string, nextState: 'resume' | 'down'): Promise<void> {
    this.checkNode(node);
    await this.exec(this.options.scontrol, [
      'reboot',
      'ASAP',
      `nextstate=${nextState === 'resume' ? 'RESUME' : 'DOWN'}`,
      `reason=${cleanReason(reason)}`,
      node,
    ]);
  }

  private get reservation(): string {
    return this.options.standbyReservation ?? DEFAULT_STANDBY_RESERVATION;
  }

  /**
   * Standbys live in one maintenance reservation (ByteRobust §6.2: warm, self-checked, kept
   * off ordinary work). Slurm prints its node list compressed (`node-[6,8]`), expanded here as
   * `scontrol show hostnames` would (hostlist.ts), without a second command on the way from a
   * fault to the relaunch.
   */
  async standbys(): Promise<string[]> {
    if (this.options.rest) return expandHostlist((await this.options.rest.reservationNodes(this.reservation)) ?? '');
    let out: string;
    try {
      out = await this.exec(this.options.scontrol, ['show', `ReservationName=${this.reservation}`, '--oneliner']);
    } catch (error) {
      if (error instanceof DoNotRetryError) return [];
      throw error;
    }
    const list = /\bNodes=(\S+)/.exec(out)?.[1];
    if (!list || list === '(null)') return [];
    return expandHostlist(list);
  }

  /** Makes the reservation hold `nodes`; `current` is what standbys() just read. */
  private async setStandbys(current: readonly string[], nodes: readonly string[]): Promise<void> {
    const exists = current.length > 0;
    if (nodes.length === 0) {
      if (exists) await this.exec(this.options.scontrol, ['delete', `ReservationName=${this.reservation}`]);
      return;
    }
    const list = `Nodes=${[...nodes].sort().join(',')}`;
    await this.exec(
      this.options.scontrol,
      exists
        ? ['update', `ReservationName=${this.reservation}`, list]
        : ['create', 'reservation', `ReservationName=${this.reservation}`, list, 'StartTime=now', 'Duration=infinite', 'Users=root', 'Flags=maint,ignore_jobs'],
    );
  }

  async holdStandby(node: string): Promise<void> {
    this.checkNode(node);
    const current = await this.standbys();
    if (!current.includes(node)) await this.setStandbys(current, [...current, node]);
  }

  async activateStandby(node: string, _job: string): Promise<void> {
    this.checkNode(node);
    const current = await this.standbys();
    if (current.includes(node))
      await this.setStandbys(
        current,
        current.filter((candidate) => candidate !== node),
      );
  }

  /** Ids of the jobs squeue lists under `name`: pending, running or completing, of every user. */
  private async jobsNamed(name: string): Promise<string[]> {
    // %A: the job id, one per element of a job array (%i would print `12_[1-3]` for pending arrays).
    const out = await this.exec(this.options.squeue ?? 'squeue', ['--noheader', `--name=${name}`, '--format=%A']);
    return out
      .split('\n')
      .map((line) => line.trim())
      .filter((id) => /^\d+$/.test(id));
  }

  /**
   * The Slurm jobs of a registered job are those named after it (`--job-name={job}` in its
   * launcher). They are cancelled by id, the ids squeue listed, and awaited until squeue no longer
   * shows them (slurmstepd has killed the tasks and run the epilog), so the nodes are free for
   * the relaunch. A job that ended between the listing and scancel is simply gone.
   */
  async cancelJobs(name: string): Promise<string[]> {
    if (!JOB_NAME_PATTERN.test(name)) throw new DoNotRetryError(`refusing to pass invalid job name ${JSON.stringify(name.slice(0, 80))} to Slurm`);
    const ids = await this.jobsNamed(name);
    if (ids.length === 0) return [];
    let refusal = '';
    try {
      await this.exec(this.options.scancel ?? 'scancel', ids);
    } catch (error) {
      // scancel also fails for a job that completed meanwhile; squeue below is the judge.
      refusal = errorMessage(error);
    }
    const deadline = Date.now() + (this.options.cancelWaitMs ?? DEFAULT_CANCEL_WAIT_MS);
    for (let pause = CANCEL_POLL_FIRST_MS; ; pause = Math.min(2 * pause, CANCEL_POLL_MAX_MS)) {
      const left = (await this.jobsNamed(name)).filter((id) => ids.includes(id));
      if (left.length === 0) return ids;
      if (Date.now() >= deadline) {
        throw new RetryLaterError(`Slurm jobs ${left.join(', ')} named ${name} are still listed after scancel${refusal ? ` (${refusal})` : ''}`);
      }
      await sleep(pause);
    }
  }

  /**
   * The registered job's Slurm jobs by name, ended ones included while slurmctld remembers them
   * (MinJobAge): any not ended is `active`; otherwise the newest one's end decides.
   */
  async workloadState(name: string): Promise<WorkloadState> {
    if (!JOB_NAME_PATTERN.test(name)) throw new DoNotRetryError(`refusing to pass invalid job name ${JSON.stringify(name.slice(0, 80))} to Slurm`);
    const out = await this.exec(this.options.squeue ?? 'squeue', ['--noheader', '--states=all', `--name=${name}`, '--format=%A|%T']);
    const jobs = out
      .split('\n')
      .map((line) => line.trim().split('|'))
      .filter((fields): fields is [string, string] => fields.length === 2 && /^\d+$/.test(fields[0] ?? ''))
      .map(([id, state]) => ({ id: Number(id), state: state.toUpperCase() }));
    if (jobs.length === 0) return { state: 'unknown', detail: `squeue shows no Slurm job named ${name}` };
    const running = jobs.find((job) => JOB_NOT_ENDED.has(job.state));
    if (running) return { state: 'active', detail: `Slurm job ${running.id} is ${running.state}` };
    const newest = jobs.reduce((a, b) => (b.id > a.id ? b : a));
    const state = newest.state === 'COMPLETED' ? 'completed' : newest.state.startsWith('CANCELLED') ? 'cancelled' : 'failed';
    return { state, detail: `Slurm job ${newest.id} named ${name} ended ${newest.state}` };
  }
}
