import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { auditCommand } from '../../cli/audit.js';
import { holdCommands } from '../../cli/holds.js';
import { jobsCommand } from '../../cli/jobs.js';
import { pauseCommands } from '../../cli/pause.js';
import { queuesCommand } from '../../cli/queues.js';
import { remediationsCommand } from '../../cli/remediations.js';
import { RemediationHistory } from '../../actuators/remediation-history.js';
import type { Controller } from '../../controller/service.js';
import { runCli } from '../support/cli.js';
import { TEST_TOKEN, post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';

/**
 * The operator's commands against a running controller over HTTP, with only its URL and a token
 * file: no Redis credentials on the operator's machine.
 */
describe('the operator CLI against a running controller', () => {
  const store = testRedis();
  const dir = mkdtempSync(join(tmpdir(), 'steadfast-operator-cli-'));
  const tokenFile = join(dir, 'token');
  let controller: Controller;
  let flags: string[];

  beforeAll(async () => {
    writeFileSync(tokenFile, `${TEST_TOKEN}\n`, { mode: 0o600 });
    let url: string;
    ({ controller, url } = await startController(testConfig(store.url, store.prefix), { workers: false }));
    flags = ['--controller.url', url, '--token-file', tokenFile];
    expect(
      (
        await post(`${url}/api/v1/jobs`, {
          name: 'gpt-small',
          nodes: ['n1', 'n2'],
          ranksPerNode: 8,
          topology: { tp: 8, dp: 2 },
          launcher: 'accept',
          codeVersion: 'v7',
        })
      ).status,
    ).toBe(201);
  });
  afterAll(async () => {
    await controller.close();
    await store.cleanup();
    rmSync(dir, { recursive: true, force: true });
  });

  it("lists jobs as a table and as JSON, and sets a job's policy", async () => {
    const table = await runCli(jobsCommand(), flags);
    expect(table.exitCode).toBe(0);
    expect(table.stdout).toMatch(/^gpt-small +running +v7 +2 +100\.0% +100\.0% +off +\S+$/m);
    // A hot-swap job shows its unused spares and the epoch its ranks meet in.
    expect(
      (
        await post(`${flags[1] ?? ''}/api/v1/jobs`, {
          name: 'gpt-swap',
          nodes: ['m1', 'm2'],
          ranksPerNode: 1,
          launcher: 'accept',
          codeVersion: 'v7',
          hotSwap: { spares: ['m3', 'm4'] },
        })
      ).status,
    ).toBe(201);
    expect((await runCli(jobsCommand(), flags)).stdout).toMatch(/^gpt-swap +running +v7 +2 +100\.0% +100\.0% +2 spares, epoch 0 +\S+$/m);
    await runCli(jobsCommand(), ['delete', 'gpt-swap', ...flags]);
    const policy = await runCli(jobsCommand(), ['policy', 'gpt-small', '--recovery', 'off', '--dry-run', 'on', ...flags]);
    expect(policy).toMatchObject({ exitCode: 0, stdout: 'gpt-small: recovery off, dry-run on\n' });
    expect((await controller.jobs.get('gpt-small')).policy).toEqual({ recovery: false, dryRun: true });
    const json = JSON.parse((await runCli(jobsCommand(), ['--json', ...flags])).stdout) as { jobs: { spec: { name: string }; policy: unknown }[] };
    expect(json.jobs.map((job) => [job.spec.name, job.policy])).toEqual([['gpt-small', { recovery: false, dryRun: true }]]);
    const bad = await runCli(jobsCommand(), ['policy', 'gpt-small', '--recovery', 'maybe', ...flags]);
    expect(bad.exitCode).toBe(2);
    expect(bad.stderr).toContain('--recovery takes on or off');
  });

  it("shows a node's remediation history, newest first, and refuses a malformed node name", async () => {
    expect(await runCli(remediationsCommand(), ['gpu-7', ...flags])).toMatchObject({ exitCode: 0, stdout: 'gpu-7: no remediations recorded\n' });
    const history = new RemediationHistory(store.redis, store.keys, 10);
    await history.record(
      'gpu-7',
      {
        time: '2026-11-20T10:00:00.000Z',
        action: 'reset_gpu',
        outcome: 'done',
        gpu: '0000:3a:00',
        detail: 'GPU 0000:3a:00 (index 2) reset',
        decisionId: 'd-1',
        actor: { role: 'agent', node: 'gpu-7' },
      },
      'd-1:reset',
    );
    await history.record(
      'gpu-7',
      { time: '2026-11-20T11:00:00.000Z', action: 'reboot', outcome: 'done', detail: 'reboot requested', decisionId: 'd-2' },
      'd-2:reboot',
    );
    const shown = await runCli(remediationsCommand(), ['gpu-7', ...flags]);
    expect(shown.exitCode).toBe(0);
    expect(shown.stdout.split('\n')).toEqual([
      '2026-11-20T11:00:00.000Z  reboot                     done      d-2: reboot requested',
      '2026-11-20T10:00:00.000Z  reset_gpu GPU 0000:3a:00   done      d-1 by agent gpu-7: GPU 0000:3a:00 (index 2) reset',
      '',
    ]);
    const json = JSON.parse((await runCli(remediationsCommand(), ['gpu-7', '--json', '--limit', '1', ...flags])).stdout) as { remediations: unknown[] };
    expect(json.remediations).toHaveLength(1);
    expect((await runCli(remediationsCommand(), ['--all', ...flags])).exitCode).toBe(2);
  });

  it('pauses with a reason and unpauses, printing the budget', async () => {
    const [pause, unpause] = pauseCommands() as [ReturnType<typeof pauseCommands>[0], ReturnType<typeof pauseCommands>[0]];
    expect(await runCli(pause, ['--reason', 'rack 7 maintenance', ...flags])).toMatchObject({ exitCode: 0, stdout: 'paused: rack 7 maintenance\n' });
    expect(await controller.gates.paused()).toBe('rack 7 maintenance');
    expect(await runCli(unpause, flags)).toMatchObject({ exitCode: 0, stdout: 'unpaused; drains in the last 3600 s: 0 of 4\n' });
    expect(await controller.gates.paused()).toBeUndefined();
  });

  it('holds, lists and releases a node', async () => {
    const [hold, release, holds] = holdCommands() as [
      ReturnType<typeof holdCommands>[0],
      ReturnType<typeof holdCommands>[0],
      ReturnType<typeof holdCommands>[0],
    ];
    const held = await runCli(hold, ['n2', '--reason', 'DIMM swap', '--for', '7200', ...flags]);
    expect(held.exitCode).toBe(0);
    expect(held.stdout).toMatch(/^n2: held until \S+ \(DIMM swap\)\n$/);
    expect((await runCli(holds, flags)).stdout).toMatch(/^n2 +until \S+ +DIMM swap\n$/);
    expect(await runCli(release, ['n2', ...flags])).toMatchObject({ exitCode: 0, stdout: 'n2: released\n' });
    const again = await runCli(release, ['n2', ...flags]);
    expect(again.exitCode).toBe(2);
    expect(again.stderr).toContain('404 n2 is not held');
  });

  it('prints the audit trail, filtered by node, and as JSON lines', async () => {
    const lines = (await runCli(auditCommand(), ['--node', 'n2', ...flags])).stdout.trim().split('\n');
    expect(lines.at(-1)).toMatch(/action +n2 +release n2: hold lifted by an operator {2}\[by operator\]$/);
    const json = await runCli(auditCommand(), ['--json', '--limit', '1', ...flags]);
    expect(JSON.parse(json.stdout.trim())).toMatchObject({ type: 'action' });
    const bad = await runCli(auditCommand(), ['--type', 'gossip', ...flags]);
    expect(bad.exitCode).toBe(2);
    expect(bad.stderr).toContain('type');
  });

  it('writes control characters and bidirectional overrides from the controller as escapes, so a reason cannot rewrite the terminal', async () => {
    const [hold, release, holds] = holdCommands() as [
      ReturnType<typeof holdCommands>[0],
      ReturnType<typeof holdCommands>[0],
      ReturnType<typeof holdCommands>[0],
    ];
    const hostile = 'fan\u001b]0;pwned\u0007\u001b[2J\u202eswap';
    expect((await runCli(hold, ['n1', '--reason', hostile, ...flags])).exitCode).toBe(0);
    const printed = [(await runCli(holds, flags)).stdout, (await runCli(auditCommand(), ['--node', 'n1', ...flags])).stdout];
    for (const text of printed) {
      expect(text).not.toMatch(/[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u202a-\u202e]/);
      expect(text).toContain('fan\\x1b]0;pwned\\x07\\x1b[2J\\u202eswap');
    }
    // --json keeps the text as it is, escaped by JSON itself.
    expect(JSON.parse((await runCli(auditCommand(), ['--node', 'n1', '--json', '--limit', '1', ...flags])).stdout.trim()).summary).toContain(hostile);
    expect((await runCli(release, ['n1', ...flags])).exitCode).toBe(0);
  });

  it('shows the queues over HTTP', async () => {
    const answer = await runCli(queuesCommand(), ['--json', ...flags]);
    expect(answer.exitCode).toBe(0);
    expect((JSON.parse(answer.stdout) as { queues: { name: string }[] }).queues.map((queue) => queue.name)).toEqual(['signals', 'steps', 'analysis']);
  });

  it('unregisters a job', async () => {
    expect(await runCli(jobsCommand(), ['delete', 'gpt-small', ...flags])).toMatchObject({ exitCode: 0, stdout: 'gpt-small: unregistered (was running)\n' });
    const gone = await runCli(jobsCommand(), ['delete', 'gpt-small', ...flags]);
    expect(gone.exitCode).toBe(2);
    expect(gone.stderr).toContain('404 no job named gpt-small');
  });

  it('takes the token from STEADFAST_TOKEN, and says what is wrong with a bad one or none', async () => {
    const url = flags[1] as string;
    expect((await runCli(jobsCommand(), ['--controller.url', url], { STEADFAST_TOKEN: TEST_TOKEN })).exitCode).toBe(0);
    const wrong = await runCli(jobsCommand(), ['--controller.url', url], { STEADFAST_TOKEN: 'wrong-token-0123456789' });
    expect(wrong.exitCode).toBe(2);
    expect(wrong.stderr).toContain('401');
    expect(wrong.stderr).toContain('check --token-file or STEADFAST_TOKEN');
    const none = await runCli(jobsCommand(), ['--controller.url', url], { STEADFAST_TOKEN: '' });
    expect(none).toMatchObject({ exitCode: 2, stderr: 'steadfast: no controller token: pass --token-file FILE or set STEADFAST_TOKEN\n' });
    const down = await runCli(jobsCommand(), ['--controller.url', 'http://127.0.0.1:1'], { STEADFAST_TOKEN: TEST_TOKEN });
    expect(down.exitCode).toBe(1);
    expect(down.stderr).toMatch(/^steadfast: the controller at http:\/\/127\.0\.0\.1:1 is not reachable/);
  });
});
