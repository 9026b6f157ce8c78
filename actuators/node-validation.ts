import { z } from 'zod';
import { errorMessage } from '../core/errors.js';
import type { Keys, Redis } from '../core/redis.js';
import { describeIssues } from '../core/validate.js';
import { VALIDATE_PATH, nodeThroughput, validationReportSchema, type ValidationReport } from '../core/validation.js';
import type { ValidationConfig } from '../core/validation-config.js';

/**
 * Validation before a node is trusted again: every point where steadfast returns a node to
 * service (after its GPU reset, once it is back from a reboot, `steadfast resume` after a repair or
 * a hand-off) and the warm standby pool ask `validateNode` first. The node's agent runs its burn
 * and, where DCGM is installed, `dcgmi diag -r 2` (POST /api/v1/validate, core/validation.ts); here
 * the burn's throughput is also compared with the node's peers, so that a GPU that computes right
 * but slowly does not come back as a straggler (ByteRobust §6.2: standbys self-checked before they
 * stand in; a slow machine holds back every step of a synchronous job, §5).
 */

/** The verdict on one node. `failed` names the check that failed (burn, dcgm, throughput, agent). */
export interface NodeValidation {
  readonly ok: boolean;
  readonly failed?: string | undefined;
  /** A sentence: what passed and how long it took, or what failed and why. */
  readonly detail: string;
  readonly seconds: number;
  readonly report?: ValidationReport | undefined;
}

export interface NodeValidator {
  validate(node: string): Promise<NodeValidation>;
  /** The longest one validation may take, so that a step holding the node's lease keeps it that long. */
  readonly maxSeconds?: number;
}

/** What the validator needs of the agents (the controller's AgentDirectory): where each node's agent is and its token. */
export interface AgentEndpoints {
  urls(nodes: readonly string[]): Promise<Map<string, string>>;
  tokenFor(node: string): string | undefined;
}

/** Whether a node is slow against its peers; pure, so the rule is tested without Redis. */
export function judgeThroughput(
  own: number,
  peers: readonly number[],
  options: Pick<ValidationConfig, 'minPeers' | 'minPeerFraction'>,
): { slow: boolean; median?: number } {
  // With too few peers a median says little: only the reference comparison decides.
  if (peers.length < options.minPeers) return { slow: false };
  const sorted = [...peers].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  const median = sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
  return { slow: own < options.minPeerFraction * median, median };
}

const sampleSchema = z.object({ model: z.string(), tflops: z.number(), at: z.number() });
type Sample = z.infer<typeof sampleSchema>;

/**
 * Recent burn throughputs per node in Redis: the latest of each node in one hash (the peers), and
 * a short list per node (its own history, `historyPerNode` long), so both stay bounded.
 */
export class PeerThroughputs {
  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly historyPerNode: number,
  ) {}

  private get latestKey(): string {
    return this.keys.validationThroughput;
  }

  historyKey(node: string): string {
    return this.keys.validationThroughputOf(node);
  }

  async record(node: string, sample: Sample): Promise<void> {
    const text = JSON.stringify(sample);
    await this.redis
      .multi()
      .hset(this.latestKey, node, text)
      .lpush(this.historyKey(node), text)
      .ltrim(this.historyKey(node), 0, this.historyPerNode - 1)
      .exec();
  }

  /** The latest throughput of every other node with the same device model, validated since `since` (ms). */
  async peers(node: string, model: string, since: number): Promise<number[]> {
    const all = await this.redis.hgetall(this.latestKey);
    return Object.entries(all).flatMap(([peer, text]) => {
      if (peer === node) return [];
      const sample = sampleSchema.safeParse(safeJson(text));
      return sample.success && sample.data.model === model && sample.data.at >= since ? [sample.data.tflops] : [];
    });
  }

  async history(node: string): Promise<Sample[]> {
    return (await this.redis.lrange(this.historyKey(node), 0, -1)).flatMap((text) => {
      const sample = sampleSchema.safeParse(safeJson(text));
      return sample.success ? [sample.data] : [];
    });
  }
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** Each check's result and seconds, and why where it did not pass: `burn passed in 17.2 s, dcgm skipped in 0.1 s (DCGM is not installed here: …)`. */
export function describeChecks(report: ValidationReport): string {
  return report.checks
    .map((check) => `${check.name} ${check.result} in ${check.seconds.toFixed(1)} s${check.reason === undefined ? '' : ` (${check.reason})`}`)
    .join(', ');
}

/**
 * Validates a node through its agent (POST /api/v1/validate with the node's own token), then
 * judges its burn throughput against its peers'. Never throws for the agent's answer: an agent
 * that cannot be reached or answers nonsense fails the node (`failed: agent`), as a node that
 * cannot show it is sound is not trusted.
 */
export class AgentNodeValidator implements NodeValidator {
  constructor(
    private readonly agents: AgentEndpoints,
    private readonly throughputs: PeerThroughputs,
    private readonly config: ValidationConfig,
    private readonly fetchImpl: typeof fetch = fetch,
    private readonly clock: () => number = Date.now,
  ) {}

  /** The agent's own bound, and the request's 15 s on top of it. */
  get maxSeconds(): number {
    return this.config.timeoutSeconds + 15;
  }

  async validate(node: string): Promise<NodeValidation> {
    const started = this.clock();
    const seconds = () => (this.clock() - started) / 1000;
    const failed = (detail: string): NodeValidation => ({ ok: false, failed: 'agent', detail, seconds: seconds() });
    const url = (await this.agents.urls([node])).get(node);
    if (url === undefined) return failed(`no agent URL for ${node}`);
    let report: ValidationReport;
    try {
      const token = this.agents.tokenFor(node);
      const response = await this.fetchImpl(`${url}${VALIDATE_PATH}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(token === undefined ? {} : { authorization: `Bearer ${token}` }) },
        body: JSON.stringify({ dcgm: this.config.dcgm, burnSeconds: this.config.burnSeconds, timeoutSeconds: this.config.timeoutSeconds }),
        // The agent bounds the checks itself; allow it a little longer to answer.
        signal: AbortSignal.timeout((this.config.timeoutSeconds + 15) * 1000),
      });
      const body = (await response.json().catch(() => ({}))) as unknown;
      if (!response.ok) return failed(`its agent answered HTTP ${response.status}: ${JSON.stringify(body).slice(0, 300)}`);
      const parsed = validationReportSchema.safeParse(body);
      if (!parsed.success) return failed(`its agent's answer is not a validation report: ${describeIssues(parsed.error.issues)}`);
      if (parsed.data.node !== node) return failed(`its agent answered for ${parsed.data.node}`);
      report = parsed.data;
    } catch (error) {
      return failed(`its agent at ${url} could not be reached (${errorMessage(error)})`);
    }
    const checks = describeChecks(report);
    const failing = report.checks.find((check) => !check.ok);
    if (failing !== undefined) return { ok: false, failed: failing.name, detail: checks, seconds: seconds(), report };
    const throughput = nodeThroughput(report.devices ?? []);
    if (throughput === undefined) return { ok: true, detail: checks, seconds: seconds(), report };
    const now = this.clock();
    const peers = await this.throughputs.peers(node, throughput.model, now - this.config.peerWindowSeconds * 1000);
    await this.throughputs.record(node, { model: throughput.model, tflops: throughput.tflops, at: now });
    const judged = judgeThroughput(throughput.tflops, peers, this.config);
    const rate = `${formatTflops(throughput.tflops)} TFLOPS`;
    if (judged.median === undefined)
      return { ok: true, detail: `${checks}; burn ${rate} (${peers.length} peers: too few to compare)`, seconds: seconds(), report };
    const against = `${peers.length} peers' median ${formatTflops(judged.median)} TFLOPS`;
    if (judged.slow)
      return {
        ok: false,
        failed: 'throughput',
        detail: `${checks}; burn ${rate} is below ${this.config.minPeerFraction} of its ${against}`,
        seconds: seconds(),
        report,
      };
    return { ok: true, detail: `${checks}; burn ${rate} against its ${against}`, seconds: seconds(), report };
  }
}

function formatTflops(value: number): string {
  return value >= 10 ? value.toFixed(1) : value.toPrecision(3);
}

/** Dry-run: no agent is asked; the node passes. */
export class DryRunNodeValidator implements NodeValidator {
  async validate(): Promise<NodeValidation> {
    return { ok: true, detail: 'dry-run: no agent was asked to validate', seconds: 0 };
  }
}

/** The one sentence a drained node's reason and the audit give for a failed validation. */
export function validationFailure(verdict: NodeValidation): string {
  return `validation failed (${verdict.failed ?? 'unknown'}): ${verdict.detail}`.slice(0, 1000);
}

/** The validator a controller or `steadfast resume` builds from the `validation:` section. */
export function validatorFromConfig(config: ValidationConfig, agents: AgentEndpoints, redis: Redis, keys: Keys): NodeValidator {
  return new AgentNodeValidator(agents, new PeerThroughputs(redis, keys, config.historyPerNode), config);
}
