import type { Launcher } from '../core/launcher.js';

/**
 * A cluster backend is how actuators touch the scheduler. Slurm, Kubernetes and dry-run share
 * this interface, so dry-run swaps the backend instead of adding `if` branches.
 */

export interface NodeState {
  readonly node: string;
  /** False when the scheduler does not know the node. */
  readonly exists: boolean;
  /** True when the node takes no new work: drained, draining, or down. */
  readonly drained: boolean;
  /** The scheduler's reason for the current state, when it has one. */
  readonly reason?: string | undefined;
  /** The scheduler's own words for the state, for the audit. */
  readonly raw: string;
  /**
   * Someone else's hold on the node, when an administrator, another tool or the scheduler's own
   * health check took it out (their reason; on Kubernetes, a cordon steadfast did not make).
   * Undefined when the node is in service or out by steadfast alone. steadfast never returns
   * such a node to service (actuators/return-to-service.ts).
   */
  readonly foreign?: string | undefined;
  /**
   * Problems the cluster itself reports on the node besides its schedulability (Kubernetes:
   * node-problem-detector's conditions with status True), read as signals.
   */
  readonly conditions?: readonly string[] | undefined;
}

/** How a node goes back to service. */
export interface ResumeOptions {
  /**
   * Also lift someone else's drain or cordon (`steadfast resume --force`). Without it a backend
   * removes only steadfast's part and leaves a node another drained out of service.
   */
  readonly force?: boolean;
}

/**
 * Where a registered job's workload stands, as the scheduler remembers it: `completed` and
 * `cancelled` mean it ended by itself or by a person (the job is finished); `failed` is a fault,
 * for recovery; `unknown`: the scheduler shows nothing under the name (never submitted, or
 * forgotten), from which nothing is concluded.
 */
export interface WorkloadState {
  readonly state: 'active' | 'completed' | 'cancelled' | 'failed' | 'unknown';
  readonly detail: string;
}

export interface ClusterBackend {
  readonly name: string;
  nodeState(node: string): Promise<NodeState>;
  /** The nodes of a partition (Slurm), for maintenance windows by partition; empty for a partition it does not know. */
  partitionNodes?(partition: string): Promise<string[]>;
  /** The node's labels (Kubernetes), for profiles that match nodes by label; empty for a node it does not know. */
  nodeLabels?(node: string): Promise<Readonly<Record<string, string>>>;
  /**
   * Stops new work landing on the node, recording `reason` where the scheduler shows it (after
   * someone else's, where the node has one). `known`: the node's state the caller has just read,
   * so that a backend which needs it to keep their reason does not read it again.
   */
  drain(node: string, reason: string, known?: NodeState): Promise<void>;
  /**
   * Returns the node to service when steadfast's drain is the only one; with someone else's
   * drain too, removes only steadfast's part and leaves theirs (unless `options.force`).
   */
  resume(node: string, options?: ResumeOptions): Promise<void>;
  /**
   * Stops new work landing on the node without moving what runs there, for a short repair such
   * as a GPU reset (Kubernetes: cordon only, no evictions). Backends whose drain already leaves
   * running work alone (Slurm's DRAIN) leave it out, and drain is used.
   */
  cordon?(node: string, reason: string): Promise<void>;
  /**
   * Reboots the node once it is idle and returns it in `nextState` (Slurm: `scontrol reboot
   * ASAP`). Backends that cannot reboot a node leave it out; the remedy then hands it off.
   */
  reboot?(node: string, reason: string, nextState: 'resume' | 'down'): Promise<void>;
  /**
   * Holds a healthy node back as a warm standby: no ordinary work lands on it (Slurm: a
   * reservation; Kubernetes: a taint and a role label). Idempotent.
   */
  holdStandby(node: string): Promise<void>;
  /** Releases a standby to `job` (Slurm: out of the reservation; Kubernetes: untaint, label with the job). Idempotent. */
  activateStandby(node: string, job: string): Promise<void>;
  /** Nodes currently held as standbys, as the scheduler records them. */
  standbys(): Promise<string[]>;
  /**
   * Restarts a workload the scheduler runs itself (Kubernetes: deletes its pods so their
   * controller recreates them). Backends whose jobs are relaunched by a command leave it out.
   */
  relaunchWorkload?(namespace: string, podSelector: string): Promise<number>;
  /**
   * Ends every job the scheduler runs under `name`, a registered job's name, and waits until they
   * are gone, so that a relaunch never meets its predecessor on the nodes (Slurm: the jobs named
   * `name`, as a launcher with `--job-name={job}` submits them). Resolves to the ids it cancelled.
   * Backends whose relaunch replaces the workload themselves (Kubernetes) leave it out.
   */
  cancelJobs?(name: string): Promise<string[]>;
  /**
   * The state of the workload a registered job runs as (Slurm: the jobs named after it;
   * Kubernetes: the workload its launcher names). Backends that cannot tell leave it out.
   * `seenBefore`: the workload was read present before, by this controller or an earlier one
   * (the job store keeps it); a Kubernetes workload not found then counts as deleted.
   */
  workloadState?(name: string, launcher?: Launcher, seenBefore?: boolean): Promise<WorkloadState>;
  /** Extra environment for the job launcher's commands, so that they reach the same scheduler (Slurm: `backend.slurm.env`). */
  readonly launchEnv?: Readonly<Record<string, string>>;
}
