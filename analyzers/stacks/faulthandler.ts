import { parsePySpyDump, type PySpyFrame, type PySpyParse, type PySpyProcess, type PySpyThread } from './pyspy.js';

/**
 * Reading CPython `faulthandler` dumps: the stacks a rank writes itself on SIGUSR1 where py-spy
 * cannot be installed (the Python client's `enable_stack_dumps`). Parsed into the same shape as
 * a py-spy dump, so that thread selection, normalisation and aggregation stay one code path.
 *
 * The format (CPython Python/traceback.c, unchanged across 3.x; the real captures are in
 * test/fixtures/realworld/python-faulthandler/):
 *
 *   Thread 0x00007fab84efd6c0 (most recent call first):
 *     File "/usr/lib/python3.11/threading.py", line 320 in wait
 *     File "train.py", line 34 in all_reduce
 *   <blank line>
 *   Current thread 0x00007fab86bc4040 (most recent call first):
 *     File "train.py", line 62 in train
 *
 * Frames innermost first; `???` for an unknown file, line or function; `  ...` after 100 frames;
 * `...` after 100 threads; `  <no Python frame>` for a thread outside Python code. Threads are
 * listed newest first, so the last one of a complete dump is the interpreter's first thread,
 * the main thread: it is named `MainThread` here (faulthandler prints no names), which is what
 * thread selection looks for. Blocks of one dump are separated by a blank line; a dump appended
 * after another starts right after its last frame line, with no blank line between them.
 */

const THREAD_HEADER = /^(Current thread|Thread) (0x[0-9A-Fa-f]{1,16}) \(most recent call first\):\s*$/;
const SINGLE_STACK_HEADER = /^Stack \(most recent call first\):\s*$/;
/** Also found in the middle of a text: a dump inside other output, or several dumps in one text. */
const ANY_HEADER = /^(?:(?:Current thread|Thread) 0x[0-9A-Fa-f]{1,16}|Stack) \(most recent call first\):\s*$/m;
/** Lines faulthandler writes in place of or beside frames; not frames, not garbage either. */
const DETAIL_LINES = new Set(['<no Python frame>', '<tstate is freed>', 'Garbage-collecting', '...']);

/** Whether the text holds a faulthandler dump (rather than py-spy output). */
export function isFaulthandlerDump(text: string): boolean {
  return ANY_HEADER.test(text);
}

/**
 * A rank's stack text as the agent returns it, from py-spy or from faulthandler (one tool per
 * trace of a node, so one format per text): parsed by the parser of the format it holds.
 */
export function parseStackDump(text: string): PySpyParse {
  return isFaulthandlerDump(text) ? parseFaulthandlerDump(text) : parsePySpyDump(text);
}

interface MutableSection {
  readonly threads: PySpyThread[];
  readonly threadIds: Set<string>;
  /** Cut at 100 threads: the main thread may be missing, so no thread is named. */
  truncated: boolean;
}

/**
 * Parses one or several concatenated faulthandler dumps, never throwing on odd text. Each dump
 * becomes one process section (pid and command unknown, as faulthandler prints neither).
 * A thread header opens a new section unless it follows a complete thread block and one blank
 * line, and its thread id is not already in the section. Anything else is counted in
 * `skippedLines` (the client's `# steadfast:` header, `Fatal Python error: …`) and ignored.
 */
export function parseFaulthandlerDump(text: string): PySpyParse {
  const sections: MutableSection[] = [];
  let section: MutableSection | undefined;
  let frames: PySpyFrame[] | undefined;
  /** The last line ended a thread block with a blank line: a header now continues the dump. */
  let betweenBlocks = false;
  let skippedLines = 0;
  let detailLines = 0;

  for (const raw of text.split('\n')) {
    const line = raw.endsWith('\r') ? raw.slice(0, -1) : raw;
    const trimmed = line.trim();
    if (trimmed === '') {
      betweenBlocks = frames !== undefined;
      frames = undefined;
      continue;
    }
    const indented = line.startsWith(' ');
    if (indented && frames !== undefined) {
      const frame = parseFrameLine(trimmed);
      if (frame !== undefined) {
        frames.push(frame);
        continue;
      }
      if (DETAIL_LINES.has(trimmed)) {
        detailLines += 1;
        continue;
      }
    }
    const header = indented ? null : THREAD_HEADER.exec(line);
    const single = header === null && !indented && SINGLE_STACK_HEADER.test(line);
    if (header !== null || single) {
      const id = header?.[2]?.toLowerCase() ?? 'stack';
      if (section === undefined || !betweenBlocks || section.threadIds.has(id) || single) {
        section = { threads: [], threadIds: new Set(), truncated: false };
        sections.push(section);
      }
      frames = [];
      section.threadIds.add(id);
      section.threads.push({ id, state: header?.[1] === 'Current thread' || single ? 'current' : 'unknown', name: null, frames });
      betweenBlocks = false;
      continue;
    }
    if (trimmed === '...' && section !== undefined && betweenBlocks) {
      // The 100-thread limit: the dump ends here.
      section.truncated = true;
      detailLines += 1;
      betweenBlocks = false;
      continue;
    }
    skippedLines += 1;
    frames = undefined;
    betweenBlocks = false;
  }

  const processes: PySpyProcess[] = sections.map((found) => ({
    pid: null,
    command: null,
    python: null,
    threads: found.truncated || found.threads.length === 0 ? found.threads : nameMainThread(found.threads),
  }));
  return { processes, skippedLines, detailLines };
}

function nameMainThread(threads: readonly PySpyThread[]): PySpyThread[] {
  const last = threads.length - 1;
  return threads.map((thread, index) => (index === last && thread.id !== 'stack' ? { ...thread, name: 'MainThread' } : thread));
}

const FILE_PREFIX = 'File ';
const LINE_MARK = ', line ';
const IN_MARK = ' in ';

/**
 * `File "<path>", line <n> in <function>` (leading blanks removed), `???` standing for an
 * unknown path, line or function. The path is the text up to the LAST `", line ` of the line,
 * as a path may hold quotes and commas of its own.
 */
function parseFrameLine(line: string): PySpyFrame | undefined {
  if (!line.startsWith(FILE_PREFIX)) return undefined;
  const lineMark = line.lastIndexOf(LINE_MARK);
  if (lineMark < FILE_PREFIX.length) return undefined;
  const location = line.slice(FILE_PREFIX.length, lineMark);
  let file: string;
  if (location === '???') file = '???';
  else if (location.length >= 2 && location.startsWith('"') && location.endsWith('"')) file = location.slice(1, -1);
  else return undefined;
  const afterLine = lineMark + LINE_MARK.length;
  const inMark = line.indexOf(IN_MARK, afterLine);
  if (inMark < 0) return undefined;
  const number = line.slice(afterLine, inMark);
  let lineNumber: number | null;
  if (number === '???') lineNumber = null;
  else if (/^\d{1,9}$/.test(number)) lineNumber = Number(number);
  else return undefined;
  const name = line.slice(inMark + IN_MARK.length);
  if (name === '') return undefined;
  return { function: name, file, line: lineNumber };
}
