import { readFile } from 'node:fs/promises';
import { Counter, Gauge, type Registry } from 'prom-client';
import { z } from 'zod';
import {
  DIAGNOSE_PATH,
  MAX_DIAGNOSE_SECONDS,
  checkNameSchema,
  diagnoseRequestSchema,
  type CheckReport,
  type CheckResult,
  type DiagnoseReport,
} from '../../core/diagnostics.js';
import { errorMessage } from '../../core/errors.js';
import { describeIssues } from '../../core/validate.js';
import { runBoundedCommand, type BoundedCommandResult } from '../bounded-command.js';
import type { AgentRequest, AgentResponse, AgentRoute, Collector, CollectorContext, CollectorFactory } from '../collector.js';
import { readFlag } from '../flags.js';

/**
 * The `diagnose` collector: stop-time diagnostics on this node (ByteRobust §4.2 Diagnose,
 * §4.3). `POST /api/v1/diagnose` runs the checks named in the file given by
 * `--diagnose.config` — EUD (`dcgmi diag`), an NCCL all-to-all inside the machine, an
 * all-gather with the neighbouring machines, each an argv array with a time limit — one after
 * the other, then the optional reference step whose stdout is hashed for bit-wise alignment.
 * Every selected check runs even after one fails: the all-gather needs the neighbours in step,
 * and the controller, not the agent, walks the paper's hierarchy by selecting checks per call.
 *
 * Off by default: the checks take minutes, need the GPUs to themselves (the job is stopped
 * first, §4.1 step ③), and the agent's POST endpoints are open unless it has a token.
 * Enabled without a config, it fails at every scrape and answers 503 saying so.
 */

export const DIAGNOSE_CONFIG_FLAG = 'diagnose.config';
/** Environment given to every check, so that wrapper scripts know where and with whom they run. */
export const NODE_ENV = 'STEADFAST_NODE';
export const PEERS_ENV = 'STEADFAST_DIAGNOSE_PEERS';
export const CHECK_ENV = 'STEADFAST_DIAGNOSE_CHECK';

const DEFAULT_REFERENCE_NAME = 'reference';
const DEFAULT_TAIL_BYTES = 4096;
const DEFAULT_KILL_GRACE_MS = 5000;
/** The reason line quotes at most this much of a failing check's last output line. */
const MAX_REASON_LINE = 200;

const argvSchema = z
  .array(z.string().refine((arg) => !arg.includes('\0'), 'must not contain NUL bytes'))
  .min(1, 'must name at least the program')
  .refine((argv) => argv[0] !== '', 'the program (first element) must not be empty');

const checkSchema = z
  .object({
    name: checkNameSchema,
    /** argv, run without a shell. */
    command: argvSchema,
    timeoutSeconds: z.number().positive().max(MAX_DIAGNOSE_SECONDS),
    /** For nccl-tests: fail unless "# Avg bus bandwidth" reaches this many GB/s (§4.2: "bandwidth meets expectations"). */
    minAvgBusBandwidthGBps: z.number().positive().optional(),
    /**
     * Also run as a warm standby's self-check (ByteRobust §6.2), on the node alone; set false for
     * checks that need neighbours (the all-gather), which a lone standby cannot run.
     */
    standby: z.boolean().default(true),
  })
  .strict();

const configSchema = z
  .object({
    checks: z.array(checkSchema).max(64).default([]),
    /** The bit-wise alignment step (§4.3): one step of a reference model on fixed weights and input. */
    reference: checkSchema
      .omit({ name: true, minAvgBusBandwidthGBps: true, standby: true })
      .extend({ name: checkNameSchema.default(DEFAULT_REFERENCE_NAME) })
      .strict()
      .optional(),
  })
  .strict()
  .superRefine((config, context) => {
    if (config.checks.length === 0 && config.reference === undefined)
      context.addIssue({ code: 'custom', message: 'configure at least one check or a reference', path: ['checks'] });
    const seen = new Set<string>();
    for (const [index, name] of [...config.checks.map((check) => check.name), config.reference?.name].entries()) {
      if (name === undefined) continue;
      if (seen.has(name))
        context.addIssue({
          code: 'custom',
          message: `check name "${name}" is used twice`,
          path: index < config.checks.length ? ['checks', index, 'name'] : ['reference', 'name'],
        });
      seen.add(name);
    }
  });

type CheckConfig = z.infer<typeof checkSchema> & { readonly reference?: boolean };
type Loaded = { ok: true; checks: CheckConfig[] } | { ok: false; error: string };

export interface DiagnoseCollectorOptions {
  /** Environment the checks start from; the agent's own by default. */
  readonly env?: Readonly<Record<string, string | undefined>>;
  readonly killGraceMs?: number;
  readonly tailBytes?: number;
}

/** Reads and validates the checks file (YAML, or JSON, which YAML reads too). */
async function loadChecks(file: string | undefined): Promise<Loaded> {
  if (file === undefined)
    return { ok: false, error: `stop-time diagnostics are not configured on this node: start the agent with --${DIAGNOSE_CONFIG_FLAG} <file>` };
  let parsed: unknown;
  try {
    // The YAML parser loads only here, on a node that runs diagnostics, not at every agent start.
    const { parse: parseYaml } = await import('yaml');
    parsed = parseYaml(await readFile(file, 'utf8'));
  } catch (error) {
    return { ok: false, error: `cannot read the diagnostics config ${file}: ${errorMessage(error)}` };
  }
  const result = configSchema.safeParse(parsed);
  if (!result.success) return { ok: false, error: `invalid diagnostics config ${file}: ${describeIssues(result.error.issues)}` };
  const { checks, reference } = result.data;
  return { ok: true, checks: [...checks, ...(reference === undefined ? [] : [{ ...reference, standby: false, reference: true }])] };
}

class DiagnoseMetrics {
  readonly runs: Counter<'check' | 'result'>;
  readonly lastDuration: Gauge<'check'>;
  readonly running: Gauge;

  constructor(registry: Registry) {
    const registers = [registry];
    this.runs = new Counter({
      name: 'steadfast_diagnose_runs_total',
      help: 'Stop-time diagnostic checks run on this node, by check and result (passed, failed, timed_out, incomplete).',
      labelNames: ['check', 'result'],
      registers,
    });
    this.lastDuration = new Gauge({
      name: 'steadfast_diagnose_last_duration_seconds',
      help: 'How long the last run of each stop-time diagnostic check took.',
      labelNames: ['check'],
      registers,
    });
    this.running = new Gauge({ name: 'steadfast_diagnose_running', help: 'Whether a stop-time diagnosis is running on this node (1) or not (0).', registers });
  }
}

/** nccl-tests' summary line: `# Avg bus bandwidth    : 180.553`. */
const AVG_BUS_BANDWIDTH = /^#\s*Avg bus bandwidth\s*:\s*([0-9.]+(?:[eE][+-]?\d+)?)/;

function lastLine(text: string): string {
  const line = text.trimEnd().split('\n').at(-1)?.trim() ?? '';
  return line.length > MAX_REASON_LINE ? `${line.slice(0, MAX_REASON_LINE)}…` : line;
}

/** Turns how the process ended into the check's verdict and a reason a person can act on. */
function judge(
  check: CheckConfig,
  run: BoundedCommandResult,
  ownLimit: boolean,
  limitSeconds: number,
  bandwidth: number | undefined,
): { result: CheckResult; reason?: string } {
  if (run.spawnError !== undefined) return { result: 'failed', reason: run.spawnError };
  if (run.stoppedBy === 'abort') return { result: 'incomplete', reason: 'stopped: the agent is shutting down' };
  if (run.stoppedBy === 'limit') {
    return ownLimit
      ? { result: 'timed_out', reason: `did not finish within its time limit of ${check.timeoutSeconds} s and was killed` }
      : {
          result: 'incomplete',
          reason: `stopped after ${limitSeconds.toFixed(1)} s when the request's time limit ran out (its own limit is ${check.timeoutSeconds} s)`,
        };
  }
  if (run.exitCode !== 0) {
    const how = run.exitCode === null ? `was killed by ${run.signal ?? 'a signal'}` : `exited with status ${run.exitCode}`;
    const said = lastLine(run.outputTail);
    return { result: 'failed', reason: said === '' ? how : `${how}: ${said}` };
  }
  if (check.minAvgBusBandwidthGBps !== undefined) {
    if (bandwidth === undefined) return { result: 'failed', reason: 'printed no "# Avg bus bandwidth" line, so its bandwidth cannot be checked' };
    if (bandwidth < check.minAvgBusBandwidthGBps)
      return { result: 'failed', reason: `average bus bandwidth ${bandwidth} GB/s is below the expected ${check.minAvgBusBandwidthGBps} GB/s` };
  }
  return { result: 'passed' };
}

class DiagnoseCollector implements Collector {
  readonly name = 'diagnose';
  readonly routes: readonly AgentRoute[];
  private readonly metrics: DiagnoseMetrics;
  private readonly abort = new AbortController();
  private loaded: Promise<Loaded> | undefined;
  private running = false;

  constructor(
    private readonly context: CollectorContext,
    private readonly options: DiagnoseCollectorOptions,
  ) {
    this.metrics = new DiagnoseMetrics(context.registry);
    this.metrics.running.set(0);
    this.routes = [{ method: 'POST', path: DIAGNOSE_PATH, handle: (request) => this.handleDiagnose(request) }];
  }

  async start(): Promise<void> {
    const loaded = await this.load();
    if (!loaded.ok) throw new Error(loaded.error);
  }

  async update(): Promise<void> {
    // Misconfigured diagnostics show as a failing collector, not as silence.
    const loaded = await this.load();
    if (!loaded.ok) throw new Error(loaded.error);
  }

  async close(): Promise<void> {
    this.abort.abort();
  }

  /** The config is read once; restart the agent to change it. */
  private load(): Promise<Loaded> {
    this.loaded ??= loadChecks(readFlag(this.context.settings, DIAGNOSE_CONFIG_FLAG, 'path'));
    return this.loaded;
  }

  private async handleDiagnose(request: AgentRequest): Promise<AgentResponse> {
    const loaded = await this.load();
    if (!loaded.ok) return { status: 503, body: { error: loaded.error } };
    const parsed = diagnoseRequestSchema.safeParse(request.body ?? {});
    if (!parsed.success) return { status: 400, body: { error: `invalid diagnose request: ${describeIssues(parsed.error.issues)}` } };
    const { checks: wanted, timeoutSeconds, peers = [], standby = false } = parsed.data;
    const known = new Set(loaded.checks.map((check) => check.name));
    const unknown = [...new Set(wanted ?? [])].filter((name) => !known.has(name));
    if (unknown.length > 0) {
      const named = unknown.map((name) => `"${name}"`).join(', ');
      return {
        status: 400,
        body: { error: `unknown check${unknown.length === 1 ? '' : 's'} ${named}; configured: ${[...known].join(', ')}`, field: 'checks' },
      };
    }
    if (this.running) return { status: 409, body: { error: `a diagnosis is already running on ${this.context.node}; try again when it has finished` } };
    const busy = this.context.gpuWork?.take('diagnosis');
    if (busy !== undefined) return { status: 409, body: { error: `the GPUs of ${this.context.node} are busy with a ${busy}; try again when it has finished` } };
    this.running = true;
    this.metrics.running.set(1);
    try {
      // A standby self-check runs the checks marked for it; the reference step needs peers to compare with.
      const chosen = standby ? loaded.checks.filter((check) => !check.reference && check.standby !== false) : loaded.checks;
      const selected = wanted === undefined ? chosen : chosen.filter((check) => wanted.includes(check.name));
      return { status: 200, body: await this.diagnose(selected, timeoutSeconds, peers) };
    } catch (error) {
      this.context.logger.error({ collector: this.name, err: error }, 'diagnosis failed');
      return { status: 500, body: { error: `diagnosis failed: ${errorMessage(error)}` } };
    } finally {
      this.running = false;
      this.context.gpuWork?.release('diagnosis');
      this.metrics.running.set(0);
    }
  }

  private async diagnose(checks: readonly CheckConfig[], timeoutSeconds: number | undefined, peers: readonly string[]): Promise<DiagnoseReport> {
    const startedAt = new Date();
    const deadline = timeoutSeconds === undefined ? Infinity : startedAt.getTime() + timeoutSeconds * 1000;
    const reports: CheckReport[] = [];
    let referenceHash: string | undefined;
    for (const check of checks) {
      const remainingMs = deadline - Date.now();
      const report = remainingMs <= 0 ? this.notStarted(check, timeoutSeconds ?? 0) : await this.runCheck(check, remainingMs, peers);
      if (check.reference && report.check.result === 'passed') referenceHash = report.stdoutSha256;
      reports.push(report.check);
      this.metrics.runs.inc({ check: check.name, result: report.check.result });
      this.metrics.lastDuration.set({ check: check.name }, report.check.seconds);
      this.context.logger.info(
        { collector: this.name, check: check.name, result: report.check.result, seconds: report.check.seconds, reason: report.check.reason },
        'diagnostic check finished',
      );
    }
    return {
      node: this.context.node,
      startedAt: startedAt.toISOString(),
      seconds: (Date.now() - startedAt.getTime()) / 1000,
      checks: reports,
      ...(referenceHash === undefined ? {} : { referenceHash }),
    };
  }

  private notStarted(check: CheckConfig, timeoutSeconds: number): { check: CheckReport; stdoutSha256?: string } {
    return {
      check: {
        name: check.name,
        result: 'incomplete',
        ok: false,
        exitCode: null,
        signal: null,
        seconds: 0,
        timedOut: false,
        outputTail: '',
        reason: `not started: the request's time limit of ${timeoutSeconds} s had run out`,
      },
    };
  }

  private async runCheck(check: CheckConfig, remainingMs: number, peers: readonly string[]): Promise<{ check: CheckReport; stdoutSha256?: string }> {
    const ownMs = check.timeoutSeconds * 1000;
    const limitMs = Math.min(ownMs, remainingMs);
    let bandwidth: number | undefined;
    const run = await runBoundedCommand({
      argv: check.command,
      limitMs,
      killGraceMs: this.options.killGraceMs ?? DEFAULT_KILL_GRACE_MS,
      tailBytes: this.options.tailBytes ?? DEFAULT_TAIL_BYTES,
      env: { ...(this.options.env ?? process.env), [NODE_ENV]: this.context.node, [PEERS_ENV]: peers.join(','), [CHECK_ENV]: check.name },
      hashStdout: check.reference === true,
      onStdoutLine:
        check.minAvgBusBandwidthGBps === undefined
          ? undefined
          : (line) => {
              const match = AVG_BUS_BANDWIDTH.exec(line);
              if (match) bandwidth = Number(match[1]);
            },
      signal: this.abort.signal,
    });
    const verdict = judge(check, run, ownMs <= remainingMs, limitMs / 1000, bandwidth);
    return {
      check: {
        name: check.name,
        result: verdict.result,
        ok: verdict.result === 'passed',
        exitCode: run.exitCode,
        signal: run.signal,
        seconds: run.seconds,
        timedOut: run.stoppedBy === 'limit',
        outputTail: run.outputTail,
        ...(verdict.reason === undefined ? {} : { reason: verdict.reason }),
        ...(bandwidth === undefined ? {} : { avgBusBandwidthGBps: bandwidth }),
      },
      ...(run.stdoutSha256 === undefined ? {} : { stdoutSha256: run.stdoutSha256 }),
    };
  }
}

export function createDiagnoseCollector(context: CollectorContext, options: DiagnoseCollectorOptions = {}): Collector {
  return new DiagnoseCollector(context, options);
}

export const diagnoseCollectorFactory: CollectorFactory = {
  name: 'diagnose',
  defaultEnabled: false,
  help: 'POST /api/v1/diagnose: stop-time diagnostics (EUD, NCCL all-to-all and neighbour all-gather, the bit-wise alignment reference step) from --diagnose.config.',
  flags: [
    {
      name: DIAGNOSE_CONFIG_FLAG,
      value: '<file>',
      description:
        'YAML or JSON file of the diagnostic checks: {checks: [{name, command: [argv...], timeoutSeconds, minAvgBusBandwidthGBps?}], reference?: {command, timeoutSeconds}}.',
    },
  ],
  create: (context) => createDiagnoseCollector(context),
};
