import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { DoNotRetryError, RetryLaterError, errorMessage } from '../core/errors.js';
import { NODE_NAME_PATTERN } from '../core/names.js';
import type { ClusterBackend, NodeState } from './backend.js';

const run = promisify(execFile);

export interface SlurmOptions {
  readonly scontrol: string;
  readonly sinfo: string;
  /** Added to the environment of every Slurm command (SLURM_CONF, for instance). */
  readonly env: Readonly<Record<string, string>>;
  readonly timeoutMs: number;
}

/** Slurm states in which a node takes no new jobs (sinfo `%T`, without the `~`/`*` suffixes). */
const OUT_OF_SERVICE = new Set(['drained', 'draining', 'drain', 'down', 'fail', 'failing', 'maint']);

/** Reasons reach slurmctld as one argument; keep them printable and of a size sinfo shows. */
function cleanReason(reason: string): string {
  return reason.replace(/[^\x20-\x7e]/g, ' ').slice(0, 240);
}

/**
 * Drains through `scontrol update NodeName=… State=DRAIN Reason=…` and reads state with
 * `sinfo`, always via execFile with an argument array and a validated node name: nothing a
 * signal carries can become a shell word or an extra option.
 */
export class SlurmBackend implements ClusterBackend {
  readonly name = 'slurm';

  constructor(private readonly options: SlurmOptions) {}

  private async exec(file: string, args: string[]): Promise<string> {
    try {
      const { stdout } = await run(file, args, {
        env: { ...process.env, ...this.options.env },
        timeout: this.options.timeoutMs,
        maxBuffer: 1024 * 1024,
      });
      return stdout;
    } catch (error) {
      const stderr = (error as { stderr?: string }).stderr?.trim();
      const message = `${file} ${args[0] ?? ''} failed: ${stderr || errorMessage(error)}`;
      // slurmctld answering "invalid node" will say so again on every retry.
      if (stderr && /invalid node name|not found/i.test(stderr)) throw new DoNotRetryError(message);
      throw new RetryLaterError(message, error);
    }
  }

  private checkNode(node: string): void {
    if (!NODE_NAME_PATTERN.test(node)) throw new DoNotRetryError(`refusing to pass invalid node name ${JSON.stringify(node)} to Slurm`);
  }

  async nodeState(node: string): Promise<NodeState> {
    this.checkNode(node);
    const out = await this.exec(this.options.sinfo, ['--noheader', '--Node', `--nodes=${node}`, '--format=%N|%T|%E']);
    const line = out.split('\n').find((row) => row.startsWith(`${node}|`));
    if (!line) return { node, exists: false, drained: false, raw: 'unknown to slurm' };
    const [, rawState = '', reason = ''] = line.split('|');
    const state = rawState.replace(/[~*#!%$@^-]+$/, '').toLowerCase();
    return {
      node,
      exists: true,
      drained: OUT_OF_SERVICE.has(state),
      reason: reason && reason !== 'none' ? reason : undefined,
      raw: rawState,
    };
  }

  async drain(node: string, reason: string): Promise<void> {
    this.checkNode(node);
    await this.exec(this.options.scontrol, ['update', `NodeName=${node}`, 'State=DRAIN', `Reason=${cleanReason(reason)}`]);
  }

  async resume(node: string): Promise<void> {
    this.checkNode(node);
    await this.exec(this.options.scontrol, ['update', `NodeName=${node}`, 'State=RESUME']);
  }
}
