import { z } from 'zod';
import { DIAGNOSE_PATH, diagnoseReportSchema, type DiagnoseReport, type DiagnoseRequest } from '../../core/diagnostics.js';
import { InputError, errorMessage } from '../../core/errors.js';
import { nodeNameSchema } from '../../core/names.js';
import { describeIssues, parseOrThrow } from '../../core/validate.js';
import { alignReferenceHashes, type AlignmentVerdict } from './alignment.js';

/**
 * Stop-time diagnosis, controller side (ByteRobust §4.2 Diagnose, §4.3): ask every node's agent
 * to run its checks (`POST /api/v1/diagnose`), then decide whom to evict from the answers.
 *
 * The verdict, in order:
 * - a check that failed or overran its own time limit names its node (§4.2: "the discovered
 *   suspected machines are evicted");
 * - a node whose reference-step hash differs from the known-good hash, or from the strict
 *   majority's, is an alignment outlier and is evicted (§4.3); no majority names nobody;
 * - an agent that does not answer at all is unreachable. It is evicted too: a machine that
 *   cannot even run its agent cannot be shown healthy, and ByteRobust prefers evicting a
 *   suspect to restarting onto it (§8, intentional over-eviction). Except when more than half
 *   of the agents are silent: that points at the controller's own network or configuration,
 *   not at that many machines at once, so nobody is evicted for silence and a note says why.
 * - an agent that answers without a usable report (401, 409 busy, 503 not configured, a report
 *   for another node) or whose checks did not complete is inconclusive: reported, not evicted.
 *
 * One call asks every given agent for the same checks (`checks`, or all it has). The hierarchy
 * of §4.2 (EUD first, then the all-to-all inside the machine, then the all-gather with
 * neighbours) is walked one call per stage by staged.ts, which the controller's
 * analysis worker uses: it stops at the first stage that names suspects and takes only the
 * nodes a stage cleared to the next.
 */

export interface FailedCheck {
  readonly node: string;
  readonly check: string;
  readonly reason: string;
}

export interface NodeProblem {
  readonly node: string;
  /** The check concerned, when the problem is one check's. */
  readonly check?: string;
  readonly reason: string;
}

/** What asking one agent came to. */
export type AgentOutcome =
  | { readonly node: string; readonly kind: 'report'; readonly report: DiagnoseReport }
  | { readonly node: string; readonly kind: 'unreachable'; readonly reason: string }
  /** The agent answered, but not with a report for this node. */
  | { readonly node: string; readonly kind: 'refused'; readonly status: number; readonly reason: string };

export interface DiagnosisSummary {
  readonly failed: FailedCheck[];
  /** Null when no node produced a reference hash. */
  readonly alignment: AlignmentVerdict | null;
  readonly alignmentOutliers: string[];
  readonly unreachable: NodeProblem[];
  readonly inconclusive: NodeProblem[];
  /** Nodes to evict, each once, in the order the nodes were given. */
  readonly evict: string[];
  /** Why something that could look like grounds for eviction was not. */
  readonly notes: string[];
}

export interface SummaryOptions {
  /** Known-good hash of the reference step's output; without it the strict majority decides. */
  readonly expectedHash?: string | undefined;
  /** Evict nodes whose agent does not answer (default true; see the module comment). */
  readonly evictUnreachable?: boolean | undefined;
}

/** Pure: the diagnosis verdict from every agent's outcome. */
export function summarizeDiagnostics(outcomes: readonly AgentOutcome[], options: SummaryOptions = {}): DiagnosisSummary {
  const failed: FailedCheck[] = [];
  const unreachable: NodeProblem[] = [];
  const inconclusive: NodeProblem[] = [];
  const notes: string[] = [];
  const hashes = new Map<string, string>();
  for (const outcome of outcomes) {
    if (outcome.kind === 'unreachable') {
      unreachable.push({ node: outcome.node, reason: outcome.reason });
      continue;
    }
    if (outcome.kind === 'refused') {
      inconclusive.push({ node: outcome.node, reason: outcome.reason });
      continue;
    }
    for (const check of outcome.report.checks) {
      const reason = check.reason ?? `result ${check.result}`;
      if (check.result === 'failed' || check.result === 'timed_out') failed.push({ node: outcome.node, check: check.name, reason });
      else if (check.result === 'incomplete') inconclusive.push({ node: outcome.node, check: check.name, reason });
    }
    if (outcome.report.referenceHash !== undefined) hashes.set(outcome.node, outcome.report.referenceHash);
  }

  const alignment = hashes.size === 0 ? null : alignReferenceHashes(hashes, { expectedHash: options.expectedHash });
  if (alignment !== null && !alignment.aligned) notes.push(`bit-wise alignment named nobody: ${alignment.reason}`);
  const alignmentOutliers = alignment?.outliers ?? [];

  const suspects = new Set<string>([...failed.map((entry) => entry.node), ...alignmentOutliers]);
  if (unreachable.length > 0) {
    if (options.evictUnreachable === false) {
      notes.push(`${unreachable.length} unreachable node(s) not evicted: eviction of unreachable nodes is turned off`);
    } else if (unreachable.length * 2 > outcomes.length) {
      notes.push(
        `${unreachable.length} of ${outcomes.length} agents did not answer; that many silent agents points at the controller's network or the agents' configuration rather than at the machines, so none is evicted for not answering`,
      );
    } else {
      for (const { node } of unreachable) suspects.add(node);
    }
  }
  const evict = outcomes.map((outcome) => outcome.node).filter((node) => suspects.has(node));
  return { failed, alignment, alignmentOutliers, unreachable, inconclusive, evict, notes };
}

export interface StopTimeDiagnosticsOptions extends SummaryOptions {
  /** Base URL of a node's agent, e.g. `(node) => \`http://${node}:9401\``. */
  readonly agentUrl: (node: string) => string;
  /** Bearer token for the agents' POST endpoints (one for all). */
  readonly token?: string | undefined;
  /** Bearer token for one node's agent (a token per node); takes precedence over `token`. */
  readonly tokenFor?: ((node: string) => string | undefined) | undefined;
  /** How long to wait for each agent; the agent is asked to finish a little earlier. */
  readonly timeoutSeconds: number;
  /** Checks to run, by name; every configured check when absent. */
  readonly checks?: readonly string[] | undefined;
  /** Peers of each node for the all-gather with neighbours; by default its neighbours in the list, as a ring. */
  readonly peers?: ((node: string, index: number, nodes: readonly string[]) => readonly string[]) | undefined;
  /**
   * Agents asked at once (default 1024). A multi-node check such as the neighbour all-gather
   * only works when every node runs it at the same time: keep this at least the node count.
   */
  readonly concurrency?: number | undefined;
  readonly fetch?: typeof fetch | undefined;
  /** Cancels every outstanding request; those agents count as unreachable. */
  readonly signal?: AbortSignal | undefined;
}

export interface StopTimeDiagnosis extends DiagnosisSummary {
  /** Every agent's outcome, in the order the nodes were given (for the audit trail). */
  readonly outcomes: AgentOutcome[];
}

const DEFAULT_CONCURRENCY = 1024;

const inputSchema = z.object({
  nodes: z.array(nodeNameSchema),
  timeoutSeconds: z
    .number()
    .positive()
    .max(24 * 3600),
  concurrency: z.number().int().min(1).optional(),
  checks: z.array(z.string()).min(1).optional(),
});

/**
 * The agent's own deadline: early enough that its answer, after killing a check that ignores
 * SIGTERM (5 s grace), still arrives before this side gives up.
 */
export function agentDeadlineSeconds(timeoutSeconds: number): number {
  return timeoutSeconds - Math.min(Math.max(10, timeoutSeconds * 0.05), timeoutSeconds / 2);
}

/** The node's neighbours in the list, taken as a ring: the one after, then the one before. */
export function ringNeighbours(node: string, index: number, nodes: readonly string[]): string[] {
  const around = [nodes[(index + 1) % nodes.length]!, nodes[(index - 1 + nodes.length) % nodes.length]!];
  return [...new Set(around)].filter((peer) => peer !== node);
}

/** Asks every node's agent to diagnose itself, then summarises. Never throws for an agent's failure. */
export async function runStopTimeDiagnostics(nodes: readonly string[], options: StopTimeDiagnosticsOptions): Promise<StopTimeDiagnosis> {
  parseOrThrow(
    inputSchema,
    { nodes, timeoutSeconds: options.timeoutSeconds, concurrency: options.concurrency, checks: options.checks },
    'stop-time diagnostics input',
  );
  const duplicate = nodes.find((node, index) => nodes.indexOf(node) !== index);
  if (duplicate !== undefined) throw new InputError(`node ${duplicate} is listed twice`, 'nodes');

  const peersOf = options.peers ?? ringNeighbours;
  const outcomes = new Array<AgentOutcome>(nodes.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < nodes.length) {
      const index = next;
      next += 1;
      const node = nodes[index]!;
      const body: DiagnoseRequest = {
        ...(options.checks === undefined ? {} : { checks: [...options.checks] }),
        timeoutSeconds: agentDeadlineSeconds(options.timeoutSeconds),
        peers: [...peersOf(node, index, nodes)],
      };
      outcomes[index] = await askAgent(node, body, options);
    }
  };
  const workers = Math.max(1, Math.min(options.concurrency ?? DEFAULT_CONCURRENCY, nodes.length));
  await Promise.all(Array.from({ length: workers }, worker));
  return { ...summarizeDiagnostics(outcomes, options), outcomes };
}

/** Cuts an agent's error text to a size fit for a reason. */
function shorten(text: string, limit = 300): string {
  const flat = text.replace(/\s+/g, ' ').trim();
  return flat.length > limit ? `${flat.slice(0, limit)}…` : flat;
}

async function askAgent(node: string, body: DiagnoseRequest, options: StopTimeDiagnosticsOptions): Promise<AgentOutcome> {
  const fetchImpl = options.fetch ?? fetch;
  const timeout = AbortSignal.timeout(options.timeoutSeconds * 1000);
  const signal = options.signal === undefined ? timeout : AbortSignal.any([timeout, options.signal]);
  let url: string;
  try {
    url = `${options.agentUrl(node).replace(/\/+$/, '')}${DIAGNOSE_PATH}`;
  } catch (error) {
    return { node, kind: 'unreachable', reason: `no agent URL for ${node}: ${errorMessage(error)}` };
  }
  if (!URL.canParse(url)) return { node, kind: 'unreachable', reason: `no valid agent URL for ${node}: ${url}` };
  const unreachable = (error: unknown): AgentOutcome => {
    if (timeout.aborted) return { node, kind: 'unreachable', reason: `agent at ${url} did not answer within ${options.timeoutSeconds} s` };
    if (options.signal?.aborted) return { node, kind: 'unreachable', reason: 'cancelled before the agent answered' };
    const cause = error instanceof Error && error.cause !== undefined ? ` (${errorMessage(error.cause)})` : '';
    return { node, kind: 'unreachable', reason: `cannot reach the agent at ${url}: ${errorMessage(error)}${cause}` };
  };
  let status: number;
  let text: string;
  try {
    const token = options.tokenFor?.(node) ?? options.token;
    const response = await fetchImpl(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(token === undefined ? {} : { authorization: `Bearer ${token}` }) },
      body: JSON.stringify(body),
      signal,
    });
    status = response.status;
    text = await response.text();
  } catch (error) {
    return unreachable(error);
  }
  let answer: unknown;
  try {
    answer = JSON.parse(text);
  } catch {
    return { node, kind: 'refused', status, reason: `agent answered ${status} with a body that is not JSON: ${shorten(text)}` };
  }
  if (status !== 200) {
    const said = z.object({ error: z.string() }).safeParse(answer);
    return { node, kind: 'refused', status, reason: `agent answered ${status}: ${said.success ? shorten(said.data.error) : shorten(text)}` };
  }
  const report = diagnoseReportSchema.safeParse(answer);
  if (!report.success)
    return { node, kind: 'refused', status, reason: `agent answered with an invalid report: ${shorten(describeIssues(report.error.issues))}` };
  if (report.data.node !== node) return { node, kind: 'refused', status, reason: `the agent at ${url} reports for node ${report.data.node}, not ${node}` };
  return { node, kind: 'report', report: report.data };
}
