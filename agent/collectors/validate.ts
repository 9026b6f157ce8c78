import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Counter, Gauge, type Registry } from 'prom-client';
import { errorMessage } from '../../core/errors.js';
import { describeIssues } from '../../core/validate.js';
import {
  VALIDATE_PATH,
  burnOutputSchema,
  validateRequestSchema,
  type BurnDevice,
  type DcgmMode,
  type ValidationCheck,
  type ValidationReport,
} from '../../core/validation.js';
import { runBoundedCommand, type BoundedCommandResult } from '../bounded-command.js';
import type { AgentRequest, AgentResponse, AgentRoute, Collector, CollectorContext, CollectorFactory } from '../collector.js';
import { readFlag } from '../flags.js';

/**
 * The `validate` collector: `POST /api/v1/validate` checks this node under load before it is
 * trusted again (ByteRobust §6.2, self-checked standbys; NVIDIA's validation before a node returns
 * to service). It runs, one after the other:
 *
 * - the burn: steadfast_burn.py, shipped with the agent, under --validate.python — a seeded
 *   reference computation on every GPU at once (the CPU where there is none), compared with the
 *   CPU's float64 result, and its throughput;
 * - `dcgmi diag -r 2` where DCGM is installed (`dcgmi` found and nv-hostengine answering
 *   `dcgmi discovery -l`), or always / never as the request's `dcgm` says.
 *
 * Only these commands run, with the operator's flags; a request picks among them and sets the
 * times, never a program or an argument. One validation at a time (a second request is answered
 * 409). Off by default: the burn takes the GPUs for its seconds and needs torch on the node.
 */

export const VALIDATE_PYTHON_FLAG = 'validate.python';
export const VALIDATE_BURN_SCRIPT_FLAG = 'validate.burn-script';
export const VALIDATE_BURN_SECONDS_FLAG = 'validate.burn-seconds';
export const VALIDATE_DCGMI_FLAG = 'validate.dcgmi';
export const VALIDATE_DCGM_TIMEOUT_FLAG = 'validate.dcgm-timeout-seconds';

const BURN_SCRIPT = 'steadfast_burn.py';
const DEFAULT_BURN_SECONDS = 15;
/** Python's and torch's start, the CPU reference and CUDA's context on top of the burn's own seconds. */
const BURN_START_ALLOWANCE_SECONDS = 60;
/** NVIDIA gives about two minutes for level 2; ten leave room for a slow node without hanging forever. */
const DEFAULT_DCGM_TIMEOUT_SECONDS = 600;
/** `dcgmi discovery -l` answers at once where nv-hostengine runs. */
const DCGM_PROBE_SECONDS = 15;
const DEFAULT_VALIDATION_SECONDS = 900;
const KILL_GRACE_MS = 5000;
const TAIL_BYTES = 4096;

/**
 * The burn script the agent ships: beside the agent-only package's bundle (python/), or in the
 * full package and a checkout (clients/python/), found upwards from this module.
 */
export function shippedBurnScript(moduleUrl: string = import.meta.url): string | undefined {
  let dir = dirname(fileURLToPath(moduleUrl));
  for (let level = 0; level < 5; level += 1) {
    for (const candidate of [join(dir, 'python', BURN_SCRIPT), join(dir, 'clients', 'python', BURN_SCRIPT)]) if (existsSync(candidate)) return candidate;
    const parent = dirname(dir);
    if (parent === dir) break;
    dir = parent;
  }
  return undefined;
}

class ValidateMetrics {
  readonly runs: Counter<'check' | 'result'>;
  readonly lastDuration: Gauge<'check'>;
  readonly tflops: Gauge<'device'>;
  readonly running: Gauge;

  constructor(registry: Registry) {
    const registers = [registry];
    this.runs = new Counter({
      name: 'steadfast_validation_runs_total',
      help: 'Validation checks run on this node before it is trusted again, by check (burn, dcgm) and result (passed, failed, timed_out, skipped).',
      labelNames: ['check', 'result'],
      registers,
    });
    this.lastDuration = new Gauge({
      name: 'steadfast_validation_last_duration_seconds',
      help: 'How long the last run of each validation check took.',
      labelNames: ['check'],
      registers,
    });
    this.tflops = new Gauge({
      name: 'steadfast_validation_burn_tflops',
      help: "The last burn's matrix-multiply throughput per device, in TFLOPS.",
      labelNames: ['device'],
      registers,
    });
    this.running = new Gauge({ name: 'steadfast_validation_running', help: 'Whether a validation is running on this node (1) or not (0).', registers });
  }
}

interface ValidateSettings {
  readonly python: string;
  readonly burnScript: string | undefined;
  readonly burnSeconds: number;
  readonly dcgmi: string;
  readonly dcgmTimeoutSeconds: number;
}

function lastLine(text: string): string {
  const line = text.trimEnd().split('\n').at(-1)?.trim() ?? '';
  return line.length > 200 ? `${line.slice(0, 200)}…` : line;
}

/** How a run that did not exit 0 went, in a sentence. */
function howItEnded(run: BoundedCommandResult, limitSeconds: number): { result: 'failed' | 'timed_out'; reason: string } {
  if (run.spawnError !== undefined) return { result: 'failed', reason: run.spawnError };
  if (run.stoppedBy === 'limit') return { result: 'timed_out', reason: `did not finish within ${limitSeconds.toFixed(0)} s and was killed` };
  if (run.stoppedBy === 'abort') return { result: 'failed', reason: 'stopped: the agent is shutting down' };
  const how = run.exitCode === null ? `was killed by ${run.signal ?? 'a signal'}` : `exited with status ${run.exitCode}`;
  const said = lastLine(run.outputTail);
  return { result: 'failed', reason: said === '' ? how : `${how}: ${said}` };
}

class ValidateCollector implements Collector {
  readonly name = 'validate';
  readonly routes: readonly AgentRoute[];
  private readonly metrics: ValidateMetrics;
  private readonly abort = new AbortController();
  private readonly settings: ValidateSettings;
  private running = false;

  constructor(private readonly context: CollectorContext) {
    this.metrics = new ValidateMetrics(context.registry);
    this.metrics.running.set(0);
    const { settings } = context;
    this.settings = {
      python: readFlag(settings, VALIDATE_PYTHON_FLAG, 'path', '/usr/bin/python3'),
      burnScript: readFlag(settings, VALIDATE_BURN_SCRIPT_FLAG, 'path') ?? shippedBurnScript(),
      burnSeconds: readFlag(settings, VALIDATE_BURN_SECONDS_FLAG, { type: 'number', min: 1, max: 600, unit: 'seconds' }, DEFAULT_BURN_SECONDS),
      dcgmi: readFlag(settings, VALIDATE_DCGMI_FLAG, 'path', 'dcgmi'),
      dcgmTimeoutSeconds: readFlag(
        settings,
        VALIDATE_DCGM_TIMEOUT_FLAG,
        { type: 'number', min: 10, max: 3600, whole: true, unit: 'seconds' },
        DEFAULT_DCGM_TIMEOUT_SECONDS,
      ),
    };
    this.routes = [{ method: 'POST', path: VALIDATE_PATH, handle: (request) => this.handleValidate(request) }];
  }

  start(): Promise<void> {
    return this.update();
  }

  /** A missing burn script shows as a failing collector, not as a validation that cannot pass. */
  async update(): Promise<void> {
    if (this.settings.burnScript === undefined) throw new Error(`${BURN_SCRIPT} is not where the agent ships it; give --${VALIDATE_BURN_SCRIPT_FLAG} <file>`);
  }

  async close(): Promise<void> {
    this.abort.abort();
  }

  private async handleValidate(request: AgentRequest): Promise<AgentResponse> {
    const parsed = validateRequestSchema.safeParse(request.body ?? {});
    if (!parsed.success) return { status: 400, body: { error: `invalid validate request: ${describeIssues(parsed.error.issues)}` } };
    if (this.running) return { status: 409, body: { error: `a validation is already running on ${this.context.node}; try again when it has finished` } };
    const busy = this.context.gpuWork?.take('validation');
    if (busy !== undefined) return { status: 409, body: { error: `the GPUs of ${this.context.node} are busy with a ${busy}; try again when it has finished` } };
    this.running = true;
    this.metrics.running.set(1);
    try {
      const { dcgm = 'auto', burnSeconds = this.settings.burnSeconds, timeoutSeconds = DEFAULT_VALIDATION_SECONDS } = parsed.data;
      return { status: 200, body: await this.validate(dcgm, burnSeconds, timeoutSeconds) };
    } catch (error) {
      this.context.logger.error({ collector: this.name, err: error }, 'validation failed');
      return { status: 500, body: { error: `validation failed: ${errorMessage(error)}` } };
    } finally {
      this.running = false;
      this.context.gpuWork?.release('validation');
      this.metrics.running.set(0);
    }
  }

  private async validate(dcgm: DcgmMode, burnSeconds: number, timeoutSeconds: number): Promise<ValidationReport> {
    const startedAt = new Date();
    const deadline = startedAt.getTime() + timeoutSeconds * 1000;
    const burn = await this.burn(burnSeconds, deadline);
    const checks: ValidationCheck[] = [burn.check, await this.dcgm(dcgm, deadline)];
    for (const check of checks) {
      this.metrics.runs.inc({ check: check.name, result: check.result });
      this.metrics.lastDuration.set({ check: check.name }, check.seconds);
      this.context.logger.info(
        { collector: this.name, check: check.name, result: check.result, seconds: check.seconds, reason: check.reason },
        'validation check finished',
      );
    }
    for (const device of burn.devices ?? []) this.metrics.tflops.set({ device: device.device }, device.tflops);
    return {
      node: this.context.node,
      startedAt: startedAt.toISOString(),
      seconds: (Date.now() - startedAt.getTime()) / 1000,
      ok: checks.every((check) => check.ok),
      checks,
      ...(burn.devices === undefined ? {} : { devices: burn.devices }),
    };
  }

  private run(argv: readonly string[], limitMs: number, onStdoutLine?: (line: string) => void): Promise<BoundedCommandResult> {
    return runBoundedCommand({
      argv,
      limitMs: Math.max(0, limitMs),
      killGraceMs: KILL_GRACE_MS,
      tailBytes: TAIL_BYTES,
      env: { ...process.env, STEADFAST_NODE: this.context.node },
      onStdoutLine,
      signal: this.abort.signal,
    });
  }

  private async burn(seconds: number, deadline: number): Promise<{ check: ValidationCheck; devices?: BurnDevice[] }> {
    const script = this.settings.burnScript;
    if (script === undefined) {
      return { check: { name: 'burn', result: 'failed', ok: false, seconds: 0, outputTail: '', reason: `${BURN_SCRIPT} not found on this node` } };
    }
    const limitMs = Math.min((seconds + BURN_START_ALLOWANCE_SECONDS) * 1000, deadline - Date.now());
    let report: unknown;
    const run = await this.run([this.settings.python, script, '--seconds', String(seconds)], limitMs, (line) => {
      if (line.startsWith('{')) {
        try {
          report = JSON.parse(line);
        } catch {
          // Not the report line; the tail keeps it for the reason.
        }
      }
    });
    const output = burnOutputSchema.safeParse(report);
    const devices = output.success ? output.data.devices : undefined;
    const base = { name: 'burn' as const, seconds: run.seconds, outputTail: run.outputTail };
    if (run.exitCode === 0 && output.success && output.data.ok && output.data.devices.length > 0)
      return { check: { ...base, result: 'passed', ok: true }, ...(devices ? { devices } : {}) };
    const failedDevices = (devices ?? []).filter((device) => !device.ok);
    const reason =
      failedDevices.length > 0
        ? failedDevices.map((device) => `${device.device}: ${device.reason ?? 'failed'}`).join('; ')
        : output.success && output.data.error !== undefined
          ? output.data.error
          : run.exitCode === 0
            ? `printed no burn report${output.success ? '' : ` (${describeIssues(output.error.issues)})`}`
            : howItEnded(run, limitMs / 1000).reason;
    const result = run.stoppedBy === 'limit' ? 'timed_out' : 'failed';
    return { check: { ...base, result, ok: false, reason: reason.slice(0, 2000) }, ...(devices ? { devices } : {}) };
  }

  private async dcgm(mode: DcgmMode, deadline: number): Promise<ValidationCheck> {
    const skipped = (reason: string, seconds = 0): ValidationCheck => ({ name: 'dcgm', result: 'skipped', ok: true, seconds, outputTail: '', reason });
    if (mode === 'never') return skipped('not asked for (dcgm: never)');
    const probe = await this.run([this.settings.dcgmi, 'discovery', '-l'], Math.min(DCGM_PROBE_SECONDS * 1000, deadline - Date.now()));
    if (probe.exitCode !== 0) {
      const why =
        probe.spawnError !== undefined ? `${this.settings.dcgmi} not found` : `nv-hostengine did not answer (${howItEnded(probe, DCGM_PROBE_SECONDS).reason})`;
      if (mode === 'auto') return skipped(`DCGM is not installed here: ${why}`, probe.seconds);
      return { name: 'dcgm', result: 'failed', ok: false, seconds: probe.seconds, outputTail: probe.outputTail, reason: `dcgm: always, but ${why}` };
    }
    const limitMs = Math.min(this.settings.dcgmTimeoutSeconds * 1000, deadline - Date.now());
    const run = await this.run([this.settings.dcgmi, 'diag', '-r', '2'], limitMs);
    const base = { name: 'dcgm' as const, seconds: run.seconds, outputTail: run.outputTail };
    // dcgmi diag exits non-zero when a test fails; its table also says "Fail" on a row.
    if (run.exitCode === 0 && !/\|\s*Fail\b/i.test(run.outputTail)) return { ...base, result: 'passed', ok: true };
    if (run.exitCode === 0) return { ...base, result: 'failed', ok: false, reason: 'dcgmi diag -r 2 reported a failed test' };
    return { ...base, ok: false, ...howItEnded(run, limitMs / 1000) };
  }
}

export function createValidateCollector(context: CollectorContext): Collector {
  return new ValidateCollector(context);
}

export const validateCollectorFactory: CollectorFactory = {
  name: 'validate',
  defaultEnabled: false,
  help: 'POST /api/v1/validate: a burn under load (steadfast_burn.py: reference comparison and throughput) and dcgmi diag -r 2 where DCGM is installed, before the node is trusted again.',
  flags: [
    { name: VALIDATE_PYTHON_FLAG, value: '<file>', description: 'The Python with torch that runs the burn.', default: '/usr/bin/python3' },
    { name: VALIDATE_BURN_SCRIPT_FLAG, value: '<file>', description: `The burn script; default: the ${BURN_SCRIPT} shipped with the agent.` },
    {
      name: VALIDATE_BURN_SECONDS_FLAG,
      value: '<seconds>',
      description: 'How long the burn runs when the request does not say.',
      default: String(DEFAULT_BURN_SECONDS),
    },
    { name: VALIDATE_DCGMI_FLAG, value: '<file>', description: 'The dcgmi binary (looked up on PATH).', default: 'dcgmi' },
    {
      name: VALIDATE_DCGM_TIMEOUT_FLAG,
      value: '<seconds>',
      description: 'Time limit of dcgmi diag -r 2.',
      default: String(DEFAULT_DCGM_TIMEOUT_SECONDS),
    },
  ],
  create: (context) => createValidateCollector(context),
};
