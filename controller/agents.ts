import { z } from 'zod';
import { resolveToken, type Config } from '../core/config.js';
import { readSecret } from '../core/auth-config.js';
import { AGENT_SECRET_MIN_LENGTH, agentTokenFor } from '../core/credentials.js';
import { errorMessage } from '../core/errors.js';
import { describeIssues } from '../core/validate.js';
import { GPU_RESET_PATH, gpuResetReportSchema, type GpuResetReport } from '../core/remedy.js';
import type { GpuResetter } from '../actuators/steps/gpu-resetter.js';

/**
 * How the controller reaches node agents: their URL (a template, overridden per node) and the
 * bearer token their POST endpoints require, derived per node from agents.secretFile (or one
 * shared token). Used for stack dumps on hangs (ByteRobust §5) and stop-time diagnostics (§4.2).
 */
export class AgentDirectory {
  private readonly token: string | undefined;
  private readonly secret: string | undefined;

  constructor(
    private readonly config: Config['agents'],
    /** Whether the cluster backend knows the node (ClusterBackend.nodeState): only its agent is contacted. */
    private readonly knows: (node: string) => Promise<boolean>,
  ) {
    this.token = config.token !== undefined || config.tokenFile !== undefined ? resolveToken(config, 'agents') : undefined;
    this.secret = config.secretFile === undefined ? undefined : readSecret(undefined, config.secretFile, 'agents.secretFile', AGENT_SECRET_MIN_LENGTH);
  }

  /** The bearer token `node`'s agent requires on its POST endpoints; none when agents run open. */
  tokenFor(node: string): string | undefined {
    return this.secret === undefined ? this.token : agentTokenFor(this.secret, node);
  }

  /**
   * The agent URLs of those of `nodes` the backend knows; a node it does not know gets none, so
   * a name that reached the controller from outside never becomes a URL the controller calls.
   */
  async urls(nodes: readonly string[]): Promise<Map<string, string>> {
    const known = await Promise.all(nodes.map(async (node) => ({ node, known: await this.knows(node).catch(() => false) })));
    return new Map(
      known
        .filter((entry) => entry.known)
        .map(({ node }) => [node, (this.config.urls[node] ?? this.config.urlTemplate.replaceAll('{node}', node)).replace(/\/+$/, '')] as const),
    );
  }

  get traceTimeoutSeconds(): number {
    return this.config.traceTimeoutSeconds;
  }

  get diagnoseTimeoutSeconds(): number {
    return this.config.diagnoseTimeoutSeconds;
  }

  /** py-spy dumps of the training processes on `nodes` (traceNodes): what stack aggregation reads (analyzers/workers/analysis.ts). */
  trace(nodes: readonly string[]): Promise<NodeTrace[]> {
    return traceNodes(this, nodes);
  }
}

function authorization(token: string | undefined): Record<string, string> {
  return token === undefined ? {} : { authorization: `Bearer ${token}` };
}

const traceAnswerSchema = z.object({
  node: z.string(),
  capturedAt: z.string(),
  dumps: z.array(
    z.union([
      z.object({ pid: z.number(), role: z.string(), rank: z.number().int().min(0).nullable(), ok: z.literal(true), dump: z.string() }).loose(),
      z.object({ pid: z.number(), role: z.string(), rank: z.number().int().min(0).nullable(), ok: z.literal(false), error: z.string() }).loose(),
    ]),
  ),
  flightRecorder: z.array(z.unknown()).default([]),
});

export interface NodeTrace {
  readonly node: string;
  /** py-spy output per global rank: its own process and its workers (which carry its rank), one dump after another. */
  readonly byRank: ReadonlyMap<number, string>;
  /** Dumps the agent took but could not tie to a rank. */
  readonly unranked: number;
  readonly error?: string | undefined;
}

/**
 * Asks each node's agent for py-spy dumps of its training processes (POST /api/v1/trace), all
 * nodes at once. An agent that fails or times out yields an error entry, never an exception:
 * its ranks then count as missing, which stack aggregation treats as suspicious.
 */
export async function traceNodes(agents: AgentDirectory, nodes: readonly string[], fetchImpl: typeof fetch = fetch): Promise<NodeTrace[]> {
  const timeoutSeconds = agents.traceTimeoutSeconds;
  const urls = await agents.urls(nodes);
  return Promise.all(
    nodes.map(async (node): Promise<NodeTrace> => {
      const url = urls.get(node);
      if (url === undefined) return { node, byRank: new Map(), unranked: 0, error: 'not a node the backend knows; its agent is not contacted' };
      try {
        const response = await fetchImpl(`${url}/api/v1/trace`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...authorization(agents.tokenFor(node)) },
          body: JSON.stringify({ timeoutSeconds }),
          // The agent enforces the limit per process; allow it a little longer to answer.
          signal: AbortSignal.timeout((timeoutSeconds + 5) * 1000),
        });
        const body = (await response.json().catch(() => ({}))) as unknown;
        if (!response.ok)
          return { node, byRank: new Map(), unranked: 0, error: `agent answered HTTP ${response.status}: ${JSON.stringify(body).slice(0, 200)}` };
        const parsed = traceAnswerSchema.safeParse(body);
        if (!parsed.success) return { node, byRank: new Map(), unranked: 0, error: `agent answer is not a trace: ${describeIssues(parsed.error.issues)}` };
        const byRank = new Map<number, string>();
        let unranked = 0;
        for (const dump of parsed.data.dumps) {
          if (!dump.ok) continue;
          if (dump.rank === null) {
            unranked += 1;
            continue;
          }
          byRank.set(dump.rank, `${byRank.get(dump.rank) ?? ''}${dump.dump}\n`);
        }
        return { node, byRank, unranked };
      } catch (error) {
        return { node, byRank: new Map(), unranked: 0, error: errorMessage(error) };
      }
    }),
  );
}

/**
 * Resets one GPU through its node's agent (POST /api/v1/gpu-reset, core/remedy.ts), with that
 * node's own token. Only a node the backend knows is contacted. Never throws for the agent's
 * answer: a failure is a `failed` report, which the reset_gpu step turns into a drain or an eviction.
 */
export class AgentGpuResetter implements GpuResetter {
  constructor(
    private readonly agents: AgentDirectory,
    private readonly fetchImpl: typeof fetch = fetch,
  ) {}

  async reset(node: string, gpu: string, timeoutSeconds: number): Promise<GpuResetReport> {
    const failed = (reason: string): GpuResetReport => ({ node, gpu, index: null, outcome: 'failed', processes: [], stopped: [], reason, seconds: 0 });
    const url = (await this.agents.urls([node])).get(node);
    if (url === undefined) return failed('not a node the backend knows; its agent is not contacted');
    try {
      const response = await this.fetchImpl(`${url}${GPU_RESET_PATH}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...authorization(this.agents.tokenFor(node)) },
        body: JSON.stringify({ gpu, timeoutSeconds }),
        // The agent bounds the reset itself; allow it a little longer to answer.
        signal: AbortSignal.timeout((timeoutSeconds + 15) * 1000),
      });
      const body = (await response.json().catch(() => ({}))) as unknown;
      const parsed = gpuResetReportSchema.safeParse(body);
      // A refusal (409) and a failure (500) still carry a report.
      if (parsed.success && parsed.data.node === node && parsed.data.gpu === gpu) return parsed.data;
      if (!response.ok) return failed(`agent answered HTTP ${response.status}: ${JSON.stringify(body).slice(0, 200)}`);
      return failed(parsed.success ? 'agent answered for another node or GPU' : `agent answer is not a reset report: ${describeIssues(parsed.error.issues)}`);
    } catch (error) {
      return failed(errorMessage(error));
    }
  }
}
