import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { auditCommand } from '../../cli/audit.js';
import { holdCommands } from '../../cli/holds.js';
import { jobsCommand } from '../../cli/jobs.js';
import { pauseCommands } from '../../cli/pause.js';
import { remediationsCommand } from '../../cli/remediations.js';
import type { Controller } from '../../controller/service.js';
import { runCli } from '../support/cli.js';
import { ALERTMANAGER_TOKEN, TEST_TOKEN, post, startController, testConfig, xidAlertPayload } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

/**
 * Characters a terminal hides or acts on, in text the operator's commands print from the
 * controller: each is shown as a visible escape in the tables and as a JSON escape with --json,
 * so that what is printed is what is there (no reordered, hidden or blank-looking text).
 */

/** Each with the escape the table output shows for it. */
const INVISIBLE: readonly [string, string][] = [
  ['\u200f', '\\u200f'], // right-to-left mark
  ['\u200e', '\\u200e'], // left-to-right mark
  ['\u061c', '\\u061c'], // Arabic letter mark
  ['\u2028', '\\u2028'], // line separator
  ['\u2029', '\\u2029'], // paragraph separator
  ['\u200b', '\\u200b'], // zero-width space
  ['\u200c', '\\u200c'], // zero-width non-joiner
  ['\u200d', '\\u200d'], // zero-width joiner
  ['\u2060', '\\u2060'], // word joiner
  ['\ufeff', '\\ufeff'], // byte order mark
  ['\u{e0001}', '\\u{e0001}'], // language tag
  ['\u{e0041}', '\\u{e0041}'], // tag latin capital A
  ['\u{e007f}', '\\u{e007f}'], // cancel tag
  ['\u3164', '\\u3164'], // Hangul filler
  ['\u115f', '\\u115f'], // Hangul choseong filler
  ['\u1160', '\\u1160'], // Hangul jungseong filler
  ['\uffa0', '\\uffa0'], // halfwidth Hangul filler
  ['\u202e', '\\u202e'], // right-to-left override
  ['\u0085', '\\x85'], // next line (C1)
];

const HOSTILE = `swap${INVISIBLE.map(([char], index) => `${char}${index}`).join('')}fan`;
const SHOWN = `swap${INVISIBLE.map(([, escape], index) => `${escape}${index}`).join('')}fan`;
const RAW = new RegExp(INVISIBLE.map(([char]) => char).join('|'), 'u');

describe('the operator CLI shows invisible characters from the controller as escapes', () => {
  const store = testRedis();
  const dir = mkdtempSync(join(tmpdir(), 'steadfast-unprintable-cli-'));
  const tokenFile = join(dir, 'token');
  let controller: Controller;
  let url: string;
  let flags: string[];

  beforeAll(async () => {
    writeFileSync(tokenFile, `${TEST_TOKEN}\n`, { mode: 0o600 });
    ({ controller, url } = await startController(testConfig(store.url, store.prefix)));
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

  it("prints a hold's and a pause's reason with escapes in every table, and as JSON that reads back the same", async () => {
    const [hold, , holds] = holdCommands() as [ReturnType<typeof holdCommands>[0], ReturnType<typeof holdCommands>[0], ReturnType<typeof holdCommands>[0]];
    const [pause, unpause] = pauseCommands() as [ReturnType<typeof pauseCommands>[0], ReturnType<typeof pauseCommands>[0]];
    const held = await runCli(hold, ['n1', '--reason', HOSTILE, ...flags]);
    const paused = await runCli(pause, ['--reason', HOSTILE, ...flags]);
    expect((await runCli(unpause, flags)).exitCode).toBe(0);
    const tables = {
      hold: held,
      pause: paused,
      holds: await runCli(holds, flags),
      audit: await runCli(auditCommand(), ['--limit', '10', ...flags]),
      remediations: await runCli(remediationsCommand(), ['n1', ...flags]),
    };
    for (const [command, printed] of Object.entries(tables)) {
      expect(printed.exitCode, command).toBe(0);
      expect(RAW.test(printed.stdout), `${command} printed a raw invisible character`).toBe(false);
      expect(printed.stdout, command).toContain(SHOWN);
    }
    const json = {
      holds: (await runCli(holds, ['--json', ...flags])).stdout,
      audit: (await runCli(auditCommand(), ['--json', '--limit', '10', ...flags])).stdout,
      remediations: (await runCli(remediationsCommand(), ['n1', '--json', ...flags])).stdout,
    };
    for (const [command, printed] of Object.entries(json)) {
      expect(RAW.test(printed), `${command} --json printed a raw invisible character`).toBe(false);
      // The escapes are JSON's own: the text parses back to what the controller holds.
      const lines = printed
        .trim()
        .split('\n')
        .map((line) => JSON.stringify(JSON.parse(line)));
      expect(lines.join('\n'), command).toContain(JSON.stringify(HOSTILE).slice(1, -1));
    }
    expect(JSON.parse(json.holds)).toMatchObject({ holds: [{ node: 'n1', reason: HOSTILE }] });
  });

  it("prints an alert's description from Alertmanager, kept in the audit, as JSON escapes only", async () => {
    const payload = xidAlertPayload();
    const [alert] = payload.alerts as { labels: Record<string, string>; annotations: Record<string, string> }[];
    if (alert) {
      alert.labels.node = 'n2';
      alert.annotations.description = HOSTILE;
    }
    expect((await post(`${url}/api/v1/alerts`, payload, ALERTMANAGER_TOKEN)).status).toBe(202);
    await until(
      "the alert's signal in the audit",
      () => controller.audit.read({ node: 'n2', type: 'signal' }),
      (entries) => entries.length > 0,
      30_000,
    );
    const printed = await runCli(auditCommand(), ['--json', '--node', 'n2', '--type', 'signal', ...flags]);
    expect(printed.exitCode).toBe(0);
    expect(RAW.test(printed.stdout)).toBe(false);
    expect(printed.stdout).toContain('\\u200f');
    expect(JSON.stringify(JSON.parse(printed.stdout.trim().split('\n')[0] as string))).toContain(JSON.stringify(HOSTILE).slice(1, -1));
  });

  it('shows what a controller says in a refusal with escapes too', async () => {
    // A stand-in for a controller (or anything at its URL) answering with a hostile message.
    const server: Server = createServer((_req, res) => {
      res.writeHead(400, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: `${HOSTILE}\nsteadfast: all good` }));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const standIn = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      const refused = await runCli(jobsCommand(), ['--controller.url', standIn, '--token-file', tokenFile]);
      expect(refused.exitCode).toBe(2);
      expect(RAW.test(refused.stderr)).toBe(false);
      // One line: the message cannot forge a line of its own.
      expect(refused.stderr).toBe(`steadfast: GET /api/v1/jobs: 400 ${SHOWN}\\x0asteadfast: all good\n`);
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  });
});
