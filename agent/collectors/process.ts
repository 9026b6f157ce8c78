import { Counter, Gauge, type Registry } from 'prom-client';
import { z } from 'zod';
import { errorMessage } from '../../core/errors.js';
import { describeIssues } from '../../core/validate.js';
import type { AgentRequest, AgentResponse, AgentRoute, Collector, CollectorContext, CollectorFactory } from '../collector.js';
import { readFlag } from '../flags.js';
import { flightRecorderSource, listFlightRecorderDumps, type FlightRecorderListing, type FlightRecorderSource } from '../sources/flight-recorder-dumps.js';
import {
  CLOCK_TICKS_PER_SECOND,
  PROCESS_ROLES,
  ProcessIdentityCache,
  classifyTrainingTree,
  readProcessTable,
  type ProcessRole,
  type TrainingProcess,
  type TrainingTree,
} from '../sources/proc-tree.js';
import { dumpWithFaulthandler, stackDirectories, type FaulthandlerTarget } from '../sources/faulthandler-dump.js';
import { PySpyNotFoundError, dumpPythonStacks, locatePySpy, type PySpyDump, type PySpyTarget } from '../sources/pyspy-dump.js';

/**
 * The `process` collector: the training job's process tree on this node (launcher, ranks,
 * dataloader workers, checkpoint writers; see agent/sources/proc-tree.ts for how each is
 * recognised), read from procfs at every scrape, and `POST /api/v1/trace`, which takes the
 * ranks' Python stacks (py-spy, or the ranks' own faulthandler where py-spy is absent) and
 * returns them with the NCCL flight-recorder dumps found on the node: what an operator wants
 * first when a job hangs.
 */

export const PY_SPY_FLAG = 'process.py-spy';
export const STACK_TOOL_FLAG = 'process.stack-tool';
export const STACK_DIR_FLAG = 'process.stack-dir';
export const FLIGHT_RECORDER_DIR_FLAG = 'process.flight-recorder-dir';
export const TRACE_PATH = '/api/v1/trace';

/** `auto`: py-spy when it is installed, else faulthandler. */
const StackTool = z.enum(['auto', 'py-spy', 'faulthandler']);
type StackTool = z.infer<typeof StackTool>;

/** One info series per process; a node with 8 ranks × 2–8 workers stays well under it. */
const MAX_INFO_SERIES = 256;
const DEFAULT_TRACE_TIMEOUT_SECONDS = 10;
/** One py-spy per rank of an 8-GPU node at once; py-spy pauses its target for a few milliseconds. */
const DEFAULT_PY_SPY_CONCURRENCY = 8;

export interface ProcessCollectorOptions {
  /** Environment read for TORCH_NCCL_DEBUG_INFO_TEMP_FILE; the agent's own by default. */
  readonly env?: Readonly<Record<string, string | undefined>>;
  readonly pySpyConcurrency?: number;
}

class ProcessMetrics {
  readonly processes;
  readonly info;
  readonly cpuSeconds;
  readonly residentBytes;
  /** Registered at the first good read, so that no fake 0 is exported before procfs was read. */
  private readonly zombies: Gauge;
  private zombiesRegistered = false;

  constructor(private readonly registry: Registry) {
    const registers = [registry];
    this.processes = new Gauge({
      name: 'steadfast_training_processes',
      help: 'Processes of the training job on this node, by role (launcher, rank, dataloader, checkpoint_writer).',
      labelNames: ['role'],
      registers,
    });
    this.info = new Gauge({
      name: 'steadfast_training_process_info',
      help: `One series per training process (at most ${MAX_INFO_SERIES}), with the GPUs it holds (their indices, where nvidia-smi lists it); always 1.`,
      labelNames: ['pid', 'role', 'rank', 'comm', 'gpu'],
      registers,
    });
    this.cpuSeconds = new Counter({
      name: 'steadfast_training_process_cpu_seconds_total',
      help: 'User plus system CPU time of the live training processes, by role; drops when a process exits.',
      labelNames: ['role'],
      registers,
    });
    this.residentBytes = new Gauge({
      name: 'steadfast_training_process_resident_bytes',
      help: 'Resident memory (VmRSS) of the training processes, by role.',
      labelNames: ['role'],
      registers,
    });
    this.zombies = new Gauge({
      name: 'steadfast_training_process_zombies',
      help: 'Training processes that have exited but were not reaped by their parent (state Z).',
      registers: [],
    });
  }

  setZombies(count: number): void {
    if (!this.zombiesRegistered) {
      this.registry.registerMetric(this.zombies);
      this.zombiesRegistered = true;
    }
    this.zombies.set(count);
  }
}

function roleOrder(role: ProcessRole): number {
  return PROCESS_ROLES.indexOf(role);
}

/** Launcher first, then by rank, then by pid: the series that survive the cap are the ones that matter. */
function byImportance(a: TrainingProcess, b: TrainingProcess): number {
  return roleOrder(a.role) - roleOrder(b.role) || (a.rank ?? Infinity) - (b.rank ?? Infinity) || a.process.pid - b.process.pid;
}

const TraceRequest = z
  .object({
    pids: z.array(z.number().int().positive()).min(1).max(1024).optional(),
    timeoutSeconds: z.number().min(1).max(60).optional(),
  })
  .strict();

function json(status: number, body: unknown): AgentResponse {
  return { status, body };
}

class ProcessCollector implements Collector {
  readonly name = 'process';
  readonly routes: readonly AgentRoute[];
  private readonly metrics: ProcessMetrics;
  private readonly identities = new ProcessIdentityCache();
  private readonly pySpy: string;
  private readonly stackTool: { tool: StackTool } | { error: string };
  private readonly stackDir: string | undefined;
  private readonly flightRecorder: FlightRecorderSource | undefined;
  private readonly abort = new AbortController();
  private tracing = false;
  private warnedTruncated = false;

  constructor(
    private readonly context: CollectorContext,
    private readonly options: ProcessCollectorOptions,
  ) {
    this.metrics = new ProcessMetrics(context.registry);
    this.pySpy = readFlag(context.settings, PY_SPY_FLAG, 'path', 'py-spy');
    const tool = StackTool.safeParse(readFlag(context.settings, STACK_TOOL_FLAG, 'string', 'auto'));
    this.stackTool = tool.success ? { tool: tool.data } : { error: `--${STACK_TOOL_FLAG} must be one of ${StackTool.options.join(', ')}` };
    if ('error' in this.stackTool) context.logger.error({ collector: this.name }, `${this.stackTool.error}; POST ${TRACE_PATH} answers 503`);
    this.stackDir = readFlag(context.settings, STACK_DIR_FLAG, 'path');
    this.flightRecorder = flightRecorderSource(readFlag(context.settings, FLIGHT_RECORDER_DIR_FLAG, 'path'), options.env ?? process.env);
    this.routes = [{ method: 'POST', path: TRACE_PATH, handle: (request) => this.handleTrace(request) }];
  }

  async start(): Promise<void> {
    // Nothing runs in the background: procfs is read at scrape time.
  }

  async update(): Promise<void> {
    this.write(await this.readTree());
  }

  async close(): Promise<void> {
    this.abort.abort();
  }

  private async readTree(): Promise<TrainingTree> {
    return classifyTrainingTree(await readProcessTable(this.context.paths.procfs, this.identities), this.context.gpuProcesses?.computePids());
  }

  private write(tree: TrainingTree): void {
    const { processes, info, cpuSeconds, residentBytes } = this.metrics;
    processes.reset();
    info.reset();
    cpuSeconds.reset();
    residentBytes.reset();
    const count = new Map<ProcessRole, number>(PROCESS_ROLES.map((role) => [role, 0]));
    const ticks = new Map<ProcessRole, number>();
    const resident = new Map<ProcessRole, number>();
    let zombies = 0;
    for (const { process: entry, role } of tree.processes) {
      count.set(role, (count.get(role) ?? 0) + 1);
      ticks.set(role, (ticks.get(role) ?? 0) + entry.utimeTicks + entry.stimeTicks);
      resident.set(role, (resident.get(role) ?? 0) + (entry.residentBytes ?? 0));
      if (entry.state === 'Z') zombies += 1;
    }
    for (const [role, value] of count) processes.set({ role }, value);
    // Hardware-style counter written as an absolute reading: reset() + inc(value).
    for (const [role, value] of ticks) cpuSeconds.inc({ role }, value / CLOCK_TICKS_PER_SECOND);
    for (const [role, value] of resident) residentBytes.set({ role }, value);
    this.metrics.setZombies(zombies);

    const listed = [...tree.processes].sort(byImportance);
    if (listed.length > MAX_INFO_SERIES && !this.warnedTruncated) {
      this.warnedTruncated = true;
      this.context.logger.warn({ collector: this.name, processes: listed.length, max: MAX_INFO_SERIES }, 'too many training processes; info series capped');
    }
    for (const { process: entry, role, rank } of listed.slice(0, MAX_INFO_SERIES)) {
      const gpus = [...new Set((this.context.gpuProcesses?.gpusOf(entry.pid) ?? []).map((holding) => holding.gpu))].join(',');
      info.set(
        { pid: String(entry.pid), role, ...(rank === undefined ? {} : { rank: String(rank) }), comm: entry.comm, ...(gpus === '' ? {} : { gpu: gpus }) },
        1,
      );
    }
  }

  private async handleTrace(request: AgentRequest): Promise<AgentResponse> {
    const parsed = TraceRequest.safeParse(request.body ?? {});
    if (!parsed.success) return json(400, { error: `invalid trace request: ${describeIssues(parsed.error.issues)}` });
    if (this.tracing) return json(409, { error: 'a trace is already running on this node; try again when it has finished' });
    this.tracing = true;
    try {
      return await this.trace(parsed.data.pids, parsed.data.timeoutSeconds ?? DEFAULT_TRACE_TIMEOUT_SECONDS);
    } catch (error) {
      this.context.logger.error({ collector: this.name, err: error }, 'trace failed');
      return json(500, { error: `trace failed: ${errorMessage(error)}` });
    } finally {
      this.tracing = false;
    }
  }

  private async trace(pids: readonly number[] | undefined, timeoutSeconds: number): Promise<AgentResponse> {
    const tree = await this.readTree();
    let chosen: TrainingProcess[];
    if (pids === undefined) {
      chosen = tree.processes.filter((node) => node.role === 'rank');
    } else {
      const outside = pids.filter((pid) => tree.byPid(pid) === undefined);
      if (outside.length > 0) {
        const named = outside.map((pid) => `pid ${pid}`).join(', ');
        return json(400, {
          error: `${named} ${outside.length === 1 ? 'is' : 'are'} not part of the training process tree on ${this.context.node}`,
          field: 'pids',
        });
      }
      chosen = [...new Set(pids)].map((pid) => tree.byPid(pid)!);
    }
    const tool = await this.chooseTool();
    if ('status' in tool) return tool;
    const capturedAt = new Date().toISOString();
    const timeoutMs = timeoutSeconds * 1000;
    const [dumps, flightRecorder] = await Promise.all([
      tool.binary === undefined ? this.faulthandlerDumps(chosen, timeoutMs) : this.pySpyDumps(chosen.map(toTarget), tool.binary, timeoutMs),
      this.listFlightRecorder(),
    ]);
    return json(200, {
      node: this.context.node,
      capturedAt,
      tool: tool.binary === undefined ? 'faulthandler' : 'py-spy',
      dumps: dumps.map((dump) => this.withGpus(dump)),
      flightRecorder: flightRecorder?.files ?? [],
      flightRecorderDir: flightRecorder?.dir ?? null,
      ...(flightRecorder?.error === undefined ? {} : { flightRecorderError: flightRecorder.error }),
    });
  }

  /** A dump with the GPUs its process holds (index, PCI bus id, UUID), where nvidia-smi lists them. */
  private withGpus(dump: PySpyDump): PySpyDump & { gpus?: { gpu: string; pciBusId?: string; uuid?: string }[] } {
    const held = this.context.gpuProcesses?.gpusOf(dump.pid) ?? [];
    if (held.length === 0) return dump;
    return {
      ...dump,
      gpus: held.map((holding) => ({
        gpu: holding.gpu,
        ...(holding.pciBusId === undefined ? {} : { pciBusId: holding.pciBusId }),
        ...(holding.uuid === undefined ? {} : { uuid: holding.uuid }),
      })),
    };
  }

  /** py-spy's path, or none for faulthandler, or the 503 answer when the configured tool cannot run. */
  private async chooseTool(): Promise<{ binary: string | undefined } | AgentResponse> {
    if ('error' in this.stackTool) return json(503, { error: this.stackTool.error });
    if (this.stackTool.tool === 'faulthandler') return { binary: undefined };
    try {
      return { binary: await locatePySpy(this.pySpy) };
    } catch (error) {
      if (!(error instanceof PySpyNotFoundError)) throw error;
      if (this.stackTool.tool === 'auto') return { binary: undefined };
      return json(503, { error: `${error.message}, or use --${STACK_TOOL_FLAG}=faulthandler` });
    }
  }

  private pySpyDumps(targets: readonly PySpyTarget[], binary: string, timeoutMs: number): Promise<PySpyDump[]> {
    return dumpPythonStacks(targets, {
      binary,
      perProcessTimeoutMs: timeoutMs,
      deadlineMs: timeoutMs,
      concurrency: this.options.pySpyConcurrency ?? DEFAULT_PY_SPY_CONCURRENCY,
      signal: this.abort.signal,
    });
  }

  /** Only ranks are signalled: a forked worker shares its rank's handler and would write into the rank's file. */
  private async faulthandlerDumps(chosen: readonly TrainingProcess[], timeoutMs: number): Promise<PySpyDump[]> {
    const procfs = this.context.paths.procfs;
    const targets: FaulthandlerTarget[] = chosen
      .filter((node) => node.role === 'rank')
      .map((node) => ({ ...toTarget(node), startTimeTicks: node.process.startTimeTicks, directories: stackDirectories(procfs, node.process, this.stackDir) }));
    const taken = await dumpWithFaulthandler(targets, { procfs, deadlineMs: timeoutMs, signal: this.abort.signal });
    const byPid = new Map(taken.map((dump) => [dump.pid, dump]));
    return chosen.map(
      (node) =>
        byPid.get(node.process.pid) ?? {
          ...toTarget(node),
          ok: false,
          error: `not signalled: faulthandler dumps are taken of training ranks only, not of a ${node.role}`,
        },
    );
  }

  private async listFlightRecorder(): Promise<FlightRecorderListing | undefined> {
    return this.flightRecorder === undefined ? undefined : listFlightRecorderDumps(this.flightRecorder);
  }
}

function toTarget(node: TrainingProcess): PySpyTarget {
  return { pid: node.process.pid, role: node.role, rank: node.rank ?? null };
}

export function createProcessCollector(context: CollectorContext, options: ProcessCollectorOptions = {}): Collector {
  return new ProcessCollector(context, options);
}

export const processCollectorFactory: CollectorFactory = {
  name: 'process',
  defaultEnabled: true,
  help: 'Training process tree from /proc (launcher, ranks, dataloader workers, checkpoint writers) and POST /api/v1/trace (py-spy or faulthandler stack dumps + NCCL flight-recorder files).',
  flags: [
    { name: PY_SPY_FLAG, value: '<path>', description: 'py-spy binary used by POST /api/v1/trace (a path, or a name looked up on PATH).', default: 'py-spy' },
    {
      name: STACK_TOOL_FLAG,
      value: '<auto|py-spy|faulthandler>',
      description:
        "how POST /api/v1/trace takes stacks: py-spy, or faulthandler (SIGUSR1 to each rank that registered it with the Python client's enable_stack_dumps(), and its dump file read back); auto: py-spy when installed, else faulthandler.",
      default: 'auto',
    },
    {
      name: STACK_DIR_FLAG,
      value: '<dir>',
      description:
        "where ranks write faulthandler dumps, as the agent sees it (default: each rank's own $STEADFAST_STACK_DIR, else its $TMPDIR/steadfast-stacks, else /tmp/steadfast-stacks, read through <procfs>/<pid>/root).",
    },
    {
      name: FLIGHT_RECORDER_DIR_FLAG,
      value: '<dir>',
      description:
        'Directory of PyTorch NCCL flight-recorder dumps returned by POST /api/v1/trace (default: the directory of $TORCH_NCCL_DEBUG_INFO_TEMP_FILE when set, else none).',
    },
  ],
  create: (context) => createProcessCollector(context),
};
