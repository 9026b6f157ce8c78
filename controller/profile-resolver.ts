import type { ClusterBackend } from '../actuators/backend.js';
import { InputError, RetryLaterError, errorMessage } from '../core/errors.js';
import type { Logger } from '../core/log.js';
import { matchProfile, profileRemedies, profileXidLayer, type NodeProfiles, type Profile, type ProfileMatch } from '../core/profiles.js';
import type { RemediesConfig } from '../core/remedy-config.js';
import type { PolicyLayer } from '../core/xid-policy.js';

/** How often the nodes of the profiles' partitions are read again (as for maintenance windows by partition). */
const PARTITION_REFRESH_MS = 60_000;
/** How soon a failed read of the partitions is tried again. */
const FAILED_READ_RETRY_MS = 5000;
/** How long a node's labels are trusted: a relabelled node moves profile within this. */
const LABELS_TTL_MS = 30_000;
/** Nodes whose labels are kept at once; past it the oldest reads are dropped (and read again when needed). */
const MAX_LABELLED_NODES = 100_000;

/** How the resolver reads what decides a node's profile: the backend's partitionNodes and nodeLabels. */
export interface ProfileReads {
  readonly partitionNodes?: ((partition: string) => Promise<string[]>) | undefined;
  readonly nodeLabels?: ((node: string) => Promise<Readonly<Record<string, string>>>) | undefined;
}

export interface ProfileResolverOptions {
  readonly logger?: Logger | undefined;
  readonly now?: () => number;
  readonly partitionRefreshMs?: number;
  readonly labelsTtlMs?: number;
}

/**
 * Answers, for a node, its profile (config `profiles:`), none, or a conflict naming every profile
 * that matches it. Names are matched at once; Slurm partitions through the scheduler, all of them
 * at most once a minute (a node moved between partitions changes profile within that); Kubernetes
 * labels through the API server, per node, trusted for 30 s. A read that fails keeps what was
 * read before and is logged; with nothing read before, the answer is a RetryLaterError, never a
 * guess: a node of a dry-run profile must not be acted on for real because a read failed.
 */
export class ProfileResolver implements NodeProfiles {
  private readonly partitions = new Map<string, ReadonlySet<string>>();
  private partitionsReadAt = Number.NEGATIVE_INFINITY;
  private partitionsRead: Promise<void> | undefined;
  private readonly labels = new Map<string, { readonly labels: Readonly<Record<string, string>>; readonly at: number }>();
  private readonly byPartition: boolean;
  private readonly byLabel: boolean;
  private readonly now: () => number;

  constructor(
    readonly profiles: readonly Profile[],
    private readonly reads: ProfileReads,
    private readonly options: ProfileResolverOptions = {},
  ) {
    this.now = options.now ?? Date.now;
    const partitioned = profiles.findIndex((profile) => profile.match.partitions !== undefined);
    const labelled = profiles.findIndex((profile) => profile.match.nodeLabels !== undefined);
    if (partitioned >= 0 && reads.partitionNodes === undefined)
      throw new InputError(
        `profiles.${partitioned}.match.partitions: profile "${profiles[partitioned]?.name}" names Slurm partitions, which only the Slurm backend knows; name the nodes instead`,
        `profiles.${partitioned}.match.partitions`,
      );
    if (labelled >= 0 && reads.nodeLabels === undefined)
      throw new InputError(
        `profiles.${labelled}.match.nodeLabels: profile "${profiles[labelled]?.name}" matches Kubernetes node labels, which only the Kubernetes backend reads; name the nodes instead`,
        `profiles.${labelled}.match.nodeLabels`,
      );
    this.byPartition = partitioned >= 0;
    this.byLabel = labelled >= 0;
  }

  async resolve(node: string): Promise<ProfileMatch> {
    const [partitions, labels] = await Promise.all([this.partitionsOf(node), this.labelsOf(node)]);
    return matchProfile(this.profiles, node, { partitions, labels });
  }

  /** The node's remedies: the global `remedies:` with its profile's switches over them (a conflict or no profile: the global ones). */
  async remediesFor(node: string, base: RemediesConfig): Promise<RemediesConfig> {
    const match = await this.resolve(node);
    return match.kind === 'profile' ? profileRemedies(base, match.profile) : base;
  }

  /** The Xid policy layer of the node's profile, if it sets one (a conflict or no profile: none). */
  async xidLayerFor(node: string): Promise<PolicyLayer | undefined> {
    const match = await this.resolve(node);
    return match.kind === 'profile' ? profileXidLayer(match.profile) : undefined;
  }

  /**
   * For the startup log: each profile and how many nodes its names and partitions cover now
   * (label matches are only known per node, as nodes are seen). A read that fails says so.
   */
  async describe(): Promise<{ readonly name: string; readonly nodes: number; readonly byLabels: boolean; readonly unread?: string }[]> {
    let unread: string | undefined;
    try {
      await this.refreshPartitions();
    } catch (error) {
      unread = errorMessage(error);
    }
    return this.profiles.map((profile) => {
      const nodes = new Set(profile.match.nodes ?? []);
      for (const partition of profile.match.partitions ?? []) for (const node of this.partitions.get(partition) ?? []) nodes.add(node);
      return { name: profile.name, nodes: nodes.size, byLabels: profile.match.nodeLabels !== undefined, ...(unread ? { unread } : {}) };
    });
  }

  /** Logs each profile and the nodes it covers now, once the partitions are read (in the background: startup does not wait on the scheduler). */
  logMatches(logger: Logger): void {
    this.describe().then(
      (profiles) => logger.info({ profiles }, `${profiles.length} node profile(s) configured`),
      (error: unknown) => logger.warn({ err: error }, 'could not describe the node profiles'),
    );
  }

  private async partitionsOf(node: string): Promise<ReadonlySet<string> | undefined> {
    if (!this.byPartition) return undefined;
    await this.refreshPartitions();
    return new Set([...this.partitions].filter(([, nodes]) => nodes.has(node)).map(([partition]) => partition));
  }

  /** Reads every partition the profiles name, once per refresh interval; concurrent callers share one read. */
  private async refreshPartitions(): Promise<void> {
    if (!this.byPartition) return;
    if (this.now() - this.partitionsReadAt >= (this.options.partitionRefreshMs ?? PARTITION_REFRESH_MS) && this.partitionsRead === undefined) {
      this.partitionsRead = this.readPartitions().finally(() => (this.partitionsRead = undefined));
    }
    if (this.partitionsRead !== undefined) await this.partitionsRead;
    const missing = this.partitionNames().filter((partition) => !this.partitions.has(partition));
    if (missing.length > 0) throw new RetryLaterError(`cannot tell which nodes profiles' partitions ${missing.join(', ')} hold: not read yet`);
  }

  private async readPartitions(): Promise<void> {
    const read = this.reads.partitionNodes;
    if (read === undefined) return;
    let failed = false;
    for (const partition of this.partitionNames()) {
      try {
        const nodes = await read(partition);
        if (nodes.length === 0) this.options.logger?.warn({ partition }, 'a profile names a partition with no nodes (or one the scheduler does not know)');
        this.partitions.set(partition, new Set(nodes));
      } catch (error) {
        failed = true;
        this.options.logger?.warn({ partition, err: error }, "could not read the nodes of a profile's partition; keeping the last list");
      }
    }
    // A failed read is tried again a few seconds later, not a minute later (and not on every question).
    const refreshMs = this.options.partitionRefreshMs ?? PARTITION_REFRESH_MS;
    this.partitionsReadAt = failed ? this.now() - refreshMs + Math.min(refreshMs, FAILED_READ_RETRY_MS) : this.now();
  }

  private partitionNames(): string[] {
    return [...new Set(this.profiles.flatMap((profile) => profile.match.partitions ?? []))];
  }

  private async labelsOf(node: string): Promise<Readonly<Record<string, string>> | undefined> {
    const read = this.reads.nodeLabels;
    if (!this.byLabel || read === undefined) return undefined;
    const known = this.labels.get(node);
    const now = this.now();
    if (known !== undefined && now - known.at < (this.options.labelsTtlMs ?? LABELS_TTL_MS)) return known.labels;
    try {
      const labels = await read(node);
      this.labels.delete(node);
      if (this.labels.size >= MAX_LABELLED_NODES) this.labels.delete(this.labels.keys().next().value ?? '');
      this.labels.set(node, { labels, at: now });
      return labels;
    } catch (error) {
      if (known !== undefined) {
        this.options.logger?.warn({ node, err: error }, "could not read the node's labels; matching profiles on the last ones read");
        return known.labels;
      }
      throw new RetryLaterError(`cannot tell node ${node}'s profile: its labels could not be read: ${errorMessage(error)}`, error);
    }
  }
}

/** The resolver for the configured profiles, or undefined when there are none; a profile the backend cannot match is an InputError naming its key. */
export function profileResolverFor(
  profiles: readonly Profile[],
  backend: Pick<ClusterBackend, 'partitionNodes' | 'nodeLabels'>,
  logger?: Logger,
): ProfileResolver | undefined {
  if (profiles.length === 0) return undefined;
  return new ProfileResolver(profiles, { partitionNodes: backend.partitionNodes?.bind(backend), nodeLabels: backend.nodeLabels?.bind(backend) }, { logger });
}
