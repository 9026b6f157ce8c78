import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Command, InvalidArgumentError } from 'commander';
import { listSlurmNodes, type SlurmNodeAddress } from '../actuators/slurm-nodes.js';
import { errorMessage } from '../core/errors.js';
import { parsePort, printable, runCommand } from './common.js';

/**
 * `steadfast sd slurm`: Prometheus file-based service discovery for the agents of a Slurm fleet.
 * One target per node slurmctld knows, at its NodeAddr, labelled with its Slurm name as `node`:
 * alerts name the node Slurm drains even where Prometheus scrapes an IP address.
 */

interface SdSlurmOptions {
  out: string;
  port: number;
  interval?: number;
  sinfo: string;
  slurmConf?: string;
}

/** `30`, `30s`, `5m` or `1h`, as milliseconds; at least one second. */
export function parseInterval(value: string): number {
  const match = /^(\d+)(s|m|h)?$/.exec(value);
  const amount = Number(match?.[1]);
  if (!match || amount < 1) throw new InvalidArgumentError('must be a duration of at least 1s, like 30s, 5m or 1h');
  return amount * { s: 1000, m: 60_000, h: 3_600_000 }[(match[2] as 's' | 'm' | 'h' | undefined) ?? 's'];
}

/** The file_sd document: one group per node, so each target keeps its own `node` label. */
export function fileSdTargets(nodes: readonly SlurmNodeAddress[], port: number): string {
  const groups = nodes.map(({ node, address }) => ({
    targets: [`${address.includes(':') ? `[${address}]` : address}:${port}`],
    labels: { node },
  }));
  return `${JSON.stringify(groups, null, 2)}\n`;
}

/**
 * Replaces `path` with `text` by writing a file beside it and renaming it over: Prometheus never
 * reads half a file. Leaves the file alone when it already holds `text`; returns whether it wrote.
 */
function writeAtomically(path: string, text: string): boolean {
  let current: string | undefined;
  try {
    current = readFileSync(path, 'utf8');
  } catch {
    current = undefined;
  }
  if (current === text) return false;
  const temporary = join(dirname(path), `.${basename(path)}.${process.pid}.tmp`);
  writeFileSync(temporary, text);
  renameSync(temporary, path);
  return true;
}

async function refresh(options: SdSlurmOptions): Promise<void> {
  const nodes = await listSlurmNodes({ sinfo: options.sinfo, env: options.slurmConf ? { SLURM_CONF: options.slurmConf } : {}, timeoutMs: 30_000 });
  // An empty list from a confused slurmctld would remove every target, and with them every alert.
  if (nodes.length === 0) throw new Error(`${options.sinfo} listed no nodes; ${options.out} left as it was`);
  if (writeAtomically(options.out, fileSdTargets(nodes, options.port))) {
    process.stdout.write(`Wrote ${nodes.length} target${nodes.length === 1 ? '' : 's'} to ${options.out}\n`);
  }
}

function sdSlurmCommand(): Command {
  return new Command('slurm')
    .description('Write Prometheus file_sd targets for the agents on every Slurm node, labelled node=<Slurm node name>.')
    .requiredOption('-o, --out <file>', 'targets file for file_sd_configs (replaced atomically)')
    .option('--port <port>', 'port the agents listen on', parsePort, 9401)
    .option('--interval <duration>', 'keep running and refresh this often (e.g. 60s); without it, write once and exit', parseInterval)
    .option('--sinfo <path>', 'sinfo binary', 'sinfo')
    .option('--slurm-conf <file>', 'slurm.conf to use (default: sinfo’s own, or $SLURM_CONF)')
    .action(async (options: SdSlurmOptions) => {
      await runCommand(async () => {
        if (options.interval === undefined) return refresh(options);
        const stop = new AbortController();
        const onSignal = (): void => stop.abort();
        process.once('SIGINT', onSignal);
        process.once('SIGTERM', onSignal);
        try {
          while (!stop.signal.aborted) {
            // A failed refresh keeps the last good file and tries again at the next interval.
            await refresh(options).catch((error: unknown) => process.stderr.write(`steadfast sd slurm: ${printable(errorMessage(error))}\n`));
            await sleep(options.interval, undefined, { signal: stop.signal }).catch(() => undefined);
          }
        } finally {
          process.off('SIGINT', onSignal);
          process.off('SIGTERM', onSignal);
        }
      });
    });
}

export function sdCommand(): Command {
  return new Command('sd').description('Prometheus service discovery files for the agents.').addCommand(sdSlurmCommand());
}
