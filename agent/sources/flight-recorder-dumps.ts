import { constants } from 'node:fs';
import { lstat, open, readdir } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { errorMessage } from '../../core/errors.js';

/**
 * PyTorch NCCL flight-recorder dumps (TORCH_NCCL_TRACE_BUFFER_SIZE > 0; written on a watchdog
 * timeout to `${TORCH_NCCL_DEBUG_INFO_TEMP_FILE}<rank>`, default `/tmp/nccl_trace_rank_<rank>`).
 * They are listed with their content for the trace endpoint: JSON parsed, pickles as base64.
 * Pickles are never unpickled here (an untrusted pickle runs code); decode them offline with a
 * restricted unpickler.
 */

export interface FlightRecorderSource {
  readonly dir: string;
  /** Only files whose names start with this (the basename of TORCH_NCCL_DEBUG_INFO_TEMP_FILE). */
  readonly prefix?: string | undefined;
}

/**
 * Where dumps are: the flag's directory (every file in it), else the directory of
 * TORCH_NCCL_DEBUG_INFO_TEMP_FILE in `env` (files named with its prefix), else nowhere.
 */
export function flightRecorderSource(flagDir: string | undefined, env: Readonly<Record<string, string | undefined>>): FlightRecorderSource | undefined {
  if (flagDir !== undefined && flagDir !== '') return { dir: flagDir };
  const tempFile = env.TORCH_NCCL_DEBUG_INFO_TEMP_FILE;
  if (tempFile === undefined || tempFile === '') return undefined;
  // A value ending in "/" names the directory itself; the files are then `<dir>/<rank>`.
  return tempFile.endsWith('/') ? { dir: tempFile } : { dir: dirname(tempFile), prefix: basename(tempFile) };
}

export interface FlightRecorderFile {
  readonly name: string;
  readonly sizeBytes: number;
  readonly modifiedAt: string;
  /** `unread`: the content was left out or could not be read (see `error`). */
  readonly format: 'json' | 'pickle' | 'other' | 'unread';
  /** The content was larger than the cap: `base64` holds its start, `content` is absent. */
  readonly truncated: boolean;
  /** Parsed JSON (only when the whole file fits the cap and parses). */
  readonly content?: unknown;
  /** Pickle bytes as base64, at most the cap. */
  readonly base64?: string;
  readonly error?: string;
}

export interface FlightRecorderListing {
  readonly dir: string;
  readonly files: readonly FlightRecorderFile[];
  readonly error?: string;
}

export const MAX_CONTENT_BYTES = 1024 * 1024;
/** Newest first; a node writes one dump per rank, so this covers several dumps of an 8-GPU node. */
const MAX_FILES = 64;
/** Files past this many (older ones) are listed without content, bounding the response near 20 MiB. */
const MAX_FILES_WITH_CONTENT = 16;

/** pickle protocol 2..5 starts with the PROTO opcode. */
function looksLikePickle(bytes: Buffer): boolean {
  return bytes.length >= 2 && bytes[0] === 0x80 && bytes[1]! >= 2 && bytes[1]! <= 5;
}

function looksLikeJson(bytes: Buffer): boolean {
  const first = bytes.toString('utf8', 0, Math.min(bytes.length, 64)).trimStart()[0];
  return first === '{' || first === '[';
}

async function readStart(path: string, limit: number): Promise<{ bytes: Buffer; truncated: boolean }> {
  // O_NOFOLLOW: the directory may be /tmp; a symlink planted there must not make the agent read another file.
  const handle = await open(path, constants.O_RDONLY | constants.O_NOFOLLOW);
  try {
    const buffer = Buffer.alloc(limit + 1);
    let filled = 0;
    while (filled < buffer.length) {
      const { bytesRead } = await handle.read(buffer, filled, buffer.length - filled, filled);
      if (bytesRead === 0) break;
      filled += bytesRead;
    }
    return { bytes: buffer.subarray(0, Math.min(filled, limit)), truncated: filled > limit };
  } finally {
    await handle.close();
  }
}

async function describeFile(dir: string, name: string, sizeBytes: number, modified: Date, withContent: boolean): Promise<FlightRecorderFile> {
  const base = { name, sizeBytes, modifiedAt: modified.toISOString() };
  if (!withContent)
    return { ...base, format: 'unread', truncated: sizeBytes > 0, error: `content left out: only the newest ${MAX_FILES_WITH_CONTENT} files carry it` };
  try {
    const { bytes, truncated } = await readStart(join(dir, name), MAX_CONTENT_BYTES);
    if (looksLikePickle(bytes)) return { ...base, format: 'pickle', truncated, base64: bytes.toString('base64') };
    if (!looksLikeJson(bytes)) return { ...base, format: 'other', truncated };
    if (truncated) return { ...base, format: 'json', truncated };
    try {
      return { ...base, format: 'json', truncated, content: JSON.parse(bytes.toString('utf8')) as unknown };
    } catch (error) {
      // Possibly still being written; the listing says so rather than dropping the file.
      return { ...base, format: 'other', truncated, error: `not valid JSON: ${errorMessage(error)}` };
    }
  } catch (error) {
    return { ...base, format: 'unread', truncated: false, error: `cannot read: ${errorMessage(error)}` };
  }
}

/** Lists the dumps, newest first; never throws (a missing directory is reported in `error`). */
export async function listFlightRecorderDumps(source: FlightRecorderSource): Promise<FlightRecorderListing> {
  let names: string[];
  try {
    names = await readdir(source.dir);
  } catch (error) {
    return { dir: source.dir, files: [], error: `cannot list ${source.dir}: ${errorMessage(error)}` };
  }
  const candidates = names.filter((name) => source.prefix === undefined || name.startsWith(source.prefix));
  const regular: { name: string; size: number; mtime: Date }[] = [];
  for (const name of candidates) {
    try {
      const stats = await lstat(join(source.dir, name));
      if (stats.isFile()) regular.push({ name, size: stats.size, mtime: stats.mtime });
    } catch {
      // Removed between readdir and lstat.
    }
  }
  regular.sort((a, b) => b.mtime.getTime() - a.mtime.getTime() || a.name.localeCompare(b.name));
  const files = await Promise.all(
    regular.slice(0, MAX_FILES).map((file, index) => describeFile(source.dir, file.name, file.size, file.mtime, index < MAX_FILES_WITH_CONTENT)),
  );
  return { dir: source.dir, files };
}
