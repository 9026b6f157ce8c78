import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { AGENT_V8_FLAGS, agentV8Flags } from '../../cli/agent-v8.js';

/**
 * `steadfast agent` runs from dist/agent.cjs, the bundle of cli/agent-main.ts that npm run build
 * makes, with the node's own V8 code cache for it when root wrote one. It must be the same agent
 * as the module tree's: same flags, same scrape.
 */

const run = promisify(execFile);
const ROOT = join(import.meta.dirname, '..', '..');
const FIXTURES = join(ROOT, 'test', 'fixtures', 'realworld');
const BUNDLE = join(ROOT, 'dist', 'agent.cjs');
const BIN = join(ROOT, 'bin', 'steadfast.js');
const work = mkdtempSync(join(tmpdir(), 'steadfast-agent-entry-'));

afterAll(() => rmSync(work, { recursive: true, force: true }));

/** One `agent --once` scrape of the fixture node (no process metrics), from the given script. */
async function scrape(script: string, name: string, env: NodeJS.ProcessEnv = process.env): Promise<string> {
  if (!existsSync(BUNDLE)) throw new Error('dist/agent.cjs is missing: run `npm run build` (npm test does it)');
  const args = [
    'agent',
    '--once',
    '--node',
    'fixture-node',
    '--no-collector.process',
    '--path.kmsg',
    join(FIXTURES, 'xid-kernel-logs', 'gpud_xid_lines_h100_gb200.txt'),
    '--nvidia-smi.xml',
    join(FIXTURES, 'nvidia-smi-xml', 'telegraf_a10g_515.105.01.xml'),
    '--xid.state-file',
    join(work, `${name}.json`),
  ];
  const { stdout } = await run(process.execPath, [script, ...args], { env: { ...env, STEADFAST_LOG_LEVEL: 'silent' } });
  // Durations and poll times differ from run to run; everything else must not. The process
  // collector, which reads whatever training processes this machine runs, is left out.
  return stdout.replace(
    /^((?:steadfast_collector_duration_seconds|steadfast_gpu_last_poll_timestamp_seconds|steadfast_gpu_poll_age_seconds)(?:\{[^}]*\})?) .*$/gm,
    '$1 T',
  );
}

describe('the agent bundle', () => {
  it('prints the same scrape of a fixture node as the module tree does', async () => {
    const bundled = await scrape(BIN, 'bundled');
    const tree = await scrape(join(ROOT, 'dist', 'cli', 'main.js'), 'tree');
    expect(bundled).toContain('steadfast_gpu_present{gpu="0",pci_bus_id="0000:00:1e",UUID="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"} 1');
    expect(bundled).toBe(tree);
  });

  it('answers --version and an unknown flag as the whole CLI does', async () => {
    expect((await run(process.execPath, [BIN, '--version'])).stdout.trim()).toBe('0.1.0');
    const failed = await run(process.execPath, [BIN, 'agent', '--no-such-flag']).catch((error: unknown) => error as { code: number; stderr: string });
    expect(failed).toMatchObject({ code: 2 });
    expect((failed as { stderr: string }).stderr).toContain("unknown option '--no-such-flag'");
  });

  it('compiles from a code cache only when root alone may write it and its directory', async () => {
    const dir = join(work, 'code-cache');
    const env = { ...process.env, STEADFAST_AGENT_CODE_CACHE_DIR: dir };
    const status = async () =>
      JSON.parse((await run(process.execPath, [BIN, 'agent', '--code-cache-status'], { env })).stdout) as { state: string; file: string };
    expect((await status()).state).toBe('none');
    const written = (await run(process.execPath, [BIN, 'agent', '--write-code-cache'], { env })).stdout.trim();
    expect(await status()).toEqual({ state: 'used', file: written });
    // A cache another user could have planted is not read.
    chmodSync(written, 0o666);
    expect((await status()).state).toBe('untrusted');
    chmodSync(written, 0o644);
    chmodSync(dir, 0o777);
    expect((await status()).state).toBe('untrusted');
    chmodSync(dir, 0o755);
    // A cache file V8 refuses (another bundle's, say) is compiled around, not run.
    writeFileSync(written, randomBytes(4096), { mode: 0o644 });
    expect((await status()).state).toBe('rejected');
    expect((await scrape(BIN, 'rejected-cache', env)).length).toBeGreaterThan(0);
  });
});

describe("the agent's own V8 flags", () => {
  it('sets all of them when node was given no flags', () => {
    expect(agentV8Flags([])).toEqual(AGENT_V8_FLAGS.map((entry) => entry.flag));
    expect(agentV8Flags([])).toEqual(['--semi-space-growth-factor=1', '--optimize-for-size', '--no-opt']);
  });

  it("leaves out each one whose setting the operator's node flags already decide, in either spelling", () => {
    expect(agentV8Flags(['--max-semi-space-size=16'])).toEqual(['--optimize-for-size', '--no-opt']);
    expect(agentV8Flags(['--max_semi_space_size=16', '--turbofan'])).toEqual(['--optimize-for-size']);
    expect(agentV8Flags(['--lite-mode', '--no-optimize-for-size', '--semi-space-growth-factor=2'])).toEqual([]);
  });

  it('keeps them all for node flags that decide none of their settings', () => {
    expect(agentV8Flags(['--stack-size=900', '--enable-source-maps'])).toEqual(['--semi-space-growth-factor=1', '--optimize-for-size', '--no-opt']);
  });
});
