import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { RetryLaterError, errorMessage } from '../core/errors.js';
import { NODE_NAME_PATTERN } from '../core/names.js';

const run = promisify(execFile);

/** A node as slurmctld lists it: its name (what drains use) and the address slurmd is reached at. */
export interface SlurmNodeAddress {
  readonly node: string;
  readonly address: string;
}

export interface SlurmNodeListOptions {
  readonly sinfo: string;
  /** Added to sinfo's environment (SLURM_CONF, for instance). */
  readonly env: Readonly<Record<string, string>>;
  readonly timeoutMs: number;
}

// A host name or an IPv4 / IPv6 address, as Slurm's NodeAddr holds one.
const ADDRESS_PATTERN = /^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$/;

/**
 * Every node slurmctld knows, once each (sinfo lists a node per partition), sorted by name.
 * Read with `sinfo --Node --format=%N|%o` through execFile; a line whose name or address is not
 * one is left out rather than passed on.
 */
export async function listSlurmNodes(options: SlurmNodeListOptions): Promise<SlurmNodeAddress[]> {
  let stdout: string;
  try {
    ({ stdout } = await run(options.sinfo, ['--noheader', '--Node', '--format=%N|%o'], {
      env: { ...process.env, ...options.env },
      timeout: options.timeoutMs,
      maxBuffer: 16 * 1024 * 1024,
    }));
  } catch (error) {
    const said = (error as { stderr?: string }).stderr?.trim();
    throw new RetryLaterError(`${options.sinfo} failed: ${said || errorMessage(error)}`, error);
  }
  const nodes = new Map<string, string>();
  for (const line of stdout.split('\n')) {
    const [node = '', address = ''] = line.trim().split('|');
    if (NODE_NAME_PATTERN.test(node) && ADDRESS_PATTERN.test(address)) nodes.set(node, address);
  }
  return [...nodes].sort(([a], [b]) => a.localeCompare(b)).map(([node, address]) => ({ node, address }));
}
