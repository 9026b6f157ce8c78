import { performance } from 'node:perf_hooks';
import { Counter, type Registry } from 'prom-client';
import { GPU_RESET_PATH, gpuResetRequestSchema, type GpuResetReport } from '../../core/remedy.js';
import { describeIssues } from '../../core/validate.js';
import { runBoundedCommand, type BoundedCommandResult } from '../bounded-command.js';
import type { AgentRequest, AgentResponse, Collector, CollectorContext, CollectorFactory } from '../collector.js';
import { readFlag } from '../flags.js';

/**
 * The `gpu-reset` collector: `POST /api/v1/gpu-reset` resets one GPU of this node for the
 * controller's reset rung (docs/remedies.md). The request names the GPU by PCI bus id; the agent
 * finds its index itself and runs exactly `<nvidia-smi> --gpu-reset -i <index>`, with the binary
 * from its own `--nvidia-smi.path`, never from the request. It refuses (409) while processes hold
 * the GPU, while persistence mode is on (the persistence daemon holds the device open), or when
 * nvidia-smi does not list the GPU; after a reset it checks that the GPU is listed again without
 * an error in its fields. One reset at a time. Off by default: it needs root and the agent's token.
 */

export const GPU_RESET_TIMEOUT_FLAG = 'gpu-reset.timeout-seconds';
export const GPU_RESET_STOP_GRACE_FLAG = 'gpu-reset.stop-grace-seconds';
/** How often the GPU's processes are listed again while they are being stopped. */
const STOP_POLL_MS = 200;
/** How long processes sent SIGKILL may take to leave the GPU. */
const KILL_WAIT_MS = 3000;
const DEFAULT_TIMEOUT_SECONDS = 120;
const TIMEOUT_SECONDS = { type: 'number', whole: true, unit: 'seconds', min: 1, max: 600 } as const;
const STOP_GRACE_SECONDS = { type: 'number', whole: true, unit: 'seconds', min: 0, max: 300 } as const;
const QUERY_LIMIT_MS = 20_000;
const KILL_GRACE_MS = 5000;

interface ListedGpu {
  readonly index: number;
  /** `dddd:bb:dd`, lower case, as signals name GPUs. */
  readonly pciBusId: string;
  readonly persistence: string;
  /** The raw line, for the error markers nvidia-smi prints in a GPU's fields. */
  readonly line: string;
}

/** nvidia-smi prints `00000000:18:00.0`; signals carry `0000:18:00`. */
export function shortPciBusId(full: string): string | undefined {
  const match = /^(?:[0-9a-fA-F]{4})?([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?$/.exec(full.trim());
  return match ? `${match[1]}:${match[2]}:${match[3]}`.toLowerCase() : undefined;
}

/** Markers nvidia-smi puts in place of a value when a GPU is in trouble. */
const ERROR_MARKERS = /requires reset|ERR!|Unknown Error|GPU is lost/i;

class GpuResetCollector implements Collector {
  readonly name = 'gpu-reset';
  readonly routes;
  private readonly resets: Counter<'outcome'>;
  private busy = false;

  constructor(
    private readonly context: CollectorContext,
    private readonly defaultTimeoutSeconds: number,
    /** Seconds between SIGTERM and SIGKILL for the processes on the GPU; 0: refuse while any hold it. */
    private readonly stopGraceSeconds: number,
  ) {
    const registers: Registry[] = [context.registry];
    this.resets = new Counter({
      name: 'steadfast_gpu_resets_total',
      help: 'GPU resets asked of this agent, by outcome (reset, refused, failed).',
      labelNames: ['outcome'],
      registers,
    });
    this.routes = [{ method: 'POST' as const, path: GPU_RESET_PATH, handle: (request: AgentRequest) => this.handle(request) }];
  }

  async start(): Promise<void> {}
  async update(): Promise<void> {}
  async close(): Promise<void> {}

  private run(args: readonly string[], limitMs: number): Promise<BoundedCommandResult> {
    return runBoundedCommand({ argv: [this.context.paths.nvidiaSmi, ...args], limitMs, killGraceMs: KILL_GRACE_MS, env: process.env, tailBytes: 8192 });
  }

  private async listGpus(): Promise<ListedGpu[] | string> {
    const result = await this.run(['--query-gpu=index,pci.bus_id,persistence_mode', '--format=csv,noheader'], QUERY_LIMIT_MS);
    if (result.exitCode !== 0) return `nvidia-smi could not list the GPUs: ${result.spawnError ?? lastLine(result.outputTail)}`;
    return result.outputTail
      .split('\n')
      .map((line) => line.split(',').map((field) => field.trim()))
      .flatMap((fields): ListedGpu[] => {
        const index = Number(fields[0]);
        const pciBusId = shortPciBusId(fields[1] ?? '');
        return Number.isInteger(index) && index >= 0 && index < 64 && pciBusId
          ? [{ index, pciBusId, persistence: fields[2] ?? '', line: fields.join(', ') }]
          : [];
      });
  }

  private async holders(pciBusId: string): Promise<number[] | string> {
    const result = await this.run(['--query-compute-apps=pid,gpu_bus_id', '--format=csv,noheader'], QUERY_LIMIT_MS);
    if (result.exitCode !== 0) return `nvidia-smi could not list the GPU's processes: ${result.spawnError ?? lastLine(result.outputTail)}`;
    return result.outputTail
      .split('\n')
      .map((line) => line.split(',').map((field) => field.trim()))
      .filter((fields) => shortPciBusId(fields[1] ?? '') === pciBusId && /^\d+$/.test(fields[0] ?? ''))
      .map((fields) => Number(fields[0]));
  }

  /** Stops the processes on `pciBusId` (signalListed); what is still listed afterwards, or why it could not be listed. */
  private async stopHolders(pciBusId: string): Promise<number[] | string> {
    const waitUntilGone = async (limitMs: number): Promise<number[] | string> => {
      const deadline = performance.now() + limitMs;
      for (;;) {
        const listed = await this.holders(pciBusId);
        if (typeof listed === 'string' || listed.length === 0 || performance.now() >= deadline) return listed;
        await new Promise((resolve) => setTimeout(resolve, STOP_POLL_MS));
      }
    };
    const first = await this.holders(pciBusId);
    if (typeof first === 'string') return first;
    this.context.logger.warn({ gpu: pciBusId, pids: first }, 'stopping the processes on a GPU before its reset');
    await signalListed(first, 'SIGTERM');
    const left = await waitUntilGone(this.stopGraceSeconds * 1000);
    if (typeof left === 'string' || left.length === 0) return left;
    await signalListed(left, 'SIGKILL');
    return waitUntilGone(KILL_WAIT_MS);
  }

  private async handle(request: AgentRequest): Promise<AgentResponse> {
    const parsed = gpuResetRequestSchema.safeParse(request.body ?? {});
    if (!parsed.success) return { status: 400, body: { error: `invalid gpu-reset request: ${describeIssues(parsed.error.issues)}` } };
    if (this.busy) return { status: 409, body: { error: 'a GPU reset is already under way on this node; ask again when it is done' } };
    this.busy = true;
    try {
      const report = await this.reset(parsed.data.gpu, (parsed.data.timeoutSeconds ?? this.defaultTimeoutSeconds) * 1000);
      this.resets.inc({ outcome: report.outcome });
      this.context.logger.info({ gpu: report.gpu, index: report.index, outcome: report.outcome, reason: report.reason }, 'GPU reset asked');
      return { status: report.outcome === 'reset' ? 200 : report.outcome === 'refused' ? 409 : 500, body: report };
    } finally {
      this.busy = false;
    }
  }

  private async reset(gpu: string, limitMs: number): Promise<GpuResetReport> {
    const started = performance.now();
    let stopped: number[] = [];
    const report = (outcome: GpuResetReport['outcome'], reason: string, index: number | null, processes: number[] = []): GpuResetReport => ({
      node: this.context.node,
      gpu,
      index,
      outcome,
      processes,
      stopped,
      reason: stopped.length > 0 ? `stopped processes ${stopped.join(', ')} on GPU ${index ?? gpu}; ${reason}` : reason,
      seconds: (performance.now() - started) / 1000,
    });
    const listed = await this.listGpus();
    if (typeof listed === 'string') return report('failed', listed, null);
    const target = listed.find((candidate) => candidate.pciBusId === gpu);
    if (!target) return report('refused', `nvidia-smi does not list GPU ${gpu}: a reset cannot reach it (the node needs a reboot)`, null);
    if (/^enabled$/i.test(target.persistence))
      return report('refused', `persistence mode is on for GPU ${target.index}: the persistence daemon holds it open`, target.index);
    let holders = await this.holders(gpu);
    if (typeof holders === 'string') return report('failed', holders, target.index);
    if (holders.length > 0 && this.stopGraceSeconds > 0) {
      const before = holders;
      holders = await this.stopHolders(gpu);
      if (typeof holders === 'string') return report('failed', holders, target.index);
      const left = new Set(holders);
      stopped = before.filter((pid) => !left.has(pid));
    }
    if (holders.length > 0) return report('refused', `processes ${holders.join(', ')} still use GPU ${target.index}`, target.index, holders);
    // The index is one nvidia-smi itself printed, a small integer: nothing from the request reaches the command line.
    const reset = await this.run(['--gpu-reset', '-i', String(target.index)], limitMs);
    if (reset.exitCode !== 0) {
      const why = reset.stoppedBy === 'limit' ? `did not finish within ${limitMs / 1000} s` : (reset.spawnError ?? lastLine(reset.outputTail));
      return report('failed', `nvidia-smi --gpu-reset -i ${target.index} failed: ${why}`, target.index);
    }
    const after = await this.listGpus();
    if (typeof after === 'string') return report('failed', `after the reset, ${after}`, target.index);
    const back = after.find((candidate) => candidate.pciBusId === gpu);
    if (!back) return report('failed', `GPU ${gpu} is not listed after the reset`, target.index);
    if (ERROR_MARKERS.test(back.line)) return report('failed', `GPU ${back.index} still reports an error after the reset (${back.line})`, back.index);
    return report('reset', `GPU ${back.index} reset and listed again`, back.index);
  }
}

/**
 * Stops what nvidia-smi lists on one GPU: SIGTERM, then SIGKILL for what is still listed after the
 * grace period. Every signal goes to a pid nvidia-smi listed on that GPU in the query just before
 * it — never any other process, never init or the agent itself. Returns what is still listed.
 */
async function signalListed(pids: readonly number[], signal: NodeJS.Signals): Promise<void> {
  for (const pid of pids) {
    if (pid <= 1 || pid === process.pid) continue;
    try {
      process.kill(pid, signal);
    } catch {
      // Gone already, or not ours to signal (then it stays listed and the reset is refused).
    }
  }
}

function lastLine(text: string): string {
  return text.trim().split('\n').at(-1)?.slice(0, 300) ?? '';
}

export const gpuResetCollectorFactory: CollectorFactory = {
  name: 'gpu-reset',
  defaultEnabled: false,
  help: "POST /api/v1/gpu-reset: reset one idle GPU (nvidia-smi --gpu-reset) for the controller's reset rung; needs root and the agent's token.",
  flags: [
    { name: GPU_RESET_TIMEOUT_FLAG, value: '<seconds>', description: 'longest one GPU reset may take', default: String(DEFAULT_TIMEOUT_SECONDS) },
    {
      name: GPU_RESET_STOP_GRACE_FLAG,
      value: '<seconds>',
      description:
        "stop the processes nvidia-smi lists on the GPU to be reset (SIGTERM, then SIGKILL after this many seconds) instead of refusing the reset; 0 refuses while any hold it; needs CAP_KILL for other users' processes",
      default: '0',
    },
  ],
  create(context) {
    const seconds = readFlag(context.settings, GPU_RESET_TIMEOUT_FLAG, TIMEOUT_SECONDS, DEFAULT_TIMEOUT_SECONDS);
    const grace = readFlag(context.settings, GPU_RESET_STOP_GRACE_FLAG, STOP_GRACE_SECONDS, 0);
    return new GpuResetCollector(context, seconds, grace);
  },
};
