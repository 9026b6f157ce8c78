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
import { classifyXid, xidCodesWithRemedy } from '../core/xid.js';
import { RULE_TABLE_DOC, renderRuleFiles, renderRuleTable, ruleFile, withRuleTable } from '../rules/build.js';
import { ALERTMANAGER_CONFIG, CONTROLLER_RECEIVER, RULE_FILES, renderAlertmanagerConfig } from '../rules/index.js';
import { catalogueEntry } from '../rules/catalogue.js';
import { DEFAULT_THRESHOLDS } from '../rules/thresholds.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const RULES = join(ROOT, 'rules');
const RULE_TESTS = join(RULES, 'tests');
const RUNBOOK_BASE = 'https://github.com/steadfast-dev/steadfast/blob/main/docs/runbooks/';
const PROMTOOL = process.env.PROMTOOL ?? 'promtool';
const AMTOOL = process.env.AMTOOL ?? 'amtool';
const TOOL_TIMEOUT_MS = 30_000;
/** The receiver and the label that page people (rules/alertmanager.yml). */
const HUMANS_RECEIVER = 'humans';
const PAGE_HUMANS_LABEL = 'notify';

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
  readonly expr: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly annotations: Readonly<Record<string, string>>;
}

async function loadAlertRules(): Promise<AlertRule[]> {
  const alerts: AlertRule[] = [];
  for (const file of RULE_FILES) {
    const parsed = ruleFileSchema.parse(parseYaml(await readFile(file, 'utf8')));
    for (const group of parsed.groups) {
      for (const rule of group.rules) {
        if (rule.alert !== undefined)
          alerts.push({ file: basename(file), alert: rule.alert, expr: rule.expr, labels: rule.labels, annotations: rule.annotations });
      }
    }
  }
  return alerts;
}

const promtoolTestSchema = z
  .object({
    tests: z.array(
      z
        .object({
          alert_rule_test: z.array(z.object({ alertname: z.string(), exp_alerts: z.array(z.unknown()).default([]) }).loose()).default([]),
        })
        .loose(),
    ),
  })
  .loose();

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

  it('every committed rules/<domain>.yml is exactly what its domain module renders, and every rendered domain is in RULE_FILES', async () => {
    const rendered = await renderRuleFiles();
    expect(rendered.size).toBeGreaterThan(0);
    for (const [domain, text] of rendered) {
      const path = ruleFile(domain);
      const committed = existsSync(path) ? readFileSync(path, 'utf8') : '';
      expect(committed, `rules/${domain}.yml differs from rules/domains/${domain}.ts: run npm run rules`).toBe(text);
    }
    expect([...RULE_FILES].sort(), 'a rules/<domain>.yml without a rules/domains/<domain>.ts module').toEqual([...rendered.keys()].map(ruleFile).sort());
  });

  it('docs/alerts.md counts the rule files, groups, alerts and recording rules as rendered, and its prometheus.yml lists every file', async () => {
    const doc = readFileSync(RULE_TABLE_DOC, 'utf8');
    expect(doc, 'docs/alerts.md is out of date: run npm run rules').toBe(withRuleTable(doc, await renderRuleTable()));
    const listed = [...doc.matchAll(/^ {2}- \/path\/to\/steadfast\/(rules\/\w+\.yml)/gm)].map((match) => match[1]);
    expect(listed.sort()).toEqual(RULE_FILES.map((file) => `rules/${basename(file)}`).sort());
  });

  it('the Xid remedy alerts select exactly the codes the agent classifies with that remedy, whatever the message', async () => {
    const rendered = (await renderRuleFiles()).get('xid') ?? '';
    for (const remedy of ['reset_gpu', 'reboot_node', 'restart_app'] as const) {
      const codes = xidCodesWithRemedy(remedy);
      expect(codes.length, remedy).toBeGreaterThan(0);
      expect(rendered, remedy).toContain(`xid=~"${codes.join('|')}"`);
      for (let code = 0; code < 256; code++) {
        const byCode = [classifyXid(code), classifyXid(code, 'Fatal XC0'), classifyXid(code, 'changed from 0x0 (none) to 0x2 (reboot)')];
        const always = byCode.every((xid) => xid.remedy === remedy);
        expect(codes.includes(code), `Xid ${code} and remedy ${remedy}`).toBe(always);
      }
    }
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

  it('every alert carries severity, domain, a static summary, a description naming what it is about, and a runbook_url whose runbook exists', async () => {
    const alerts = await loadAlertRules();
    expect(alerts.length).toBeGreaterThan(0);
    const agentJob = `job="${DEFAULT_THRESHOLDS.selectors.agentJob}"`;
    for (const { file, alert, expr, labels, annotations } of alerts) {
      const where = `${file}: ${alert}`;
      expect(alert, `${where}: alert names start with Steadfast`).toMatch(/^Steadfast[A-Z][A-Za-z]+$/);
      expect(labels.severity, `${where} has no severity label`).toMatch(/^(critical|warning|info)$/);
      expect(labels.domain, `${where} has no domain label`).toMatch(/^[a-z]+$/);
      expect(annotations.summary, `${where} has no summary`).toBeTruthy();
      expect(annotations.summary, `${where}: the summary must be static`).not.toContain('{{');
      // An alert on the agents' series is about a node. Others (the controller, a training job
      // across nodes) name their instance, scrape job or training job instead.
      const subject = expr.includes(agentJob) ? /\{\{ \$labels\.node \}\}/ : /\{\{ \$labels\.(node|instance|job|training_job) \}\}/;
      expect(annotations.description ?? '', `${where}: the description must name what the alert is about from its labels`).toMatch(subject);
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

  it('every alert in the rule files reaches the steadfast controller, and people only when its meaning routes it to them', async () => {
    for (const { alert, labels } of await loadAlertRules()) {
      const expected = catalogueEntry(alert)?.meaning.route === 'humans' ? [CONTROLLER_RECEIVER, HUMANS_RECEIVER] : [CONTROLLER_RECEIVER];
      expect(await routedReceivers(ALERTMANAGER_CONFIG, { alertname: alert, ...labels }), alert).toEqual(expected);
    }
  });

  it('pages people for refused and failing actions and for steadfast itself being down, and for no GPU fault steadfast handles', async () => {
    const byName = new Map((await loadAlertRules()).map((rule) => [rule.alert, rule]));
    for (const name of ['SteadfastActionsRefused', 'SteadfastActionsFailing', 'SteadfastAgentDown', 'SteadfastControllerDown']) {
      expect(byName.get(name)?.labels[PAGE_HUMANS_LABEL], `${name} must page people`).toBe(HUMANS_RECEIVER);
      expect(catalogueEntry(name)?.meaning.route, `${name} must be routed to people`).toBe('humans');
    }
    for (const rule of byName.values()) {
      if (rule.labels.domain === 'gpu') expect(rule.labels[PAGE_HUMANS_LABEL], `${rule.alert} is a GPU fault steadfast handles`).toBeUndefined();
    }
  });

  describe('inhibitions', () => {
    const inhibitRules = z
      .object({
        inhibit_rules: z.array(
          z
            .object({ source_matchers: z.array(z.string()).min(1), target_matchers: z.array(z.string()).min(1), equal: z.array(z.string()).default([]) })
            .strict(),
        ),
      })
      .loose()
      .parse(parseYaml(readFileSync(ALERTMANAGER_CONFIG, 'utf8'))).inhibit_rules;

    /** Alertmanager's matcher syntax as the shipped config uses it: name, operator, quoted value; regexes anchored. */
    function matches(matcher: string, labels: Readonly<Record<string, string>>): boolean {
      const parsed = /^([A-Za-z_][A-Za-z0-9_]*)(=~|!~|!=|=)"((?:[^"\\]|\\.)*)"$/.exec(matcher.trim());
      if (!parsed) throw new Error(`matcher ${matcher} is not of the form name="value"`);
      const [, name = '', op, quoted = ''] = parsed;
      const value = z.string().parse(JSON.parse(`"${quoted}"`));
      const actual = labels[name] ?? '';
      if (op === '=') return actual === value;
      if (op === '!=') return actual !== value;
      const found = new RegExp(`^(?:${value})$`).test(actual);
      return op === '=~' ? found : !found;
    }

    function inhibited(target: Readonly<Record<string, string>>, source: Readonly<Record<string, string>>): boolean {
      return inhibitRules.some(
        (rule) =>
          rule.source_matchers.every((matcher) => matches(matcher, source)) &&
          rule.target_matchers.every((matcher) => matches(matcher, target)) &&
          rule.equal.every((label) => (source[label] ?? '') === (target[label] ?? '')),
      );
    }

    /** A firing instance of a rule-file alert: its static labels plus the series' labels. */
    async function firing(alertname: string, labels: Readonly<Record<string, string>>): Promise<Record<string, string>> {
      const rule = (await loadAlertRules()).find((candidate) => candidate.alert === alertname);
      if (!rule) throw new Error(`no alert ${alertname} in the rule files`);
      return { alertname, ...rule.labels, ...labels };
    }

    it('names only alerts that exist in the rule files', async () => {
      const names = new Set((await loadAlertRules()).map((rule) => rule.alert));
      for (const matcher of inhibitRules.flatMap((rule) => [...rule.source_matchers, ...rule.target_matchers])) {
        const exact = /^alertname="(.+)"$/.exec(matcher)?.[1];
        if (exact !== undefined) expect(names.has(exact), `${matcher} names no alert`).toBe(true);
      }
    });

    it("an agent down on a node silences that node's GPU, Xid and port alerts, and nothing on other nodes or in other domains", async () => {
      const agentDown = await firing('SteadfastAgentDown', { node: 'node-3', instance: '10.0.0.3:9401', job: 'steadfast-agent' });
      const gpu = { gpu: '0', pci_bus_id: '0000:3b:00' };
      expect(inhibited(await firing('SteadfastGpuLost', { node: 'node-3', ...gpu }), agentDown)).toBe(true);
      expect(inhibited(await firing('SteadfastXidFatal', { node: 'node-3', pci_bus_id: gpu.pci_bus_id, xid: '79' }), agentDown)).toBe(true);
      expect(
        inhibited({ alertname: 'SteadfastRdmaPortDown', domain: 'network', severity: 'critical', node: 'node-3', device: 'mlx5_0', port: '1' }, agentDown),
      ).toBe(true);
      expect(inhibited(await firing('SteadfastGpuLost', { node: 'node-4', ...gpu }), agentDown)).toBe(false);
      expect(inhibited({ alertname: 'SteadfastNfsRpcBacklog', domain: 'storage', severity: 'warning', node: 'node-3' }, agentDown)).toBe(false);
      expect(inhibited(await firing('SteadfastActionsRefused', { verb: 'drain', state: 'refused', backend: 'slurm' }), agentDown)).toBe(false);
    });

    it('a lost GPU silences the Xid alerts of that GPU only', async () => {
      const lost = await firing('SteadfastGpuLost', { node: 'node-3', gpu: '0', pci_bus_id: '0000:3b:00' });
      for (const alertname of ['SteadfastXidFatal', 'SteadfastXidGpuResetRequired', 'SteadfastXidNodeRebootRequired']) {
        expect(inhibited(await firing(alertname, { node: 'node-3', pci_bus_id: '0000:3b:00', xid: '79' }), lost), alertname).toBe(true);
        expect(inhibited(await firing(alertname, { node: 'node-3', pci_bus_id: '0000:b3:00', xid: '79' }), lost), `${alertname} on another GPU`).toBe(false);
        expect(inhibited(await firing(alertname, { node: 'node-4', pci_bus_id: '0000:3b:00', xid: '79' }), lost), `${alertname} on another node`).toBe(false);
      }
      expect(inhibited(await firing('SteadfastGpuEccUncorrectable', { node: 'node-3', gpu: '0', pci_bus_id: '0000:3b:00' }), lost)).toBe(false);
    });

    it('a node that needs a reboot silences its GPU-reset alerts, whose repair the reboot includes', async () => {
      const reboot = await firing('SteadfastXidNodeRebootRequired', { node: 'node-3', pci_bus_id: '0000:3b:00', xid: '79' });
      expect(inhibited(await firing('SteadfastXidGpuResetRequired', { node: 'node-3', pci_bus_id: '0000:b3:00', xid: '48' }), reboot)).toBe(true);
      expect(inhibited(await firing('SteadfastXidGpuResetRequired', { node: 'node-4', pci_bus_id: '0000:b3:00', xid: '48' }), reboot)).toBe(false);
      expect(inhibited(await firing('SteadfastXidFatal', { node: 'node-3', pci_bus_id: '0000:b3:00', xid: '48' }), reboot)).toBe(false);
    });
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
        max_alerts: 1000,
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
