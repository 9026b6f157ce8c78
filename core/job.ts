import { z } from 'zod';
import { InputError } from './errors.js';
import { launcherArgSchema, launcherNameSchema, type SlurmLauncher } from './launcher.js';
import { distinctNodeNames, nodeNameSchema } from './names.js';
import { Topology, topologySpecSchema } from './topology.js';
import { parseOrThrow } from './validate.js';

/**
 * A training job as steadfast knows it: where it runs, how its ranks map onto parallel groups,
 * which of the operator's launchers restarts it, and which code version it runs (docs/architecture.md, contracts).
 */

export const JOB_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;
export const jobNameSchema = z.string().regex(JOB_NAME_PATTERN, 'must be 1-63 letters, digits, ".", "_" or "-", starting with a letter or digit');

/**
 * A code version (a tag, a commit, a path-like release name). It is substituted into the
 * launcher's argv as `{version}`, so it may not look like an option (a leading "-") and holds
 * no space, control character or shell metacharacter.
 */
export const CODE_VERSION_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._+:@/-]{0,127}$/;
export const codeVersionSchema = z
  .string()
  .regex(CODE_VERSION_PATTERN, 'must be 1-128 letters, digits, ".", "_", "+", ":", "@", "/" or "-", starting with a letter or digit')
  // A version may name a path (release/2.1); it must not climb out of one (as git refuses ".." in ref names).
  .refine((version) => !version.includes('..'), 'must not contain ".."');

/**
 * A Slurm launcher's argv with its placeholders filled: each stays one argument, never a shell
 * word. The values are checked again here, whatever stored them, so that nothing read back from
 * Redis can put an option or a control character into a command; throws InputError before
 * anything runs.
 */
export function launchArgv(
  launcher: SlurmLauncher,
  values: { job: string; nodes: readonly string[]; version: string },
  argv: readonly string[] = launcher.command,
): string[] {
  parseOrThrow(jobNameSchema, values.job, 'launcher {job}');
  parseOrThrow(z.array(nodeNameSchema).min(1), values.nodes, 'launcher {nodes}');
  parseOrThrow(codeVersionSchema, values.version, 'launcher {version}');
  parseOrThrow(z.array(launcherArgSchema).min(1), argv, 'launcher argv');
  return argv.map((arg) =>
    arg
      .replaceAll('{job}', values.job)
      .replaceAll('{nodes}', values.nodes.join(','))
      .replaceAll('{nodeCount}', String(values.nodes.length))
      .replaceAll('{version}', values.version),
  );
}

/** The default upper bound of one hot swap, in seconds. */
export const HOT_SWAP_TIMEOUT_DEFAULT_SECONDS = 60;

export const hotSwapSchema = z
  .object({
    /**
     * Spare nodes of the allocation, none of them in `nodes`: the processes there wait to take a
     * failed node's place. A registration names 1-64; a swap uses them up (none left: today's road).
     */
    spares: distinctNodeNames(64, 0),
    /** Upper bound of one swap before the job falls back to stop and relaunch (default 60). */
    timeoutSeconds: z.number().int().min(5).max(3600).optional(),
  })
  .strict();
export type HotSwapSpec = z.infer<typeof hotSwapSchema>;

/**
 * The nodes a launch of the job names as `{nodes}`: its nodes, then its unused hot-swap spares,
 * so that a relaunch again starts the spare processes (the whole allocation).
 */
export function launchNodes(spec: Pick<JobSpec, 'nodes' | 'hotSwap'>): string[] {
  return [...spec.nodes, ...(spec.hotSwap?.spares ?? [])];
}

export const jobSpecSchema = z
  .object({
    name: jobNameSchema,
    nodes: distinctNodeNames(100_000),
    ranksPerNode: z.number().int().min(1).max(1024),
    /**
     * An explicit rank table, or parallel sizes with a Megatron order string; the sizes form takes
     * `nodes` and `ranksPerNode` from the job when it leaves them out.
     */
    topology: z.record(z.string(), z.unknown()).optional(),
    /** The name of one of the operator's launchers (the controller's `launchers:` configuration). */
    launcher: launcherNameSchema,
    codeVersion: codeVersionSchema,
    /**
     * Micro-batches per iteration over all DP groups, for fail-slow rebalancing (Greyhound §5.2,
     * S2): the training loop reads its DP group's share from GET /api/v1/jobs/:id/microbatches.
     * `multipleOf` keeps every share a multiple of the pipeline depth (1F1B).
     */
    microbatches: z
      .object({ perIteration: z.number().int().min(1).max(10_000_000), multipleOf: z.number().int().min(1).max(1024).optional() })
      .strict()
      .optional(),
    /**
     * Hot swap (DeadPool §V-C, §VI): idle spare processes run on `spares`, nodes of the job's own
     * allocation outside `nodes`; on a machine fault a spare takes the failed node's shards while the
     * job keeps running, within `timeoutSeconds` (default 60), else the job is stopped and relaunched.
     */
    hotSwap: hotSwapSchema.optional(),
  })
  .strict();

export type JobSpec = z.infer<typeof jobSpecSchema>;

/** Validates a job spec, including its topology against its nodes; throws InputError naming the field. */
export function parseJobSpec(value: unknown): { spec: JobSpec; topology: Topology } {
  const spec = parseOrThrow(jobSpecSchema, value, 'job');
  const raw = spec.topology ?? {};
  const withDefaults =
    'ranks' in raw ? raw : { nodes: spec.nodes, ranksPerNode: spec.ranksPerNode, ...withDerivedDp(raw, spec.nodes.length * spec.ranksPerNode) };
  const topology = Topology.from(parseOrThrow(topologySpecSchema, withDefaults, 'job.topology'));
  const jobNodes = new Set(spec.nodes);
  const unknownNodes = [...new Set(topology.ranks.map((rank) => rank.node))].filter((node) => !jobNodes.has(node));
  if (unknownNodes.length > 0) throw new InputError(`job.topology: ranks on nodes not in job.nodes: ${unknownNodes.join(', ')}`, 'topology');
  const sparesInJob = (spec.hotSwap?.spares ?? []).filter((node) => jobNodes.has(node));
  if (sparesInJob.length > 0)
    throw new InputError(
      `job.hotSwap.spares: ${sparesInJob.join(', ')} ${sparesInJob.length === 1 ? 'is' : 'are'} in job.nodes; a spare is a node of the allocation outside them`,
      'hotSwap.spares',
    );
  if (spec.microbatches) {
    const { perIteration, multipleOf = 1 } = spec.microbatches;
    const groups = dataParallelGroups(topology);
    if (perIteration % multipleOf !== 0 || perIteration < groups * multipleOf) {
      throw new InputError(
        `job.microbatches: perIteration ${perIteration} must be a multiple of ${multipleOf} and give each of the ${groups} DP groups at least ${multipleOf}`,
        'microbatches',
      );
    }
  }
  return { spec, topology };
}

/**
 * The number of ranks of a job whose spec passed parseJobSpec (at registration; an eviction's
 * replacement keeps it), without building its rank table: a rank table's length, or the nodes
 * its sizes place ranks on times the ranks per node (the product of the sizes, checked equal).
 */
export function worldSize(spec: JobSpec): number {
  const raw = spec.topology ?? {};
  if (Array.isArray(raw.ranks)) return raw.ranks.length;
  const nodes = Array.isArray(raw.nodes) ? raw.nodes.length : spec.nodes.length;
  const perNode = typeof raw.ranksPerNode === 'number' ? raw.ranksPerNode : spec.ranksPerNode;
  return nodes * perNode;
}

/**
 * The spec with `replacement` in the place of `evicted` (a standby, a hot-swap spare): in its
 * nodes, and in an explicit rank table, whose ranks move with their node. Other fields are kept.
 */
export function replaceNodeInSpec(spec: JobSpec, evicted: string, replacement: string): JobSpec {
  const swap = (node: unknown): unknown => (node === evicted ? replacement : node);
  const nodes = spec.nodes.map((node) => (node === evicted ? replacement : node));
  const ranks = spec.topology?.ranks;
  const topology = Array.isArray(ranks)
    ? {
        ...spec.topology,
        ranks: ranks.map((rank: unknown) => (typeof rank === 'object' && rank !== null ? { ...rank, node: swap((rank as { node?: unknown }).node) } : rank)),
      }
    : spec.topology;
  return { ...spec, nodes, ...(topology ? { topology } : {}) };
}

/**
 * Parallel sizes without `dp` take it from the world size, as Megatron does (world / tp·cp·ep·pp):
 * no topology at all is a plain data-parallel job (DDP), one replica per rank. A world the other
 * sizes do not divide is left for the topology check to name.
 */
function withDerivedDp(sizes: Record<string, unknown>, world: number): Record<string, unknown> {
  if ('dp' in sizes) return sizes;
  const other = ['tp', 'cp', 'ep', 'pp'].reduce((product, name) => {
    const size = sizes[name];
    return product * (typeof size === 'number' && Number.isInteger(size) && size > 0 ? size : 1);
  }, 1);
  return world % other === 0 ? { ...sizes, dp: world / other } : sizes;
}

/** Number of data-parallel groups (replicas): the distinct DP coordinates of the topology. */
export function dataParallelGroups(topology: Topology): number {
  return new Set(topology.ranks.map((rank) => rank.coords.dp)).size;
}

/** Whether the job is doing useful work: ETTR counts productive time over wall time (ByteRobust §8.1.3). */
export const JOB_STATES = ['running', 'recovering', 'stopped', 'waiting_for_human', 'finished'] as const;
export type JobState = (typeof JOB_STATES)[number];

/**
 * The operator's per-job policy: `recovery: false` lets the ladder decide but refuses its acting
 * steps (each refusal audited with the reason); `dryRun: true` runs them against a backend that
 * records instead of acting, and records the launcher's argv instead of running it.
 */
export const jobPolicySchema = z.object({ recovery: z.boolean(), dryRun: z.boolean() }).strict();
export type JobPolicy = z.infer<typeof jobPolicySchema>;
export const DEFAULT_JOB_POLICY: JobPolicy = { recovery: true, dryRun: false };

/**
 * The nodes a job's eviction share (safety.maxJobEvictionPercent) is a share of: its nodes and,
 * for a hot-swap job, its spares, which it holds as much (a spare that fails a swap is evicted too).
 */
export function evictionShareSize(spec: Pick<JobSpec, 'nodes' | 'hotSwap'>): number {
  return spec.nodes.length + (spec.hotSwap?.spares.length ?? 0);
}
