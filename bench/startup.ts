import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { repoRoot } from '../core/paths.js';
import { buildFixtureNode, type FixtureNode } from '../tryit/fixture-node.js';
import { ProcessGroup, freePort, httpOk, waitFor } from '../tryit/processes.js';
import { quantile } from './stats.js';

/**
 * Start-up time and resident memory of `steadfast` against Debian's prometheus-node-exporter,
 * in the same run, on the same fixture node (bench/scrape.ts's: 8 GPUs, 8 InfiniBand ports,
 * 4 NFS mounts). `node -e 0` is printed as the floor any Node.js program starts from.
 *   --version:   wall time of the whole process, spawn to exit.
 *   start-up:    spawn to the first 200 from /metrics (which does not wait for the GPU's first
 *                poll), compiled from source and, run as root, from the node's own code cache.
 *   RSS:         VmRSS after SCRAPES scrapes of /metrics, and after three times as many (the
 *                first figure moves by several MB with when V8 last collected).
 * Every process runs in the environment the agent's systemd unit gives it (PATH, LANG and the
 * log level), not in the shell's: Node reads some variables at every start, and a shell's
 * NODE_EXTRA_CA_CERTS (a CA bundle for a proxy, say) adds tens of milliseconds to each start, a
 * cost the installed agent does not pay. When the shell sets any of them, `node -e 0` is also
 * timed in the shell's environment and printed beside the floor.
 */

const RUNS = Number(process.env.STEADFAST_BENCH_STARTUP_RUNS ?? 15);
const SCRAPES = Number(process.env.STEADFAST_BENCH_RSS_SCRAPES ?? 1000);
const BIN = join(repoRoot(), 'bin', 'steadfast.js');
const MODULE_TREE = join(repoRoot(), 'dist', 'cli', 'main.js');
const NODE_EXPORTER = 'prometheus-node-exporter';
const CLOCK_TICKS_PER_SECOND = 100;
/** Node flags that give back V8's defaults on each setting the agent's own flags change (cli/agent-v8.ts). */
const NODE_DEFAULT_FLAGS = ['--semi-space-growth-factor=2', '--no-optimize-for-size', '--opt'];
/** Variables Node.js reads when it starts, which the agent's unit (deploy/systemd) does not set. */
const NODE_START_VARIABLES = ['NODE_EXTRA_CA_CERTS', 'NODE_OPTIONS'];
/** A code-cache directory that does not exist: the agent compiles its bundle from source. */
const NO_CODE_CACHE = '/nonexistent/steadfast-agent-code-cache';

/** What deploy/systemd/steadfast-agent.service's processes see: systemd's PATH and LANG, plus the log level and where the code cache is. */
function unitEnvironment(logLevel: string, codeCacheDir = NO_CODE_CACHE): NodeJS.ProcessEnv {
  return {
    PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin',
    LANG: process.env.LANG ?? 'C.UTF-8',
    STEADFAST_LOG_LEVEL: logLevel,
    STEADFAST_AGENT_CODE_CACHE_DIR: codeCacheDir,
  };
}

function agentArgs(node: FixtureNode, port: number, stateDir: string, nodeFlags: readonly string[] = [], script = BIN): string[] {
  return [
    ...nodeFlags,
    script,
    'agent',
    '--web.listen-address',
    `127.0.0.1:${port}`,
    '--node',
    'fixture-node',
    '--path.sysfs',
    node.sysfs,
    '--path.procfs',
    node.procfs,
    '--path.kmsg',
    node.kmsg,
    '--nvidia-smi.xml',
    node.nvidiaSmiXml,
    '--xid.state-file',
    join(stateDir, 'xid-state.json'),
    '--web.insecure',
  ];
}

function exporterArgs(node: FixtureNode, port: number): string[] {
  return [
    `--web.listen-address=127.0.0.1:${port}`,
    `--path.sysfs=${node.sysfs}`,
    `--path.procfs=${node.procfs}`,
    '--collector.disable-defaults',
    '--collector.infiniband',
    '--collector.mountstats',
  ];
}

/** Wall milliseconds from spawn to exit; fails on a non-zero exit. */
function timeToExit(command: string, args: readonly string[], env: NodeJS.ProcessEnv = unitEnvironment('silent')): Promise<number> {
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: 'ignore', env });
    child.once('error', reject);
    child.once('exit', (code) => (code === 0 ? resolve(performance.now() - started) : reject(new Error(`${command} ${args.join(' ')} exited ${code}`))));
  });
}

/** Wall milliseconds from spawn to the first answered /metrics; the process is stopped after. */
async function timeToFirstScrape(
  group: ProcessGroup,
  logDir: string,
  command: string,
  args: (port: number) => string[],
  codeCacheDir?: string,
): Promise<number> {
  const port = await freePort();
  const started = performance.now();
  group.start('startup', command, args(port), join(logDir, 'startup.log'), { env: unitEnvironment('warn', codeCacheDir) });
  await waitFor(`${command} to serve /metrics`, () => httpOk(`http://127.0.0.1:${port}/metrics`), 30_000, 2);
  const elapsed = performance.now() - started;
  await group.stop('startup');
  return elapsed;
}

function rssMegabytes(pid: number): number {
  const match = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!match) throw new Error(`no VmRSS for process ${pid}`);
  return Number(match[1]) / 1024;
}

/** User plus system CPU seconds of a process so far (fields 14 and 15 of /proc/PID/stat). */
function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS_PER_SECOND;
}

interface Steady {
  readonly rssMegabytes: number;
  /** After 3 × SCRAPES: the figure after SCRAPES moves with when V8 last collected. */
  readonly laterRssMegabytes: number;
  readonly cpuSecondsPerThousand: number;
}

/** VmRSS after SCRAPES sequential scrapes of a long-running exporter, and its CPU per scrape. */
async function rssAfterScrapes(group: ProcessGroup, logDir: string, name: string, command: string, args: (port: number) => string[]): Promise<Steady> {
  const port = await freePort();
  const child = group.start(name, command, args(port), join(logDir, `${name}.log`), { env: unitEnvironment('warn') });
  const url = `http://127.0.0.1:${port}/metrics`;
  await waitFor(`${name} to serve /metrics`, () => httpOk(url), 30_000);
  const pid = child.pid ?? 0;
  const cpuStart = cpuSeconds(pid);
  const scrape = async (count: number): Promise<void> => {
    for (let i = 0; i < count; i += 1) {
      const response = await fetch(url);
      await response.text();
      if (!response.ok) throw new Error(`${name} answered ${response.status}`);
    }
  };
  await scrape(SCRAPES);
  const first = { rssMegabytes: rssMegabytes(pid), cpuSecondsPerThousand: ((cpuSeconds(pid) - cpuStart) * 1000) / SCRAPES };
  await scrape(2 * SCRAPES);
  const steady = { ...first, laterRssMegabytes: rssMegabytes(pid) };
  await group.stop(name);
  return steady;
}

const median = (samples: number[]): number =>
  quantile(
    [...samples].sort((a, b) => a - b),
    0.5,
  );

async function main(): Promise<void> {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-bench-startup-'));
  const group = new ProcessGroup();
  try {
    const node = buildFixtureNode(root);
    const shellStartVariables = NODE_START_VARIABLES.filter((name) => process.env[name] !== undefined);
    // The node's own code cache, as the Debian package's postinst writes it (root only).
    const codeCacheDir = join(root, 'code-cache');
    const ownCache =
      process.getuid?.() === 0
        ? (await timeToExit(process.execPath, [BIN, 'agent', '--write-code-cache'], unitEnvironment('silent', codeCacheDir)), true)
        : false;
    const samples = {
      nodeFloor: [] as number[],
      shellNodeFloor: [] as number[],
      version: [] as number[],
      exporterVersion: [] as number[],
      agent: [] as number[],
      agentCached: [] as number[],
      moduleTree: [] as number[],
      exporter: [] as number[],
    };
    // Interleaved, so each sees the same machine conditions.
    for (let run = 0; run < RUNS; run += 1) {
      samples.nodeFloor.push(await timeToExit(process.execPath, ['-e', '0']));
      if (shellStartVariables.length > 0) samples.shellNodeFloor.push(await timeToExit(process.execPath, ['-e', '0'], process.env));
      samples.version.push(await timeToExit(process.execPath, [BIN, '--version']));
      samples.exporterVersion.push(await timeToExit(NODE_EXPORTER, ['--version']));
      samples.agent.push(await timeToFirstScrape(group, root, process.execPath, (port) => agentArgs(node, port, root)));
      if (ownCache) samples.agentCached.push(await timeToFirstScrape(group, root, process.execPath, (port) => agentArgs(node, port, root), codeCacheDir));
      samples.moduleTree.push(await timeToFirstScrape(group, root, process.execPath, (port) => agentArgs(node, port, root, [], MODULE_TREE)));
      samples.exporter.push(await timeToFirstScrape(group, root, NODE_EXPORTER, (port) => exporterArgs(node, port)));
    }
    const agentRss = await rssAfterScrapes(group, root, 'agent', process.execPath, (port) => agentArgs(node, port, root));
    const defaultsAgentRss = await rssAfterScrapes(group, root, 'agent-node-defaults', process.execPath, (port) =>
      agentArgs(node, port, root, NODE_DEFAULT_FLAGS),
    );
    const exporterRss = await rssAfterScrapes(group, root, 'node_exporter', NODE_EXPORTER, (port) => exporterArgs(node, port));

    process.stdout.write(`\nStart-up and memory on the fixture node, median of ${RUNS} interleaved runs; RSS after ${SCRAPES} scrapes\n`);
    process.stdout.write(
      `machine: ${cpus().length} × ${cpus()[0]?.model ?? 'unknown CPU'}, Node ${process.version}; every process in the agent unit's environment\n`,
    );
    if (shellStartVariables.length > 0) {
      process.stdout.write(
        `this shell sets ${shellStartVariables.join(', ')}, which the unit does not: node -e 0 takes ${median(samples.shellNodeFloor).toFixed(0)} ms with them, ${median(samples.nodeFloor).toFixed(0)} ms without\n`,
      );
    }
    process.stdout.write('\n');
    process.stdout.write('| measure | steadfast | node_exporter 1.5 | target |\n|---|---|---|---|\n');
    process.stdout.write(
      `| \`--version\`, ms (node -e 0: ${median(samples.nodeFloor).toFixed(0)}) | ${median(samples.version).toFixed(0)} | ${median(samples.exporterVersion).toFixed(0)} | |\n`,
    );
    process.stdout.write(
      `| agent start-up to first /metrics, ms (the bundle, compiled from source) | ${median(samples.agent).toFixed(0)} | ${median(samples.exporter).toFixed(0)} | |\n`,
    );
    process.stdout.write(
      `| agent start-up to first /metrics, ms (the bundle and the node's own code cache) | ${ownCache ? median(samples.agentCached).toFixed(0) : 'n/a (writing the cache needs root)'} | | |\n`,
    );
    process.stdout.write(`| agent start-up to first /metrics, ms (the module tree, no bundle) | ${median(samples.moduleTree).toFixed(0)} | | |\n`);
    process.stdout.write(
      `| RSS after ${SCRAPES} scrapes, MB (as installed: the agent's V8 flags) | ${agentRss.rssMegabytes.toFixed(1)} | ${exporterRss.rssMegabytes.toFixed(1)} | ≤ 64 |\n`,
    );
    process.stdout.write(
      `| RSS after ${3 * SCRAPES} scrapes, MB (as installed) | ${agentRss.laterRssMegabytes.toFixed(1)} | ${exporterRss.laterRssMegabytes.toFixed(1)} | |\n`,
    );
    process.stdout.write(
      `| RSS after ${SCRAPES} scrapes, MB (Node's defaults: ${NODE_DEFAULT_FLAGS.join(' ')}) | ${defaultsAgentRss.rssMegabytes.toFixed(1)} | | |\n`,
    );
    process.stdout.write(
      `| CPU s per 1,000 scrapes (as installed) | ${agentRss.cpuSecondsPerThousand.toFixed(2)} | ${exporterRss.cpuSecondsPerThousand.toFixed(2)} | |\n`,
    );
    process.stdout.write(`| CPU s per 1,000 scrapes (Node's defaults) | ${defaultsAgentRss.cpuSecondsPerThousand.toFixed(2)} | | |\n`);
  } finally {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  }
}

await main();
