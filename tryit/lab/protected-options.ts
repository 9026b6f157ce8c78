/**
 * What a protected lab is made of: its options (nodes, standbys, spares, the job, the fail-slow
 * and stall timings at the lab's pace) and the ports and shares its parts agree on. protected.ts
 * builds the lab from them.
 */

/** Where every node's agent listens, inside its own namespace (so on the node's own address). */
export const LAB_AGENT_PORT = 9401;

/** train.py's share of micro-batches per rank when there is no plan (--micro-batches). */
export const LAB_MICROBATCHES_PER_RANK = 4;

export interface ProtectedLabOptions {
  /** Compute nodes the job runs on (default 2) and warm standbys (default 2). */
  readonly nodes?: number;
  readonly standbys?: number;
  /** Names of namespaces and links, and the /24 (see `steadfast lab up`). */
  readonly prefix?: string;
  readonly subnet?: string;
  /** The registered training job's name (default `lab-train`). */
  readonly job?: string;
  readonly checkpointEvery?: number;
  /** Seconds of stand-in compute per micro-batch (train.py --step-sleep). */
  readonly stepSleep?: number;
  /**
   * Seconds without a new iteration before SteadfastTrainingStalled fires (the shipped rules say
   * 600). Set, Prometheus gets the rules rendered with it under the root instead of the shipped
   * files; the hang scenario needs it short, the others leave it, since a relaunch importing
   * PyTorch is a pause of several seconds too.
   */
  readonly noProgressSeconds?: number;
  /**
   * Fail-slow detection at the lab's pace: seconds between checks, each mitigation's cost and the
   * verification threshold (analysis.failSlowIntervalSeconds, failSlowCostSeconds,
   * failSlowThreshold; shipped 5 s, 30/600/1800 s and 0.1). Set, the job is also registered with
   * micro-batches (4 per rank, train.py's own share), so that S2 has a plan to serve.
   */
  readonly failSlow?: {
    readonly intervalSeconds: number;
    readonly costSeconds: { readonly S2: number; readonly S3: number; readonly S4: number };
    readonly threshold: number;
  };
  /**
   * GPU resets in place (remedies.gpuReset on): each node's agent serves its gpu-reset endpoint on
   * a simulated nvidia-smi of 8 GPUs (tryit/fake-nvidia-smi.sh) — the lab has no GPUs.
   */
  readonly gpuReset?: boolean;
  /** Hot swap: spare nodes after the compute nodes, in the job's allocation (`hotSwap.spares`), and the ranks' rendezvous store (hot-swap-lab.ts). */
  readonly spares?: number;
  /**
   * The preflight lab (scenario-preflight.ts): each run of the job first runs
   * clients/python/steadfast_preflight.py on its nodes, and from lab up what the compute node at
   * `slowNode` (0-based) sends is held to `rateMbit` (network.ts impairNodeLink), so the job's
   * first preflight finds it; `thresholdSeconds` is the preflight's --threshold.
   */
  readonly preflight?: { readonly slowNode: number; readonly rateMbit: number; readonly thresholdSeconds: number };
  /** Log the controller to stderr instead of to a file under the root. */
  readonly verbose?: boolean;
  /** Keep the root directory (logs, checkpoints, configs) after down. */
  readonly keepDir?: boolean;
  readonly progress?: (step: string, seconds: number) => void;
}
