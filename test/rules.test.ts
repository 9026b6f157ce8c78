import { execFile } from 'node:child_process';
import { mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { existsSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { InputError } from '../core/errors.js';
import {
  ALERTMANAGER_CONFIG,
  CONTROLLER_RECEIVER,
  RULE_FILES,
  renderAlertmanagerConfig,
} from '../rules/index.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const RULES = join(ROOT, 'rules');
const RULE_TESTS = join(RULES, 'tests');
const RUNBOOK_BASE = 'https://github.com/steadfast-dev/steadfast/blob/main/docs/runbooks/';
const PROMTOOL = process.env.PROMTOOL ?? 'promtool';
const AMTOOL = process.env.AMTOOL ?? 'amtool';
const TOOL_TIMEOUT_MS = 30_000;

interface ToolResult {
  readonly exitCode: number;
  /** The command line and everything it printed, for failure messages. */
  readonly output: string;
  readonly stdout: string;
}

/** Runs a tool with an argument array and never rejects: a failure comes back as its exit code and output. */
function runTool(command: string, args: readonly string[]): Promise<ToolResult> {
  return new Promise((resolvePromise) => {
    execFile(command, args, { cwd: ROOT, timeout: TOOL_TIMEOUT_MS }, (error, stdout, stderr) => {
      const exitCode = error === null ? 0 : typeof error.code === 'number' ? error.code : -1;
      const failure = error !== null && typeof error.code !== 'number' ? `\n${error.message}` : '';
      resolvePromise({ exitCode, stdout, output: `$ ${command} ${args.join(' ')}\n${stdout}${stderr}${failure}` });
    });
  });
}

const routeCasesSchema = z.object({
  description: z.string(),
  cases: z
    .array(
      z
        .object({
          behaviour: z.string().min(1),
          labels: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string()),
          receivers: z.array(z.string().min(1)).min(1),
        })
        .strict(),
    )
    .min(1),
});

const ruleFileSchema = z.object({
  groups: z.array(
    z.object({
      name: z.string(),
      rules: z.array(
        z
          .object({
            alert: z.string().optional(),
            record: z.string().optional(),
            expr: z.string(),
            labels: z.record(z.string(), z.string()).default({}),
            annotations: z.record(z.string(), z.string()).default({}),
          })
          .loose(),
      ),
    }),
  ),
});

interface AlertRule {
  readonly file: string;
  readonly alert: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly annotations: Readonly<Record<string, string>>;
}

async function loadAlertRules(): Promise<AlertRule[]> {
  const alerts: AlertRule[] = [];
  for (const file of RULE_FILES) {
    const parsed = ruleFileSchema.parse(parseYaml(await readFile(file, 'utf8')));
    for (const group of parsed.groups) {
      for (const rule of group.rules) {
        if (rule.alert !== undefined) alerts.push({ file: basename(file), alert: rule.alert, labels: rule.labels, annotations: rule.annotations });
      }
    }
  }
  return alerts;
}

const promtoolTestSchema = z.object({
  tests: z.array(
    z.object({
      alert_rule_test: z
        .array(z.object({ alertname: z.string(), exp_alerts: z.array(z.unknown()).default([]) }).loose())
        .default([]),
    }).loose(),
  ),
}).loose();

const ruleTestFiles = (await readdir(RULE_TESTS)).filter((name) => name.endsWith('.test.yml')).sort();
const routeCases = routeCasesSchema.parse(JSON.parse(await readFile(join(RULE_TESTS, 'routes.json'), 'utf8'))).cases;

describe('Prometheus rules', () => {
  it('RULE_FILES lists every rule file in rules/ and nothing else', async () => {
    const onDisk = (await readdir(RULES))
      .filter((name) => name.endsWith('.yml') && name !== basename(ALERTMANAGER_CONFIG))
      .map((name) => join(RULES, name))
      .sort();
    expect([...RULE_FILES].sort()).toEqual(onDisk);
  });

  it('every rule file passes promtool check rules', async () => {
    const result = await runTool(PROMTOOL, ['check', 'rules', ...RULE_FILES]);
    expect(result.exitCode, result.output).toBe(0);
  });

  it.each(ruleTestFiles)('the alerts behave at their for: boundaries as rules/tests/%s expects', async (name) => {
    const result = await runTool(PROMTOOL, ['test', 'rules', join(RULE_TESTS, name)]);
    expect(result.exitCode, result.output).toBe(0);
  });

  it('every alert has a promtool case where it fires and one where it does not', async () => {
    const firing = new Set<string>();
    const silent = new Set<string>();
    for (const name of ruleTestFiles) {
      const parsed = promtoolTestSchema.parse(parseYaml(await readFile(join(RULE_TESTS, name), 'utf8')));
      for (const check of parsed.tests.flatMap((test) => test.alert_rule_test)) {
        (check.exp_alerts.length > 0 ? firing : silent).add(check.alertname);
      }
    }
    for (const { alert } of await loadAlertRules()) {
      expect(firing.has(alert), `${alert} has no case where it fires`).toBe(true);
      expect(silent.has(alert), `${alert} has no case where it stays silent`).toBe(true);
    }
  });

  it('every alert carries severity, domain, summary, description and a runbook_url whose runbook exists', async () => {
    const alerts = await loadAlertRules();
    expect(alerts.length).toBeGreaterThan(0);
    for (const { file, alert, labels, annotations } of alerts) {
      const where = `${file}: ${alert}`;
      expect(labels.severity, `${where} has no severity label`).toMatch(/^(critical|warning|info)$/);
      expect(labels.domain, `${where} has no domain label`).toMatch(/^[a-z]+$/);
      expect(annotations.summary, `${where} has no summary`).toBeTruthy();
      expect(annotations.summary, `${where}: the summary must be static`).not.toContain('{{');
      expect(annotations.description, `${where}: the description must be templated`).toContain('{{ $labels.node }}');
      const runbook = annotations.runbook_url ?? '';
      expect(runbook.startsWith(RUNBOOK_BASE), `${where}: runbook_url ${runbook} is not under ${RUNBOOK_BASE}`).toBe(true);
      const runbookFile = join(ROOT, 'docs', 'runbooks', runbook.slice(RUNBOOK_BASE.length));
      expect(existsSync(runbookFile), `${where}: ${runbookFile} does not exist`).toBe(true);
    }
  });
});

describe('Alertmanager config', () => {
  it('amtool check-config accepts the shipped Alertmanager config', async () => {
    const result = await runTool(AMTOOL, ['check-config', ALERTMANAGER_CONFIG]);
    expect(result.exitCode, result.output).toBe(0);
  });

  async function routedReceivers(config: string, labels: Readonly<Record<string, string>>): Promise<string[]> {
    const pairs = Object.entries(labels).map(([name, value]) => `${name}=${value}`);
    const result = await runTool(AMTOOL, ['config', 'routes', 'test', `--config.file=${config}`, ...pairs]);
    expect(result.exitCode, result.output).toBe(0);
    return result.stdout.trim().split(',');
  }

  it.each(routeCases)('$behaviour', async ({ labels, receivers }) => {
    expect(await routedReceivers(ALERTMANAGER_CONFIG, labels)).toEqual(receivers);
  });

  it('every alert in the rule files is routed to the steadfast controller by its static labels', async () => {
    for (const { alert, labels } of await loadAlertRules()) {
      expect(await routedReceivers(ALERTMANAGER_CONFIG, { alertname: alert, ...labels }), alert).toEqual([CONTROLLER_RECEIVER]);
    }
  });

  describe('renderAlertmanagerConfig', () => {
    let directory = '';
    beforeAll(async () => {
      directory = await mkdtemp(join(tmpdir(), 'steadfast-am-'));
    });
    afterAll(async () => {
      await rm(directory, { recursive: true, force: true });
    });

    it('points the controller receiver and its routes at the given webhook, token file and timings, and amtool accepts the result', async () => {
      const tokenFile = join(directory, 'token');
      await writeFile(tokenFile, 'a-test-token-of-enough-length\n', { mode: 0o600 });
      const rendered = renderAlertmanagerConfig({
        webhookUrl: 'http://127.0.0.1:19400/api/v1/alerts',
        credentialsFile: tokenFile,
        groupWait: '0s',
        groupInterval: '1s',
        repeatInterval: '1m',
      });
      const configFile = join(directory, 'alertmanager.yml');
      await writeFile(configFile, rendered);

      const result = await runTool(AMTOOL, ['check-config', configFile]);
      expect(result.exitCode, result.output).toBe(0);

      const config = z
        .object({
          route: z.object({ group_wait: z.string(), routes: z.array(z.record(z.string(), z.unknown())) }).loose(),
          receivers: z.array(z.object({ name: z.string(), webhook_configs: z.array(z.record(z.string(), z.unknown())).optional() })),
        })
        .parse(parseYaml(rendered));
      const webhooks = config.receivers.find((receiver) => receiver.name === CONTROLLER_RECEIVER)?.webhook_configs ?? [];
      expect(webhooks).toHaveLength(1);
      expect(webhooks[0]).toMatchObject({
        url: 'http://127.0.0.1:19400/api/v1/alerts',
        send_resolved: true,
        max_alerts: 0,
        http_config: { authorization: { type: 'Bearer', credentials_file: tokenFile } },
      });
      const controllerRoutes = config.route.routes.filter((route) => route.receiver === CONTROLLER_RECEIVER);
      expect(controllerRoutes.length).toBeGreaterThan(0);
      for (const route of controllerRoutes) {
        expect(route).toMatchObject({ group_wait: '0s', group_interval: '1s', repeat_interval: '1m' });
      }
      // The default route for people keeps its own timings.
      expect(config.route.group_wait).toBe('30s');
      expect(await routedReceivers(configFile, { alertname: 'SteadfastXidFatal', domain: 'gpu' })).toEqual([CONTROLLER_RECEIVER]);
    });

    it('keeps the shipped routes and timings when no timings are given', () => {
      const routeOf = (text: string): unknown => z.object({ route: z.unknown() }).loose().parse(parseYaml(text)).route;
      const rendered = renderAlertmanagerConfig({
        webhookUrl: 'https://controller.example:9400/api/v1/alerts',
        credentialsFile: '/run/steadfast/token',
      });
      expect(routeOf(rendered)).toEqual(routeOf(readFileSync(ALERTMANAGER_CONFIG, 'utf8')));
    });

    it.each([
      [{ webhookUrl: 'ftp://127.0.0.1/alerts', credentialsFile: '/etc/steadfast/token' }, 'webhookUrl'],
      [{ webhookUrl: 'http://127.0.0.1:9400/api/v1/alerts', credentialsFile: 'token' }, 'credentialsFile'],
      [{ webhookUrl: 'http://127.0.0.1:9400/api/v1/alerts', credentialsFile: '/t', groupWait: '5 minutes' }, 'groupWait'],
      [{ webhookUrl: 'http://127.0.0.1:9400/api/v1/alerts', credentialsFile: '/t', repeatInterval: '0s' }, 'repeatInterval'],
    ])('rejects malformed options with an InputError naming the field (%j)', (options, field) => {
      expect(() => renderAlertmanagerConfig(options)).toThrow(InputError);
      try {
        renderAlertmanagerConfig(options);
      } catch (error) {
        expect(error instanceof InputError && error.field).toBe(field);
      }
    });
  });
});
