/**
 * The failures a distributed PyTorch run writes into its training log, whatever the framework
 * above it (Megatron, DeepSpeed, plain torchrun or srun): NCCL watchdog timeouts, CUDA and NCCL
 * errors, torchrun's `ChildFailedError` summaries and agent `failed (exitcode: …)` lines, and
 * srun's `srun: error: <host>: task <n>: Exited with exit code <c>` for ranks srun started
 * itself (with the Python exception the rank printed last), each turned into one error report.
 * No I/O and no clock; the parser keeps only the state a multi-line summary needs, and never
 * throws.
 */

import { childFailedReport, type ChildFailure, type ChildFailedReport, type NcclTimeoutReport, type TrainingErrorReport } from './training-error-reports.js';

export { TRAINING_ERROR_KINDS, type ChildFailure, type TrainingErrorKind, type TrainingErrorReport } from './training-error-reports.js';

/**
 * Launcher and viewer prefixes in front of a line: a log viewer's `[80746] `, torchrun's
 * `[default3]:`, srun --label's `3: `, PyTorch ≥ 2.2's `[rank7]:`. Leading blanks after them are kept.
 */
const LAUNCHER_PREFIX = /^\s*(?:\[\d+\]\s+)?(?:\[default\d+\]:|\d{1,6}: |\[rank\d+\]:)*/;

export function stripLauncherPrefix(line: string): string {
  return line.replace(LAUNCHER_PREFIX, '');
}

/** The same prefixes, but the line's own indentation kept: a Python traceback is read by it. */
const LAUNCHER_PREFIX_ONLY = /^(?:\[\d+\]\s+)?(?:\[default\d+\]:|\d{1,6}: |\[rank\d+\]:)*/;

const BRACKET_RANK = /\[(?:PG [^\]]*?)?Rank (\d+)\]/;
const PREFIX_RANK = /\[rank(\d+)\]:/;
const CUDA_ERROR = /\bCUDA error: (.*\S)/;
const NCCL_ERROR = /\bNCCL error in: (.*\S)/;
const AGENT_FAILURE = /\bfailed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\) of binary: (\S.*)$/;
/** srun's line for tasks that ended badly: `srun: error: node-2: task 1: Exited with exit code 1`, `…: tasks 0-3: Killed`. */
const SRUN_TASK_FAILURE = /^srun: error: (\S+): tasks? ([\d,-]+): (.*\S)\s*$/;
const SRUN_EXIT_CODE = /^Exited with exit code (\d+)$/;
/**
 * How srun reports tasks it, or slurmstepd, ended: the aftermath of another task's failure
 * (`--kill-on-bad-exit`) or of a cancelled job, never a failure of their own.
 */
const SRUN_ENDED_BY_OTHERS = /^(Terminated|Killed)$/;
const PYTHON_TRACEBACK_START = /^Traceback \(most recent call last\):\s*$/;
/** The line that ends a Python traceback: `TypeError: …`, `torch.OutOfMemoryError: …`, a bare `KeyboardInterrupt`. */
const PYTHON_EXCEPTION_LINE = /^([A-Za-z_][\w.]*)(?::(?: .*)?)?$/;
const CHILD_FAILED_START = /(?:^|[\s.])ChildFailedError:/;

function workField(work: string, name: string): string | undefined {
  const escaped = name.replace(/[()]/g, '\\$&');
  return new RegExp(`(?:^|[ ,])${escaped}=([^,)]+)`).exec(work)?.[1];
}

function optionalInt(text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const value = Number(text);
  return Number.isSafeInteger(value) ? value : undefined;
}

function parseNcclTimeout(line: string): NcclTimeoutReport | undefined {
  const start = line.indexOf('Watchdog caught collective operation timeout: WorkNCCL(');
  if (start < 0) return undefined;
  const text = line.slice(start);
  const match = /^Watchdog caught collective operation timeout: WorkNCCL\((.*)\) ran for (\d+) milliseconds/.exec(text);
  const work = match?.[1] ?? '';
  const before = line.slice(0, start);
  const rank = optionalInt(BRACKET_RANK.exec(before)?.[1] ?? PREFIX_RANK.exec(before)?.[1]);
  const seqNum = optionalInt(workField(work, 'SeqNum'));
  const opType = workField(work, 'OpType');
  const timeoutMs = optionalInt(workField(work, 'Timeout(ms)'));
  const ranForMs = optionalInt(match?.[2]);
  const message = (rank === undefined ? '' : `rank ${rank}: `) + text.trim();
  return {
    kind: 'nccl_timeout',
    ...(rank === undefined ? {} : { rank }),
    ...(seqNum === undefined ? {} : { seqNum }),
    ...(opType === undefined ? {} : { opType }),
    ...(timeoutMs === undefined ? {} : { timeoutMs }),
    ...(ranForMs === undefined ? {} : { ranForMs }),
    message,
  };
}

/** Lines after an agent `failed (exitcode: …)` line within which a ChildFailedError summary is its own report. */
const AGENT_FAILURE_WINDOW_LINES = 200;
/**
 * Lines within which srun's failure lines belong to one step's failure (they come in one burst),
 * within which a Python exception printed before them is the failed rank's, and after a torchrun
 * report within which srun's line is only torchrun's exit echoed.
 */
const SRUN_WINDOW_LINES = 200;
/** A summary longer than this is cut off and reported as it stands, so one report never holds unbounded memory. */
const MAX_SUMMARY_LINES = 2000;

interface SummaryState {
  script?: string;
  section: 'header' | 'failures' | 'root';
  /** `=====` rules seen: the first opens the summary, the second closes it. */
  rules: number;
  lines: number;
  failures: ChildFailure[];
  rootCause: ChildFailure | undefined;
  current: { -readonly [K in keyof ChildFailure]?: ChildFailure[K] } | undefined;
  lastField: string | undefined;
}

interface PendingAgentFailure {
  readonly failure: ChildFailure;
  readonly binary: string;
  linesLeft: number;
}

/** srun's task failure lines of one step, until the burst is over. */
interface PendingSrunFailure {
  /** Tasks that failed on their own (an exit code, a signal other than the kill that ends a step). */
  readonly failed: ChildFailure[];
  /** Tasks srun or slurmstepd ended because of them. */
  readonly ended: { readonly host: string; readonly tasks: string; readonly how: string }[];
  linesLeft: number;
}

/** `1`, `0-3`, `0,2-3` → the task ids; undefined when the list is not one srun would print. */
function taskIds(list: string): number[] | undefined {
  const ids: number[] = [];
  for (const part of list.split(',')) {
    const match = /^(\d+)(?:-(\d+))?$/.exec(part);
    if (!match) return undefined;
    const from = Number(match[1]);
    const to = match[2] === undefined ? from : Number(match[2]);
    if (to < from || to - from > 4096) return undefined;
    for (let id = from; id <= to; id += 1) ids.push(id);
  }
  return ids;
}

/**
 * Finds error reports in a stream of log lines. Stateful because a torchrun summary spans many
 * lines and is folded into one report; `flush()` ends whatever is still open (end of input, or a
 * pause in the log), `pending` says whether anything is.
 */
export class TrainingErrorParser {
  private summary: SummaryState | undefined;
  private agentFailures: PendingAgentFailure[] = [];
  private srunFailure: PendingSrunFailure | undefined;
  /** Inside a Python traceback: waiting for the exception line that ends it. */
  private inTraceback = false;
  /** The newest Python exception line, and how many lines ago it was seen. */
  private lastException: { text: string; linesAgo: number } | undefined;
  /** Lines since the last torchrun report: srun echoing torchrun's exit is not a second failure. */
  private linesSinceTorchrunReport = Number.POSITIVE_INFINITY;

  get pending(): boolean {
    return this.summary !== undefined || this.agentFailures.length > 0 || this.srunFailure !== undefined;
  }

  push(rawLine: string): TrainingErrorReport[] {
    const reports = this.pushLine(rawLine);
    if (reports.some((report) => report.kind === 'child_failed' && !report.message.startsWith('srun'))) this.linesSinceTorchrunReport = 0;
    return reports;
  }

  private pushLine(rawLine: string): TrainingErrorReport[] {
    const reports: TrainingErrorReport[] = [];
    const line = stripLauncherPrefix(rawLine);
    this.linesSinceTorchrunReport += 1;
    this.notePythonException(rawLine.replace(LAUNCHER_PREFIX_ONLY, ''));
    if (this.summary) {
      if (this.continueSummary(line)) return reports;
      reports.push(this.endSummary());
    }
    this.ageAgentFailures(reports);
    this.ageSrunFailure(reports);

    const srun = SRUN_TASK_FAILURE.exec(line);
    if (srun) {
      this.takeSrunLine(srun[1] ?? '', srun[2] ?? '', srun[3] ?? '');
      return reports;
    }

    if (CHILD_FAILED_START.test(line)) {
      // torchrun logs `failed (exitcode: …)` just before it raises the summary: same failure, one report.
      this.agentFailures = [];
      this.summary = { section: 'header', rules: 0, lines: 0, failures: [], rootCause: undefined, current: undefined, lastField: undefined };
      return reports;
    }
    const timeout = parseNcclTimeout(line);
    if (timeout) {
      reports.push(timeout);
      return reports;
    }
    const agent = AGENT_FAILURE.exec(line);
    if (agent) {
      const exitCode = optionalInt(agent[1]);
      const localRank = optionalInt(agent[2]);
      const pid = optionalInt(agent[3]);
      const failure: ChildFailure = {
        ...(localRank === undefined ? {} : { localRank }),
        ...(exitCode === undefined ? {} : { exitCode }),
        ...(pid === undefined ? {} : { pid }),
      };
      this.agentFailures.push({ failure, binary: agent[4] ?? '', linesLeft: AGENT_FAILURE_WINDOW_LINES });
      return reports;
    }
    const nccl = NCCL_ERROR.exec(line);
    if (nccl) {
      reports.push({ kind: 'nccl_error', message: `NCCL error in: ${nccl[1] ?? ''}` });
      return reports;
    }
    const cuda = CUDA_ERROR.exec(line);
    if (cuda) reports.push({ kind: 'cuda_error', message: `CUDA error: ${cuda[1] ?? ''}` });
    return reports;
  }

  /** Ends every open report: call at the end of input or when the log has gone quiet. */
  flush(): TrainingErrorReport[] {
    const reports: TrainingErrorReport[] = [];
    if (this.summary) reports.push(this.endSummary());
    for (const pending of this.agentFailures) reports.push(this.agentReport(pending));
    this.agentFailures = [];
    if (reports.length > 0) this.linesSinceTorchrunReport = 0;
    const srun = this.endSrunFailure();
    if (srun) reports.push(srun);
    return reports;
  }

  /** Remembers the exception line that ends a Python traceback (the failed rank's, usually). */
  private notePythonException(line: string): void {
    if (this.lastException) this.lastException.linesAgo += 1;
    if (PYTHON_TRACEBACK_START.test(line)) {
      this.inTraceback = true;
      return;
    }
    if (!this.inTraceback || line.trim() === '' || /^\s/.test(line)) return;
    this.inTraceback = false;
    if (PYTHON_EXCEPTION_LINE.test(line.trim())) this.lastException = { text: line.trim().slice(0, 500), linesAgo: 0 };
  }

  private takeSrunLine(host: string, tasks: string, how: string): void {
    // torchrun under srun: the ChildFailedError summary was the report; srun only echoes its exit.
    if (this.linesSinceTorchrunReport <= SRUN_WINDOW_LINES || this.agentFailures.length > 0) return;
    const ids = taskIds(tasks);
    if (ids === undefined) return;
    this.srunFailure ??= { failed: [], ended: [], linesLeft: SRUN_WINDOW_LINES };
    const exit = SRUN_EXIT_CODE.exec(how);
    const exitCode = exit ? Number(exit[1]) : undefined;
    if (SRUN_ENDED_BY_OTHERS.test(how) || exitCode === 0) {
      this.srunFailure.ended.push({ host, tasks, how });
      return;
    }
    for (const rank of ids) this.srunFailure.failed.push({ rank, host, ...(exitCode === undefined ? { traceback: how } : { exitCode }) });
  }

  private ageSrunFailure(reports: TrainingErrorReport[]): void {
    if (!this.srunFailure) return;
    this.srunFailure.linesLeft -= 1;
    if (this.srunFailure.linesLeft >= 0) return;
    const report = this.endSrunFailure();
    if (report) reports.push(report);
  }

  /**
   * One report per failed step, naming the tasks that failed on their own (the first is the root
   * cause: srun prints it first) and the Python exception the log showed last. Only tasks ended by
   * others (a cancelled job, or the kill that `--kill-on-bad-exit` sends) make no report.
   */
  private endSrunFailure(): ChildFailedReport | undefined {
    const pending = this.srunFailure;
    this.srunFailure = undefined;
    if (!pending || pending.failed.length === 0) return undefined;
    const exception = this.lastException && this.lastException.linesAgo <= 2 * SRUN_WINDOW_LINES ? this.lastException.text : undefined;
    const [root, ...others] = pending.failed;
    const describe = (failure: ChildFailure): string =>
      `task ${failure.rank ?? '?'} on ${failure.host ?? '?'} ${failure.exitCode !== undefined ? `exited with exit code ${failure.exitCode}` : `ended: ${failure.traceback ?? '?'}`}`;
    const parts = [`srun: ${root ? describe(root) : 'a task failed'}`];
    if (others.length > 0) parts.push(`also failed: ${others.map(describe).join(', ')}`);
    if (pending.ended.length > 0)
      parts.push(
        `ended with it: ${pending.ended.map((entry) => `task${entry.tasks.includes('-') || entry.tasks.includes(',') ? 's' : ''} ${entry.tasks} on ${entry.host} (${entry.how})`).join(', ')}`,
      );
    if (exception !== undefined) parts.push(exception);
    const failures = exception !== undefined && root ? [{ ...root, traceback: root.traceback ?? exception }, ...others] : pending.failed;
    const ranks = [...new Set(failures.flatMap((failure) => (failure.rank === undefined ? [] : [failure.rank])))];
    return {
      kind: 'child_failed',
      ...(root?.rank === undefined ? {} : { rank: root.rank }),
      ...(root?.exitCode === undefined ? {} : { exitCode: root.exitCode }),
      ranks,
      failures,
      message: parts.join('; '),
    };
  }

  private ageAgentFailures(reports: TrainingErrorReport[]): void {
    if (this.agentFailures.length === 0) return;
    const kept: PendingAgentFailure[] = [];
    for (const pending of this.agentFailures) {
      pending.linesLeft -= 1;
      if (pending.linesLeft < 0) reports.push(this.agentReport(pending));
      else kept.push(pending);
    }
    this.agentFailures = kept;
  }

  private agentReport(pending: PendingAgentFailure): ChildFailedReport {
    return childFailedReport([pending.failure], undefined, `torchrun worker failed (binary ${pending.binary})`);
  }

  /** Takes one line of an open summary; false when the line is not part of it (the summary then ends). */
  private continueSummary(line: string): boolean {
    const summary = this.summary;
    if (!summary) return false;
    summary.lines += 1;
    if (summary.lines > MAX_SUMMARY_LINES) return false;
    const text = line.trim();
    if (/^=+$/.test(text)) {
      summary.rules += 1;
      if (summary.rules < 2) return true;
      this.closeEntry();
      // The closing rule ends the summary; report it now rather than on the next line.
      return false;
    }
    if (text === '') return false;
    if (/^-+$/.test(text) || text === 'Failures:' || text === '<NO_OTHER_FAILURES>') {
      if (text === 'Failures:') summary.section = 'failures';
      return true;
    }
    const failed = /^(\S.*) FAILED$/.exec(text);
    if (failed && summary.section === 'header') {
      summary.script = failed[1];
      return true;
    }
    if (/^Root Cause\b/.test(text)) {
      this.closeEntry();
      summary.section = 'root';
      return true;
    }
    if (/^\[\d+\]:$/.test(text)) {
      this.closeEntry();
      summary.current = {};
      return true;
    }
    const field = /^(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*)$/.exec(text);
    if (field && summary.current) {
      this.setField(summary.current, field[1] ?? '', field[2] ?? '');
      summary.lastField = field[1];
      return true;
    }
    // A traceback read from the worker's error file continues on indented lines.
    if (summary.current && summary.lastField === 'traceback' && /^\s/.test(line)) return true;
    return false;
  }

  private setField(entry: { -readonly [K in keyof ChildFailure]?: ChildFailure[K] }, name: string, value: string): void {
    if (name === 'host') entry.host = value;
    else if (name === 'rank') {
      const match = /^(-?\d+)(?:\s*\(local_rank:\s*(\d+)\))?/.exec(value);
      const rank = optionalInt(match?.[1]);
      const localRank = optionalInt(match?.[2]);
      if (rank !== undefined) entry.rank = rank;
      if (localRank !== undefined) entry.localRank = localRank;
    } else if (name === 'exitcode') {
      const match = /^(-?\d+)(?:\s*\(pid:\s*(\d+)\))?/.exec(value);
      const exitCode = optionalInt(match?.[1]);
      const pid = optionalInt(match?.[2]);
      if (exitCode !== undefined) entry.exitCode = exitCode;
      if (pid !== undefined) entry.pid = pid;
    } else if (name === 'error_file') {
      if (value !== '<N/A>' && value !== '') entry.errorFile = value;
    } else if (name === 'traceback') {
      if (value !== '') entry.traceback = value;
    }
  }

  private closeEntry(): void {
    const summary = this.summary;
    if (!summary?.current) return;
    const entry: ChildFailure = { ...summary.current };
    if (summary.section === 'root') summary.rootCause ??= entry;
    else summary.failures.push(entry);
    summary.current = undefined;
    summary.lastField = undefined;
  }

  private endSummary(): ChildFailedReport {
    this.closeEntry();
    const summary = this.summary;
    this.summary = undefined;
    const headline = `ChildFailedError: ${summary?.script ?? 'worker'} failed`;
    return childFailedReport(summary?.failures ?? [], summary?.rootCause, headline);
  }
}
