import { constants as fsConstants, watch, type FSWatcher } from 'node:fs';
import { open, stat, type FileHandle } from 'node:fs/promises';
import type { Stats } from 'node:fs';
import type { Logger } from '../core/log.js';

/**
 * Follows a log for the collectors that read one line at a time: the kernel log (`xid`) and
 * training logs (`training`). Shared so that polling, inotify wake-up and rotation are solved once.
 */

/** Large enough for one /dev/kmsg record (the kernel caps a record at about 8 KiB with its dictionary). */
const KMSG_RECORD_BYTES = 16 * 1024;
/** Read a big file in slices so one poll never holds a huge buffer. */
const FILE_SLICE_BYTES = 4 * 1024 * 1024;
/** Upper bound of records read in one go, so a log flood cannot keep one poll running forever. */
const MAX_RECORDS_PER_POLL = 100_000;
/** /dev/kmsg is character device 1:11 (kernel Documentation/admin-guide/devices.txt), `makedev(1, 11)`. */
const KMSG_DEVICE_NUMBER = 0x10b;
/**
 * Another character device or a FIFO is read as a stream of lines, and may never run dry
 * (`/dev/zero`, a FIFO whose writer keeps writing): one read of it stops at this many bytes or
 * this long, whichever comes first, and the rest waits for the next poll.
 */
const STREAM_PASS_BYTES = 8 * 1024 * 1024;
const STREAM_PASS_MS = 2000;
const STREAM_CHUNK_BYTES = 64 * 1024;
/** A longer line is cut here; the rest up to its newline is dropped (no kernel or training log line comes near). */
const MAX_LINE_BYTES = 1024 * 1024;

/**
 * Where a line was read, so that a reader can tell a line it handled before (in an earlier run of
 * the agent) from a new one. `firstRead`: the line was already there when the follower opened this
 * log (or this generation of the file); lines written while it follows have `firstRead: false`.
 */
export type LogPosition =
  | {
      /** /dev/kmsg; also another character device or a FIFO, read as a stream whose lines have no sequence number. */
      readonly source: 'kmsg';
      /** The record's sequence number (kernel Documentation/ABI/testing/dev-kmsg); undefined when the header had none. */
      readonly sequence: number | undefined;
      readonly firstRead: boolean;
    }
  | {
      readonly source: 'file';
      readonly ino: number;
      /** Counts the times the follower started the file over (rotation, truncation, re-creation), from 0. */
      readonly generation: number;
      /** Byte offset just past the line (past its newline, when it has one). */
      readonly end: number;
      readonly firstRead: boolean;
    };

export type LineHandler = (line: string, position: LogPosition) => void;

export interface StreamPassBounds {
  readonly bytes: number;
  readonly ms: number;
}

export function errnoCode(error: unknown): string | undefined {
  return error instanceof Error && 'code' in error && typeof error.code === 'string' ? error.code : undefined;
}

/**
 * Follows a log. /dev/kmsg is read record by record without blocking, until the kernel has no more
 * (EAGAIN); a regular file is read from its start and then polled for appended data, starting over
 * when it shrinks or is replaced (log rotation); any other character device or a FIFO is read as a
 * stream of lines without blocking, at most STREAM_PASS_BYTES or STREAM_PASS_MS per read, and a read
 * cut short says so in the log. Errors are kept for `update()` to report; the follower itself never
 * stops until closed. `start()` resolves once everything present at start was read (for a stream:
 * once its first bounded read ended), so `--once` and `steadfast check` always return.
 */
export class LogFollower {
  private timer: NodeJS.Timeout | undefined;
  private closed = false;
  private running: Promise<void> | undefined;
  private inFlight = false;
  /** A change was signalled while a poll was running: poll again straight after it. */
  private wokenDuringPoll = false;
  private watcher: FSWatcher | undefined;
  private kmsg: FileHandle | undefined;
  /** Highest /dev/kmsg sequence number handled, so a reopen does not count records twice. */
  private lastSequence = -1;
  /** Records read from /dev/kmsg since it was opened: the first read takes what was there already. */
  private kmsgReads = 0;
  private file: FileState | undefined;
  private stream: StreamState | undefined;
  private generation = -1;
  lastError: Error | undefined;

  constructor(
    private readonly path: string,
    private readonly intervalMs: number,
    private readonly onLine: LineHandler,
    private readonly logger: Logger,
    /** What the log is, for log messages: `kernel log`, `training log`. */
    private readonly what = 'log',
    /** Called after every read of the log, once the lines it found were handed to onLine. */
    private readonly onReadEnd?: () => void,
    /** The bounds of one read of a stream (another character device, a FIFO); tests make them small. */
    private readonly streamPass: StreamPassBounds = { bytes: STREAM_PASS_BYTES, ms: STREAM_PASS_MS },
  ) {}

  async start(): Promise<void> {
    await this.poll(true);
    this.watchForChanges();
    this.schedule();
  }

  async close(): Promise<void> {
    this.closed = true;
    this.watcher?.close();
    if (this.timer) clearTimeout(this.timer);
    await this.running;
    await this.closeKmsg();
    await this.closeStream();
  }

  /**
   * While inotify watches the file, polling is only the safety net (rotation, a missed event),
   * so it can be ten times slower; without a watch it is the only way to see new lines.
   */
  private get pollIntervalMs(): number {
    return this.watcher ? this.intervalMs * 10 : this.intervalMs;
  }

  private schedule(delayMs = this.pollIntervalMs): void {
    if (this.closed) return;
    this.timer = setTimeout(() => this.pollNow(), delayMs);
    // The agent's HTTP server keeps the process alive; this timer alone must not.
    this.timer.unref();
  }

  private pollNow(): void {
    this.timer = undefined;
    this.inFlight = true;
    this.running = this.poll(false).finally(() => {
      this.inFlight = false;
      const again = this.wokenDuringPoll;
      this.wokenDuringPoll = false;
      this.schedule(again ? 0 : this.pollIntervalMs);
    });
  }

  /**
   * A plain log file is also watched (inotify), so a new line is read within milliseconds
   * instead of at the next poll; polling stays as the fallback for rotation and missed events.
   */
  private watchForChanges(): void {
    if (this.kmsg !== undefined || this.file === undefined) return;
    try {
      this.watcher = watch(this.path, { persistent: false }, () => this.wake());
      this.watcher.on('error', (error) => {
        this.logger.debug({ path: this.path, err: error }, `${this.what} watch ended; polling only`);
        this.watcher?.close();
        this.watcher = undefined;
      });
    } catch (error) {
      this.logger.debug({ path: this.path, err: error }, `cannot watch ${this.what}; polling only`);
    }
  }

  private wake(): void {
    if (this.closed) return;
    if (this.inFlight) {
      this.wokenDuringPoll = true;
      return;
    }
    if (this.timer) clearTimeout(this.timer);
    this.pollNow();
  }

  private async poll(initial: boolean): Promise<void> {
    try {
      const info = await stat(this.path);
      if (info.isCharacterDevice() && info.rdev === KMSG_DEVICE_NUMBER) await this.readKmsg();
      else if (info.isCharacterDevice() || info.isFIFO()) await this.readStream(info);
      else if (info.isFile()) await this.readFile(info, initial);
      else throw new Error(`${this.path} is neither a regular file, a character device nor a FIFO`);
      if (this.lastError) this.logger.info({ path: this.path }, `${this.what} readable again`);
      this.lastError = undefined;
    } catch (error) {
      const failure = error instanceof Error ? error : new Error(String(error));
      if (this.lastError?.message !== failure.message) {
        this.logger.warn({ path: this.path, err: failure }, `cannot read ${this.what}`);
      }
      this.lastError = failure;
      // A missing file starts over from its beginning once it exists.
      if (errnoCode(error) === 'ENOENT') this.file = undefined;
      await this.closeKmsg();
      await this.closeStream();
    } finally {
      this.onReadEnd?.();
    }
  }

  /** /dev/kmsg hands out one record per read(2) (kernel Documentation/ABI/testing/dev-kmsg). */
  private async readKmsg(): Promise<void> {
    // Non-blocking, so that a quiet kernel log never parks a libuv thread-pool thread in read(2).
    if (this.kmsg === undefined) {
      this.kmsg = await open(this.path, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK);
      this.kmsgReads = 0;
    }
    const firstRead = this.kmsgReads === 0;
    this.kmsgReads += 1;
    const buffer = Buffer.alloc(KMSG_RECORD_BYTES);
    for (let records = 0; records < MAX_RECORDS_PER_POLL && !this.closed; records += 1) {
      let bytesRead: number;
      try {
        ({ bytesRead } = await this.kmsg.read(buffer, 0, buffer.length, null));
      } catch (error) {
        if (errnoCode(error) === 'EAGAIN') return;
        // EPIPE: records were overwritten in the ring buffer before we read them; the next read goes on.
        if (errnoCode(error) === 'EPIPE') {
          this.logger.warn({ path: this.path }, `${this.what} records were lost before they could be read`);
          continue;
        }
        throw error;
      }
      if (bytesRead === 0) return;
      this.handleKmsgRecord(buffer.toString('utf8', 0, bytesRead), firstRead);
    }
  }

  private handleKmsgRecord(record: string, firstRead: boolean): void {
    // `prio,seq,usec,flags;message\n` then ` KEY=value` dictionary lines, which are not message text.
    const firstLine = record.split('\n', 1)[0] ?? '';
    const parsed = Number(/^\d+,(\d+),/.exec(firstLine)?.[1] ?? Number.NaN);
    const sequence = Number.isSafeInteger(parsed) ? parsed : undefined;
    if (sequence !== undefined) {
      if (sequence <= this.lastSequence) return;
      this.lastSequence = sequence;
    }
    const position: LogPosition = { source: 'kmsg', sequence, firstRead };
    // The kernel escapes newlines inside a record as `\x0a`; each piece is a log line of its own.
    for (const line of firstLine.split('\\x0a')) this.onLine(line, position);
  }

  private async closeKmsg(): Promise<void> {
    const handle = this.kmsg;
    this.kmsg = undefined;
    try {
      await handle?.close();
    } catch (error) {
      // Nothing left to do with a descriptor that will not close; say so and carry on.
      this.logger.warn({ path: this.path, err: error }, `cannot close ${this.what}`);
    }
  }

  /**
   * A character device other than /dev/kmsg, or a FIFO: read without blocking until it has nothing
   * more for now (EAGAIN), reports its end (0 bytes: a FIFO without a writer), or the read has taken
   * its bound. What was read is split into lines like a file's; a line not yet ended waits for the
   * next read. Nothing tells one line from an equal later one, so lines carry no sequence number.
   */
  private async readStream(info: Stats): Promise<void> {
    if (this.stream !== undefined && this.stream.ino !== info.ino) await this.closeStream();
    if (this.stream === undefined) {
      // Non-blocking: an idle FIFO or device must never park a thread-pool thread in read(2), nor open(2) wait for a writer.
      const handle = await open(this.path, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK);
      this.stream = { handle, ino: info.ino, reads: 0, partial: [], partialBytes: 0, cutWarned: false };
    }
    const stream = this.stream;
    const firstRead = stream.reads === 0;
    stream.reads += 1;
    const position: LogPosition = { source: 'kmsg', sequence: undefined, firstRead };
    const buffer = Buffer.alloc(STREAM_CHUNK_BYTES);
    const started = Date.now();
    let bytes = 0;
    while (!this.closed) {
      if (bytes >= this.streamPass.bytes || Date.now() - started >= this.streamPass.ms) {
        if (!stream.cutWarned) {
          stream.cutWarned = true;
          this.logger.warn(
            { path: this.path, bytes, ms: Date.now() - started },
            `${this.what} is a character device or FIFO that did not run dry: each read of it stops at ${this.streamPass.bytes} bytes or ${this.streamPass.ms} ms, and the rest waits for the next read`,
          );
        }
        return;
      }
      let bytesRead: number;
      try {
        ({ bytesRead } = await stream.handle.read(buffer, 0, buffer.length, null));
      } catch (error) {
        if (errnoCode(error) === 'EAGAIN') break;
        throw error;
      }
      if (bytesRead === 0) break;
      bytes += bytesRead;
      splitLines(stream, buffer.subarray(0, bytesRead), (line) => this.onLine(line.toString('utf8'), position));
    }
    // As for a file: what was waiting at the first read is complete, and a line that got no more
    // bytes since the last read will not grow; a line whose start just came may still be written on.
    if (this.closed || (!firstRead && bytes > 0)) return;
    const rest = takePartial(stream);
    if (rest !== undefined) this.onLine(rest.toString('utf8'), position);
  }

  private async closeStream(): Promise<void> {
    const handle = this.stream?.handle;
    this.stream = undefined;
    try {
      await handle?.close();
    } catch (error) {
      this.logger.warn({ path: this.path, err: error }, `cannot close ${this.what}`);
    }
  }

  private async readFile(info: Stats, initial: boolean): Promise<void> {
    const replaced = this.file !== undefined && this.file.ino !== info.ino;
    const truncated = this.file !== undefined && info.size < this.file.offset;
    if (replaced || truncated) {
      this.logger.info({ path: this.path, replaced, truncated }, `${this.what} file rotated; reading it from the start`);
    }
    if (!this.file || replaced || truncated) {
      this.generation += 1;
      this.file = { ino: info.ino, generation: this.generation, offset: 0, partial: [], partialBytes: 0, firstRead: true };
    }
    const state = this.file;
    try {
      if (info.size > state.offset) {
        const handle = await open(this.path, 'r');
        try {
          while (state.offset < info.size && !this.closed) {
            const length = Math.min(FILE_SLICE_BYTES, info.size - state.offset);
            const buffer = Buffer.alloc(length);
            const { bytesRead } = await handle.read(buffer, 0, length, state.offset);
            if (bytesRead === 0) break;
            this.takeLines(state, buffer.subarray(0, bytesRead));
          }
        } finally {
          await handle.close();
        }
        // Content present at start is complete: a last line without a newline is still a line.
        if (initial) this.flushPartial(state);
      } else {
        // Nothing was appended since the last poll, so a line without its newline will not grow.
        this.flushPartial(state);
      }
    } finally {
      state.firstRead = false;
    }
  }

  /**
   * Splits at newline bytes, not characters, so that every line's end is its exact byte offset
   * in the file; each line is decoded on its own (a sequence that is not UTF-8 becomes U+FFFD).
   */
  private takeLines(state: FileState, chunk: Buffer): void {
    splitLines(state, chunk, (bytes, newlineAt) => this.emitFileLine(state, bytes, state.offset + newlineAt + 1));
    state.offset += chunk.length;
  }

  private flushPartial(state: FileState): void {
    const bytes = takePartial(state);
    if (bytes !== undefined) this.emitFileLine(state, bytes, state.offset);
  }

  private emitFileLine(state: FileState, bytes: Buffer, end: number): void {
    this.onLine(bytes.toString('utf8'), { source: 'file', ino: state.ino, generation: state.generation, end, firstRead: state.firstRead });
  }
}

/** The start of a line whose newline has not been read yet, at most MAX_LINE_BYTES of it. */
interface PartialLine {
  partial: Buffer[];
  partialBytes: number;
}

interface FileState extends PartialLine {
  readonly ino: number;
  readonly generation: number;
  /** Bytes read so far; the next read starts here. */
  offset: number;
  /** Still in the first read of this generation of the file. */
  firstRead: boolean;
}

interface StreamState extends PartialLine {
  readonly handle: FileHandle;
  readonly ino: number;
  /** Reads since it was opened: the first takes what was waiting already. */
  reads: number;
  /** A read was cut short and said so; said once per opening, not at every poll. */
  cutWarned: boolean;
}

/**
 * Splits at newline bytes, not characters, so that a file line's end is its exact byte offset
 * (`newlineAt`, in `chunk`); each line is decoded on its own by the caller.
 */
function splitLines(state: PartialLine, chunk: Buffer, onLine: (bytes: Buffer, newlineAt: number) => void): void {
  let start = 0;
  for (let newline = chunk.indexOf(10); newline >= 0; newline = chunk.indexOf(10, start)) {
    const piece = chunk.subarray(start, newline);
    if (state.partial.length === 0) {
      onLine(piece.length > MAX_LINE_BYTES ? piece.subarray(0, MAX_LINE_BYTES) : piece, newline);
    } else {
      keepPartial(state, piece);
      onLine(takePartial(state) ?? piece, newline);
    }
    start = newline + 1;
  }
  if (start < chunk.length) keepPartial(state, chunk.subarray(start));
}

function keepPartial(state: PartialLine, piece: Buffer): void {
  const room = MAX_LINE_BYTES - state.partialBytes;
  if (room <= 0 || piece.length === 0) return;
  const kept = piece.length > room ? piece.subarray(0, room) : piece;
  state.partial.push(Buffer.from(kept));
  state.partialBytes += kept.length;
}

function takePartial(state: PartialLine): Buffer | undefined {
  if (state.partial.length === 0) return undefined;
  const bytes = state.partial.length === 1 ? (state.partial[0] ?? Buffer.alloc(0)) : Buffer.concat(state.partial);
  state.partial = [];
  state.partialBytes = 0;
  return bytes;
}
