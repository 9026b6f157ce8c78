import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { alertmanagerConfigCommand } from '../../cli/alertmanager-config.js';
import { rulesCommand } from '../../cli/rules.js';
import { ALERTMANAGER_CONFIG } from '../../rules/index.js';
import { DEFAULT_PROMETHEUS_RULE, SHIPPED_PROMETHEUS_RULE, renderPrometheusRule } from '../../rules/render.js';
import { runCli } from '../support/cli.js';

const run = promisify(execFile);
const PROMTOOL = process.env.PROMTOOL ?? 'promtool';
const AMTOOL = process.env.AMTOOL ?? 'amtool';

interface RuleFile {
  groups: Array<{ rules: Array<{ alert?: string; expr: string; for?: string; annotations?: Record<string, string> }> }>;
}

function alertNamed(file: string, name: string): RuleFile['groups'][number]['rules'][number] | undefined {
  const document = parseYaml(readFileSync(file, 'utf8')) as RuleFile;
  return document.groups.flatMap((group) => group.rules).find((rule) => rule.alert === name);
}

/** `steadfast rules` and `steadfast alertmanager-config`: what an operator renders instead of editing the shipped files. */
describe('rendering rules and the Alertmanager config for a deployment', () => {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-render-'));
  afterAll(() => rmSync(root, { recursive: true, force: true }));

  it("renders rule files with the thresholds, selectors and runbook URL from the operator's file, and promtool accepts them", async () => {
    const thresholds = join(root, 'thresholds.yaml');
    writeFileSync(thresholds, 'selectors: { agentJob: gpu-agents }\ngpu: { temperatureCelsius: 80 }\nrunbookBaseUrl: https://wiki.example.org/steadfast/\n');
    const out = join(root, 'rules');
    const result = await runCli(rulesCommand(), ['--out', out, '--thresholds', thresholds]);
    expect(result.stderr).toBe('');
    expect(result.exitCode).toBe(0);
    const files = readdirSync(out).sort();
    expect(files).toEqual(['compat.yml', 'gpu.yml', 'network.yml', 'steadfast.yml', 'storage.yml', 'training.yml', 'xid.yml']);
    const hot = alertNamed(join(out, 'gpu.yml'), 'SteadfastGpuTemperatureHigh');
    expect(hot?.expr).toContain('job="gpu-agents"');
    expect(hot?.expr).toContain('> 80');
    expect(hot?.annotations?.runbook_url).toMatch(/^https:\/\/wiki\.example\.org\/steadfast\/steadfast-.+\.md$/);
    const { stdout } = await run(PROMTOOL, ['check', 'rules', ...files.map((file) => join(out, file))]);
    expect(stdout).not.toContain('FAILED');
  });

  it('lets --runbook-base-url override the file and adds the missing slash', async () => {
    const out = join(root, 'runbooks');
    expect((await runCli(rulesCommand(), ['--out', out, '--runbook-base-url', 'https://runbooks.example.org/gpu'])).exitCode).toBe(0);
    expect(alertNamed(join(out, 'gpu.yml'), 'SteadfastGpuLost')?.annotations?.runbook_url).toBe('https://runbooks.example.org/gpu/steadfast-gpu-lost.md');
  });

  it('refuses a thresholds file with an unknown key or a bad value, naming the file and the key, and writes nothing', async () => {
    const bad = join(root, 'bad.yaml');
    const out = join(root, 'refused');
    writeFileSync(bad, 'gpu: { temperatureCelcius: 80 }\n');
    const unknown = await runCli(rulesCommand(), ['--out', out, '--thresholds', bad]);
    expect(unknown.exitCode).toBe(2);
    expect(unknown.stderr).toContain(`${bad}: invalid rule thresholds: gpu: Unrecognized key: "temperatureCelcius"`);
    writeFileSync(bad, 'xid: { window: soon }\n');
    const malformed = await runCli(rulesCommand(), ['--out', out, '--thresholds', bad]);
    expect(malformed.exitCode).toBe(2);
    expect(malformed.stderr).toContain('xid.window: must be a Prometheus duration like 30s or 5m');
    expect(() => readdirSync(out)).toThrow();
  });

  it('renders one PrometheusRule with the labels its Prometheus selects on', async () => {
    const out = join(root, 'operator');
    const result = await runCli(rulesCommand(), [
      '--out',
      out,
      '--format',
      'prometheusrule',
      '--namespace',
      'monitoring',
      '--label',
      'release=kube-prometheus-stack',
    ]);
    expect(result.exitCode).toBe(0);
    const rule = parseYaml(readFileSync(join(out, 'prometheusrule.yaml'), 'utf8')) as {
      kind: string;
      metadata: { namespace: string; labels: Record<string, string> };
      spec: RuleFile;
    };
    expect(rule.kind).toBe('PrometheusRule');
    expect(rule.metadata.namespace).toBe('monitoring');
    expect(rule.metadata.labels.release).toBe('kube-prometheus-stack');
    expect(rule.spec.groups.flatMap((group) => group.rules).some((entry) => entry.alert === 'SteadfastXidFatal')).toBe(true);
    const refused = await runCli(rulesCommand(), ['--out', out, '--format', 'prometheusrule', '--namespace', 'Not_A_Namespace']);
    expect(refused.exitCode).toBe(2);
    expect(refused.stderr).toContain('namespace: must be a lower-case DNS label');
  });

  it('keeps the shipped PrometheusRule and Alertmanager config equal to what the commands render (run npm run rules)', async () => {
    expect(readFileSync(SHIPPED_PROMETHEUS_RULE, 'utf8')).toBe(await renderPrometheusRule(DEFAULT_PROMETHEUS_RULE));
    const result = await runCli(alertmanagerConfigCommand(), []);
    expect(result.exitCode).toBe(0);
    expect(result.stdout).toBe(readFileSync(ALERTMANAGER_CONFIG, 'utf8'));
  });

  it('renders an Alertmanager config for the controller behind a Service, with email, Slack and PagerDuty for people, that amtool accepts', async () => {
    const out = join(root, 'alertmanager.yml');
    const result = await runCli(alertmanagerConfigCommand(), [
      '--out',
      out,
      '--controller-url',
      'http://steadfast-controller.steadfast.svc:9400/',
      '--credentials-file',
      '/etc/alertmanager/secrets/steadfast/token',
      '--email-to',
      'gpu-oncall@example.org',
      '--email-from',
      'alertmanager@example.org',
      '--smarthost',
      'smtp.example.org:587',
      '--slack-webhook-url-file',
      '/etc/alertmanager/secrets/slack-url',
      '--slack-channel',
      '#gpu-ops',
      '--pagerduty-routing-key-file',
      '/etc/alertmanager/secrets/pagerduty-key',
    ]);
    expect(result.exitCode).toBe(0);
    const { stdout } = await run(AMTOOL, ['check-config', out]);
    expect(stdout).toContain('SUCCESS');
    const config = parseYaml(readFileSync(out, 'utf8')) as { receivers: Array<Record<string, Array<Record<string, unknown>>> & { name: string }> };
    const controller = config.receivers.find((receiver) => receiver.name === 'steadfast-controller');
    expect(controller?.webhook_configs?.[0]).toMatchObject({
      url: 'http://steadfast-controller.steadfast.svc:9400/api/v1/alerts',
      http_config: { authorization: { credentials_file: '/etc/alertmanager/secrets/steadfast/token' } },
    });
    const humans = config.receivers.find((receiver) => receiver.name === 'humans');
    expect(humans?.email_configs?.[0]).toMatchObject({ to: 'gpu-oncall@example.org', smarthost: 'smtp.example.org:587' });
    expect(humans?.slack_configs?.[0]).toMatchObject({ api_url_file: '/etc/alertmanager/secrets/slack-url', channel: '#gpu-ops' });
    expect(humans?.pagerduty_configs?.[0]).toMatchObject({ routing_key_file: '/etc/alertmanager/secrets/pagerduty-key' });
  });

  it('refuses half a notifier, a relative secret file and a controller URL with credentials in it, naming the flag', async () => {
    const half = await runCli(alertmanagerConfigCommand(), ['--email-to', 'a@example.org']);
    expect(half.exitCode).toBe(2);
    expect(half.stderr).toContain('--email-to, --email-from and --smarthost go together');
    const relative = await runCli(alertmanagerConfigCommand(), ['--pagerduty-routing-key-file', 'key.txt']);
    expect(relative.exitCode).toBe(2);
    expect(relative.stderr).toContain('humans.pagerduty.routingKeyFile: must be an absolute path');
    const credentials = await runCli(alertmanagerConfigCommand(), ['--controller-url', 'http://user:pw@controller:9400']);
    expect(credentials.exitCode).toBe(2);
    expect(credentials.stderr).toContain('--controller-url: must be a base URL without query, fragment or credentials');
  });
});
