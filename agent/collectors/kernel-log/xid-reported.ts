import { lazyCrypto } from '../../../core/lazy-crypto.js';
import { mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { z } from 'zod';
import { errorMessage } from '../../../core/errors.js';
import type { Logger } from '../../../core/log.js';
import { describeIssues } from '../../../core/validate.js';
import { errnoCode, type LogPosition } from '../../log-follower.js';
import type { XidEvent } from '../../sources/kernel-log.js';

/**
 * What the `xid` collector has already reported on the fast path, kept in a small state file
 * across agent restarts, so that each fatal Xid is reported once per occurrence. Without it, an
 * agent restarted on the same boot reads the same Xid back from the kernel log and reports it
 * again; once the controller's `policy.drainDedupeSeconds` have passed, that drains again a node
 * an operator resumed.
 *
 * An occurrence is identified by:
 * - /dev/kmsg: the boot id (`<procfs>/sys/kernel/random/boot_id`) and the record's sequence
 *   number, which the kernel counts from 0 at every boot;
 * - a plain log file (dmesg or journalctl text, syslog), which has no sequence number: the
 *   SHA-256 of the line and how many lines of that same text come before it in the file. The
 *   line carries its time stamp, so this survives the agent's restart, and a file rewritten
 *   with the same content, without trusting byte offsets or inode numbers.
 *
 * The file records the last occurrence the controller accepted (2xx). Occurrences are reported
 * in log order, so everything up to it is history when the agent starts again.
 */

const SHA256_HEX = /^[0-9a-f]{64}$/;
const BOOT_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

const occurrenceSchema = z.discriminatedUnion('source', [
  z.object({ source: z.literal('kmsg'), sequence: z.number().int().min(0) }).strict(),
  z.object({ source: z.literal('file'), lineSha256: z.string().regex(SHA256_HEX), occurrence: z.number().int().min(1) }).strict(),
]);

export type Occurrence = z.infer<typeof occurrenceSchema>;

export const xidStateSchema = z
  .object({
    version: z.literal(1),
    /** The log the agent followed when it wrote the file; a state about another log is ignored. */
    log: z.string().min(1),
    /** The boot the occurrence belongs to; null when the agent could not read it. */
    bootId: z.string().regex(BOOT_ID).nullable(),
    last: occurrenceSchema,
    /** For the person reading the file: what the last report was, and when it was accepted. */
    xid: z.number().int().min(0),
    gpu: z.string().max(64),
    reportedAt: z.iso.datetime({ offset: true }),
  })
  .strict();

export type XidState = z.infer<typeof xidStateSchema>;

/** The file that holds the boot id, under a procfs root (`--path.procfs`). */
export function bootIdPath(procfs: string): string {
  return join(procfs, 'sys', 'kernel', 'random', 'boot_id');
}

/** Reads and checks the boot id; undefined (with the reason) when it cannot be had. */
export async function readBootId(path: string): Promise<{ bootId: string } | { error: string }> {
  try {
    const text = (await readFile(path, 'utf8')).trim();
    return BOOT_ID.test(text) ? { bootId: text } : { error: `${path} does not hold a boot id: "${text.slice(0, 60)}"` };
  } catch (error) {
    return { error: `cannot read ${path}: ${errorMessage(error)}` };
  }
}

/** Reads the state file: undefined when there is none; a corrupt or unreadable one is an error to log, never a crash. */
export async function readXidState(path: string): Promise<{ state: XidState | undefined } | { error: string }> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    if (errnoCode(error) === 'ENOENT') return { state: undefined };
    return { error: `cannot read ${path}: ${errorMessage(error)}` };
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    return { error: `${path} is not JSON: ${errorMessage(error)}` };
  }
  const parsed = xidStateSchema.safeParse(json);
  return parsed.success ? { state: parsed.data } : { error: `${path} is not an xid state file: ${describeIssues(parsed.error.issues)}` };
}

/** Writes the state file whole: a temporary file beside it, then a rename, so a crash leaves the old or the new one. */
export async function writeXidState(path: string, state: XidState): Promise<void> {
  await mkdir(dirname(path), { recursive: true, mode: 0o700 });
  const temporary = `${path}.${process.pid}.tmp`;
  await writeFile(temporary, `${JSON.stringify(state)}\n`, { mode: 0o600 });
  await rename(temporary, path);
}

/** A fatal Xid read from the log, with where it was read, waiting for the end of the read to be judged. */
export interface XidCandidate {
  readonly event: XidEvent;
  readonly position: LogPosition;
  /** Undefined for a /dev/kmsg record without a sequence number: it cannot be told apart, so it is always new. */
  readonly occurrence: Occurrence | undefined;
}

export interface ReportedXidsOptions {
  /** The state file; undefined: nothing is kept, and a restarted agent reports again what is in the log. */
  readonly statePath: string | undefined;
  readonly bootIdPath: string;
  /** The log followed (`--path.kmsg`), recorded in the state. */
  readonly logPath: string;
  readonly logger: Logger;
}

/** The last reported occurrence, in memory and in the state file. One per xid collector. */
export class ReportedXids {
  private bootId: string | undefined;
  private last: Occurrence | undefined;
  /** Per file generation, how many fatal lines of each text were seen: the occurrence numbers. */
  private lineCounts = new Map<string, number>();
  private countedGeneration = -1;
  private writing: Promise<void> = Promise.resolve();
  private pendingWrite: XidState | undefined;
  private lastWriteError: string | undefined;

  constructor(private readonly options: ReportedXidsOptions) {}

  /** Reads the boot id and the state file. Never throws: what cannot be read is logged and treated as no state. */
  async load(): Promise<void> {
    const { statePath, logger } = this.options;
    if (statePath === undefined) return;
    const boot = await readBootId(this.options.bootIdPath);
    if ('error' in boot) logger.warn({ err: boot.error }, 'no boot id: Xids on /dev/kmsg reported before an agent restart will be reported again');
    else this.bootId = boot.bootId;
    const read = await readXidState(statePath);
    if ('error' in read) {
      logger.warn({ path: statePath, err: read.error }, 'xid state file ignored: every fatal Xid in the kernel log is treated as not yet reported');
      return;
    }
    const state = read.state;
    if (state === undefined) {
      logger.info({ path: statePath }, 'no xid state file yet: every fatal Xid in the kernel log is treated as not yet reported');
      return;
    }
    if (state.log !== this.options.logPath) {
      logger.info({ path: statePath, was: state.log, now: this.options.logPath }, 'xid state file is about another kernel log; ignored');
      return;
    }
    if (state.last.source === 'kmsg' && (state.bootId === null || state.bootId !== this.bootId)) {
      logger.info({ path: statePath, was: state.bootId, now: this.bootId ?? null }, 'xid state file is from another boot: the kernel log starts afresh');
      return;
    }
    this.last = state.last;
    logger.info(
      { path: statePath, last: state.last, xid: state.xid, gpu: state.gpu, reportedAt: state.reportedAt },
      'xid state read: Xids up to this one were reported before',
    );
  }

  /** The candidate for a fatal Xid read at `position` from `line`. */
  candidate(event: XidEvent, line: string, position: LogPosition): XidCandidate {
    if (position.source === 'kmsg') {
      return { event, position, occurrence: position.sequence === undefined ? undefined : { source: 'kmsg', sequence: position.sequence } };
    }
    if (position.generation !== this.countedGeneration) {
      this.countedGeneration = position.generation;
      this.lineCounts = new Map();
    }
    const lineSha256 = lazyCrypto().createHash('sha256').update(line).digest('hex');
    const occurrence = (this.lineCounts.get(lineSha256) ?? 0) + 1;
    this.lineCounts.set(lineSha256, occurrence);
    return { event, position, occurrence: { source: 'file', lineSha256, occurrence } };
  }

  /**
   * How many of `candidates` (one read's, in log order) were reported already: the count up to
   * and including the last one at or before the last reported occurrence. A file line only
   * matches when it was in the file when the agent opened it (`firstRead`): a line written
   * while the agent follows is news, whatever its text.
   */
  reportedCount(candidates: readonly XidCandidate[]): number {
    const last = this.last;
    if (last === undefined) return 0;
    let count = 0;
    candidates.forEach((candidate, index) => {
      const occurrence = candidate.occurrence;
      if (occurrence === undefined) return;
      const covered =
        last.source === 'kmsg'
          ? occurrence.source === 'kmsg' && occurrence.sequence <= last.sequence
          : occurrence.source === 'file' &&
            candidate.position.firstRead &&
            occurrence.lineSha256 === last.lineSha256 &&
            occurrence.occurrence === last.occurrence;
      if (covered) count = index + 1;
    });
    return count;
  }

  /** The controller accepted this candidate's report: remember it, and write it down. */
  delivered(candidate: XidCandidate): void {
    const occurrence = candidate.occurrence;
    if (occurrence === undefined) return;
    this.last = occurrence;
    const statePath = this.options.statePath;
    if (statePath === undefined) return;
    this.pendingWrite = {
      version: 1,
      log: this.options.logPath,
      bootId: this.bootId ?? null,
      last: occurrence,
      xid: candidate.event.xid,
      gpu: candidate.event.pciBusId,
      reportedAt: new Date().toISOString(),
    };
    // One write at a time, each of the newest state; a burst of reports costs one or two writes.
    this.writing = this.writing.then(() => this.flushWrite(statePath));
  }

  /** Resolves once the newest state is written (or failed to be). */
  async close(): Promise<void> {
    await this.writing;
  }

  private async flushWrite(statePath: string): Promise<void> {
    const state = this.pendingWrite;
    if (state === undefined) return;
    this.pendingWrite = undefined;
    try {
      await writeXidState(statePath, state);
      if (this.lastWriteError !== undefined) this.options.logger.info({ path: statePath }, 'xid state file written again');
      this.lastWriteError = undefined;
    } catch (error) {
      const message = errorMessage(error);
      if (message !== this.lastWriteError) {
        this.options.logger.warn({ path: statePath, err: message }, 'cannot write xid state file: a restarted agent may report this Xid again');
      }
      this.lastWriteError = message;
    }
  }
}
