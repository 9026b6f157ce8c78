/**
 * Reading `py-spy dump` text: the on-demand tracer's output that stack aggregation compares
 * (ByteRobust §5.1, §7: the tracer is built on py-spy). Three pure steps:
 *   1. parsePySpyDump: text → processes → threads → frames, never throwing on odd text;
 *   2. selectTrainingThread: the thread that runs the training loop of the rank, not a
 *      dataloader worker, pin-memory thread, checkpoint writer or launcher;
 *   3. normaliseFrame: a frame as `function (module/path.py)`, so that the same code path on two
 *      machines compares equal whatever the install prefix or line number.
 */

export interface PySpyFrame {
  readonly function: string;
  /** As printed: `torch/distributed/distributed_c10d.py`, `/usr/lib/python3.10/threading.py`, `libc.so.6`, `?`. */
  readonly file: string;
  readonly line: number | null;
}

export interface PySpyThread {
  /** Decimal or `0x…` thread id, as printed. */
  readonly id: string;
  /** `active`, `idle`, `active+gil`, … */
  readonly state: string;
  readonly name: string | null;
  /** Innermost (top) frame first, as py-spy prints them. */
  readonly frames: readonly PySpyFrame[];
}

export interface PySpyProcess {
  readonly pid: number | null;
  readonly command: string | null;
  readonly python: string | null;
  readonly threads: readonly PySpyThread[];
}

export interface PySpyParse {
  /** In file order; a later section of the same process is a later dump. */
  readonly processes: readonly PySpyProcess[];
  /** Non-blank lines that were neither a header nor a frame (comments, errors, garbage). */
  readonly skippedLines: number;
  /** `--locals` detail lines under a frame (`Arguments:`, `Locals:` and their values). */
  readonly detailLines: number;
}

const THREAD_HEADER = /^Thread\s+(0x[0-9A-Fa-f]+|\d+)\s+\(([A-Za-z+ ]*)\)(?::\s*"(.*)")?\s*$/;
const PROCESS_HEADER = /^Process\s+(\d+):\s?(.*)$/;
const PYTHON_HEADER = /^Python\s+v(\S+)/;

interface MutableProcess {
  pid: number | null;
  command: string | null;
  python: string | null;
  threads: PySpyThread[];
  threadIds: Set<string>;
}

/**
 * Parses one or several concatenated `py-spy dump` outputs. Headers (`Process N: cmd`,
 * `Python vX.Y`) open a process section; `Thread …` headers open threads; indented
 * `function (file:line)` lines are frames. Several Thread headers directly above one stack all
 * share that stack (the hand-grouped form of the BLOOM-176B notes). A thread id seen twice in a
 * section starts a new section: the next dump of the same process. Anything else is counted in
 * `skippedLines` and ignored.
 */
export function parsePySpyDump(text: string): PySpyParse {
  const processes: MutableProcess[] = [];
  let current: MutableProcess | null = null;
  /** Frames shared by the threads whose headers came last, while no other line came between. */
  let openFrames: PySpyFrame[] | null = null;
  let openHasFrames = false;
  let frameIndent = -1;
  let skippedLines = 0;
  let detailLines = 0;

  // Index-based scan: no per-line strings, only the slices a frame or header keeps.
  for (let lineStart = 0; lineStart <= text.length;) {
    let lineEnd = text.indexOf('\n', lineStart);
    if (lineEnd < 0) lineEnd = text.length;
    const next = lineEnd + 1;
    if (lineEnd > lineStart && text.charCodeAt(lineEnd - 1) === 13) lineEnd -= 1;
    let first = lineStart;
    while (first < lineEnd && isBlank(text.charCodeAt(first))) first += 1;
    const indent = first - lineStart;
    if (first === lineEnd) {
      lineStart = next;
      continue;
    }

    if (indent > 0 && openFrames !== null) {
      if (openHasFrames && indent > frameIndent) {
        detailLines += 1;
        lineStart = next;
        continue;
      }
      const frame = parseFrame(text, first, lineEnd);
      if (frame && (!openHasFrames || indent === frameIndent)) {
        if (!openHasFrames) frameIndent = indent;
        openFrames.push(frame);
        openHasFrames = true;
        lineStart = next;
        continue;
      }
    }
    lineStart = next;

    const thread = text.startsWith('Thread', first) ? THREAD_HEADER.exec(text.slice(first, lineEnd)) : null;
    if (thread) {
      const id = thread[1] as string;
      if (current === null || current.threadIds.has(id)) {
        // The same thread again: the next dump of this process.
        current = openSection(processes, current?.pid ?? null, current?.command ?? null, current?.python ?? null);
        openFrames = null;
      }
      if (openFrames === null || openHasFrames) {
        openFrames = [];
        openHasFrames = false;
      }
      current.threadIds.add(id);
      current.threads.push({ id, state: (thread[2] as string).trim(), name: thread[3] ?? null, frames: openFrames });
      continue;
    }
    const processHeader = text.startsWith('Process', first) ? PROCESS_HEADER.exec(text.slice(first, lineEnd)) : null;
    if (processHeader) {
      current = openSection(processes, Number(processHeader[1]), (processHeader[2] ?? '').trim() || null, null);
      openFrames = null;
      continue;
    }
    const python = text.startsWith('Python', first) ? PYTHON_HEADER.exec(text.slice(first, lineEnd)) : null;
    if (python) {
      // py-spy prints the Python line right after the Process line; alone, it opens a section.
      if (current === null || current.threads.length > 0) {
        current = openSection(processes, null, null, null);
        openFrames = null;
      }
      current.python = python[1] as string;
      continue;
    }
    skippedLines += 1;
    openFrames = null;
  }

  return {
    processes: processes.filter((section) => section.threads.length > 0).map(({ pid, command, python, threads }) => ({ pid, command, python, threads })),
    skippedLines,
    detailLines,
  };
}

function openSection(processes: MutableProcess[], pid: number | null, command: string | null, python: string | null): MutableProcess {
  const section: MutableProcess = { pid, command, python, threads: [], threadIds: new Set() };
  processes.push(section);
  return section;
}

function isBlank(code: number): boolean {
  return code === 32 || code === 9;
}

/**
 * `function (location)` in text[start, end), where location is `file:line`, `file` or `?`. The
 * location is the last parenthesised part: C++ function names (`--native`) may hold parentheses
 * of their own, file names do not. A forward native indexOf within the line finds it fast (a
 * frame line is mostly its location); a second `(` sends the line to an exact backward scan.
 */
function parseFrame(text: string, start: number, end: number): PySpyFrame | null {
  while (end > start && isBlank(text.charCodeAt(end - 1))) end -= 1;
  if (text.charCodeAt(end - 1) !== 41 /* ) */) return null;
  // Searching a slice of the line keeps every search within the line, however odd the text.
  const line = text.slice(start, end);
  const close = line.length - 1;
  let open = line.indexOf(' (') + 1;
  if (open <= 0) return null;
  if (line.indexOf('(', open + 1) !== -1) {
    open = close - 1;
    while (open > 0 && line.charCodeAt(open) !== 40 /* ( */) open -= 1;
  }
  let nameEnd = open;
  while (nameEnd > 0 && isBlank(line.charCodeAt(nameEnd - 1))) nameEnd -= 1;
  if (nameEnd === open || nameEnd === 0 || open + 1 === close) return null;
  // A trailing `:digits` is the line number.
  let number = 0;
  let scale = 1;
  let colon = close - 1;
  while (colon > open && line.charCodeAt(colon) >= 48 && line.charCodeAt(colon) <= 57) {
    number += (line.charCodeAt(colon) - 48) * scale;
    scale *= 10;
    colon -= 1;
  }
  const hasLine = colon > open + 1 && colon < close - 1 && line.charCodeAt(colon) === 58; /* : */
  return {
    function: line.slice(0, nameEnd),
    file: line.slice(open + 1, hasLine ? colon : close),
    line: hasLine ? number : null,
  };
}

const SITE_DIRS = ['/site-packages/', '/dist-packages/'];
const STDLIB_DIR = /\/lib\/python\d+(?:\.\d+)?\//;
const ADDRESS = /^0x[0-9A-Fa-f]+$/;
/** Path components kept of an absolute path that is neither an install nor the stdlib. */
const KEPT_COMPONENTS = 3;

/**
 * The module path of a frame without what differs between machines: the install prefix
 * (`…/site-packages/`, `…/dist-packages/`, `…/lib/python3.10/`), the checkout root of other
 * absolute paths (only the last three components stay), shared-library versions
 * (`libcudart.so.12` → `libcudart.so`) and Windows separators.
 */
export function normaliseModulePath(file: string): string {
  let path = file.includes('\\') ? file.replaceAll('\\', '/') : file;
  for (const marker of SITE_DIRS) {
    const at = path.lastIndexOf(marker);
    if (at >= 0) return path.slice(at + marker.length);
  }
  const stdlib = STDLIB_DIR.exec(path);
  if (stdlib) return path.slice(stdlib.index + stdlib[0].length);
  const soVersion = path.indexOf('.so.');
  if (soVersion > 0 && !path.includes('/')) path = path.slice(0, soVersion + 3);
  if (path.startsWith('/') || /^[A-Za-z]:\//.test(path)) {
    const components = path.split('/').filter((part) => part !== '');
    return components.slice(-KEPT_COMPONENTS).join('/');
  }
  return path;
}

/**
 * One frame as `function (module/path.py)`, the unit stacks are compared in. Native frames known
 * only by address (`0x7caaa50b1a9b (?)`) differ between machines by address-space layout and say
 * nothing about the code path, so they are dropped (null).
 */
export function normaliseFrame(frame: PySpyFrame): string | null {
  if (ADDRESS.test(frame.function)) return null;
  return `${frame.function} (${normaliseModulePath(frame.file)})`;
}

const TRAINING = 1;
const HELPER = 2;
const CHILD = 4;

/**
 * What a frame's file says about its thread: HELPER for the loops of helpers that are never the
 * training loop (dataloader worker, pin memory, torchrun's elastic agent and launcher, inductor
 * compile workers, multiprocessing's resource tracker and forkserver); TRAINING for model,
 * optimiser and collective code (torch.distributed, nn, autograd, optim, cuda; Megatron,
 * DeepSpeed, Apex, Transformer Engine); CHILD for a process started by `multiprocessing` — a
 * spawned trainer (`mp.spawn`) lives there, but so do async checkpoint writers. Prefix tests at
 * the `torch/` offset keep this cheap, and once TRAINING is known the library names are not
 * searched again: it runs on every frame of every thread.
 */
function frameKind(file: string, trainingKnown: boolean): number {
  const torch = file.indexOf('torch/');
  if (torch >= 0) {
    const rest = torch + 6;
    if (file.startsWith('distributed/', rest)) {
      const inner = rest + 12;
      return file.startsWith('elastic/agent/', inner) || file.startsWith('launcher/', inner) || file.startsWith('run.py', inner) ? HELPER : TRAINING;
    }
    if (file.startsWith('utils/data/_utils/', rest)) {
      const inner = rest + 18;
      if (file.startsWith('worker.py', inner) || file.startsWith('pin_memory.py', inner)) return HELPER;
    }
    if (file.startsWith('_inductor/compile_worker/', rest)) return HELPER;
    for (const area of TORCH_TRAINING_AREAS) if (file.startsWith(area, rest)) return TRAINING;
  }
  if (!trainingKnown) for (const library of TRAINING_LIBRARIES) if (file.includes(library)) return TRAINING;
  const multiprocessing = file.indexOf('multiprocessing/');
  if (multiprocessing >= 0) {
    const inner = multiprocessing + 16;
    if (file.startsWith('resource_tracker.py', inner) || file.startsWith('forkserver.py', inner)) return HELPER;
    if (file.startsWith('spawn.py', inner) || file.startsWith('process.py', inner)) return CHILD;
  }
  return 0;
}
const TORCH_TRAINING_AREAS = ['nn/', 'autograd/', 'optim/', 'cuda/', '_tensor.py'];
const TRAINING_LIBRARIES = ['megatron/', 'deepspeed/', 'apex/', 'transformer_engine/'];

export interface TrainingThread {
  readonly process: PySpyProcess;
  readonly thread: PySpyThread;
  /** Index of the process section in the parse: later sections are later dumps. */
  readonly section: number;
}

/**
 * The thread that runs the rank's training loop (ByteRobust §5.1 step 1 tells training
 * processes from their helpers). Scored, highest wins: a thread named `MainThread` +4; frames
 * from model / optimiser / collective code +2; frames of a helper loop (dataloader worker,
 * pin memory, torchrun's elastic agent, inductor compile worker) −8; frames of a
 * `multiprocessing` child −1. Threads with no frames are never chosen. Ties go to the later
 * section, i.e. the newest of several concatenated dumps, then to the earlier thread in it
 * (py-spy lists the main thread first).
 */
export function selectTrainingThread(parse: PySpyParse): TrainingThread | null {
  let best: TrainingThread | null = null;
  let bestScore = Number.NEGATIVE_INFINITY;
  for (let section = 0; section < parse.processes.length; section += 1) {
    const process = parse.processes[section] as PySpyProcess;
    let sectionBest: PySpyThread | null = null;
    let sectionScore = Number.NEGATIVE_INFINITY;
    for (const thread of process.threads) {
      if (thread.frames.length === 0) continue;
      const score = threadScore(thread);
      if (score > sectionScore) {
        sectionBest = thread;
        sectionScore = score;
      }
    }
    if (sectionBest !== null && sectionScore >= bestScore) {
      best = { process, thread: sectionBest, section };
      bestScore = sectionScore;
    }
  }
  return best;
}

function threadScore(thread: PySpyThread): number {
  let kinds = 0;
  for (const frame of thread.frames) {
    kinds |= frameKind(frame.file, (kinds & TRAINING) !== 0);
    if (kinds & HELPER) break;
  }
  const role = kinds & HELPER ? -8 : kinds & TRAINING ? 2 : 0;
  return (thread.name === 'MainThread' ? 4 : 0) + role + (kinds & CHILD ? -1 : 0);
}
