import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { COMMANDS, chosenCommand, loadCommand } from '../../cli/commands.js';

const run = promisify(execFile);
const ROOT = join(import.meta.dirname, '..', '..');
const BIN = join(ROOT, 'bin', 'steadfast.js');

async function steadfast(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return steadfastWithEnv({}, ...args);
}

async function steadfastWithEnv(extraEnv: Record<string, string>, ...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  if (!existsSync(join(ROOT, 'dist', 'cli', 'main.js'))) throw new Error('dist/ is missing: run `npm run build` (npm test does it)');
  try {
    const { stdout, stderr } = await run(process.execPath, [BIN, ...args], { env: { ...process.env, STEADFAST_LOG_LEVEL: 'silent', ...extraEnv } });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const failed = error as { code: number; stdout: string; stderr: string };
    return { code: failed.code, stdout: failed.stdout, stderr: failed.stderr };
  }
}

describe('the steadfast CLI', () => {
  it.each([
    'agent',
    'controller',
    'audit',
    'jobs',
    'queues',
    'pause',
    'unpause',
    'resume',
    'hold',
    'release',
    'holds',
    'plan',
    'dashboards',
    'rules',
    'alertmanager-config',
    'sd',
    'check',
    'demo',
  ])('documents `steadfast %s` with --help and exits 0', async (command) => {
    const result = await steadfast(command, '--help');
    expect(result.code).toBe(0);
    expect(result.stdout).toContain(`Usage: steadfast ${command}`);
  });

  it('lists every subcommand in the top-level help, each with its summary', async () => {
    const result = await steadfast('--help');
    for (const command of ['agent', 'controller', 'audit', 'dashboards', 'demo']) expect(result.stdout).toContain(command);
    for (const entry of COMMANDS) expect(result.stdout.replace(/\s+/g, ' ')).toContain(`${entry.name} ${entry.summary}`);
  });

  it('loads, for every listed name, a command of that name from its module', async () => {
    for (const entry of COMMANDS) expect((await loadCommand(entry)).name()).toBe(entry.name);
  });

  it('picks the command to load from the first word that is not an option, and from `help NAME`', () => {
    expect(chosenCommand(['agent', '--once', '--node', 'n1'])).toBe('agent');
    expect(chosenCommand(['--version'])).toBeUndefined();
    expect(chosenCommand(['help', 'controller'])).toBe('controller');
  });

  it("shows a command's help through `help NAME`", async () => {
    const result = await steadfast('help', 'hold');
    expect(result.code).toBe(0);
    expect(result.stdout).toContain('Usage: steadfast hold');
  });

  it('exits 2 and names the option when an option is unknown', async () => {
    const result = await steadfast('agent', '--no-such-flag');
    expect(result.code).toBe(2);
    expect(result.stderr).toContain("unknown option '--no-such-flag'");
  });

  it('exits 2 and names the flag when a flag value is bad', async () => {
    const result = await steadfast('agent', '--once', '--web.listen-address', 'not-an-address');
    expect(result.code).toBe(2);
    expect(result.stderr).toContain('--web.listen-address');
  });

  it('exits 2 with the file name when the controller config file is missing', async () => {
    const result = await steadfast('controller', '--config', '/nonexistent/steadfast.yaml');
    expect(result.code).toBe(2);
    expect(result.stderr).toContain('cannot read config file /nonexistent/steadfast.yaml');
  });

  it('prints one scrape of a fixture node with --once and exits 0', async () => {
    const fixtures = join(ROOT, 'test', 'fixtures', 'realworld');
    const result = await steadfast(
      'agent',
      '--once',
      '--node',
      'fixture-node',
      '--path.kmsg',
      join(fixtures, 'xid-kernel-logs', 'gpud_xid_lines_h100_gb200.txt'),
      '--nvidia-smi.xml',
      join(fixtures, 'nvidia-smi-xml', 'telegraf_a10g_515.105.01.xml'),
    );
    expect(result.code).toBe(0);
    expect(result.stdout).toContain('steadfast_xid_errors_total{pci_bus_id="0000:91:00",xid="79",severity="fatal"} 1');
    expect(result.stdout).toContain('steadfast_gpu_present{gpu="0",pci_bus_id="0000:00:1e",UUID="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"} 1');
    expect(result.stdout).toContain('steadfast_collector_success{collector="xid"} 1');
  });
});

describe('steadfast plan', () => {
  it('prints the standby pool size as JSON with a "standby" field', async () => {
    const result = await steadfast('plan', 'standby', '--nodes', '1024', '--daily-failure-rate', '0.001');
    expect(result.code).toBe(0);
    expect(JSON.parse(result.stdout)).toMatchObject({ standby: 4, nodes: 1024, quantile: 0.99 });
  });

  it('prints backup placements and the loss probability for a topology file', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'steadfast-plan-'));
    const topology = join(dir, 'topology.json');
    writeFileSync(topology, JSON.stringify({ tp: 1, pp: 2, dp: 2, order: 'tp-dp-pp', ranksPerNode: 1, nodes: ['n00', 'n01', 'n02', 'n03'] }));
    const result = await steadfast('plan', 'backups', '--topology', topology, '--node-failure-rate', '0.1');
    expect(result.code).toBe(0);
    const plan = JSON.parse(result.stdout) as { placements: { rank: number; holders: number[] }[]; lossProbability: number };
    expect(plan.placements.map(({ rank, holders }) => ({ rank, holders }))).toEqual([
      { rank: 0, holders: [3] },
      { rank: 1, holders: [2] },
      { rank: 2, holders: [1] },
      { rank: 3, holders: [0] },
    ]);
    expect(plan.lossProbability).toBeGreaterThan(0);
    const bad = await steadfast('plan', 'backups', '--topology', join(dir, 'missing.json'));
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('cannot read topology file');
  });

  it('prints the Young and Daly checkpoint intervals', async () => {
    const result = await steadfast('plan', 'checkpoint', '--mtbf-hours', '1', '--checkpoint-seconds', '60');
    expect(result.code).toBe(0);
    const interval = JSON.parse(result.stdout) as { youngSeconds: number; dalySeconds: number };
    expect(interval.youngSeconds).toBeCloseTo(657.27, 1);
    expect(interval.dalySeconds).toBeCloseTo(617.88, 1);
  });

  it('prints the exact micro-batch assignment, giving the slow group half the share', async () => {
    const result = await steadfast('plan', 'microbatch', '--times', '1,2,1,1', '--microbatches', '28');
    expect(result.code).toBe(0);
    expect(JSON.parse(result.stdout)).toEqual({ assignment: [8, 4, 8, 8], iterationSeconds: 8 });
    const bad = await steadfast('plan', 'microbatch', '--times', '1,x', '--microbatches', '4');
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('times.1');
  });

  it('exits 2 naming the option when a required option is missing or a value is out of range', async () => {
    const missing = await steadfast('plan', 'standby', '--nodes', '10');
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain('--daily-failure-rate');
    const range = await steadfast('plan', 'standby', '--nodes', '10', '--daily-failure-rate', '7');
    expect(range.code).toBe(2);
    expect(range.stderr).toContain('must be a probability');
  });
});
