import { readFileSync } from 'node:fs';
import { RULE_TABLE_DOC, renderRuleTable, withRuleTable, writeIfChanged, writeRuleFiles } from './build.js';
import { ALERTMANAGER_CONFIG, DEFAULT_CREDENTIALS_FILE, DEFAULT_WEBHOOK_URL, renderAlertmanagerConfig } from './index.js';
import { DEFAULT_PROMETHEUS_RULE, SHIPPED_PROMETHEUS_RULE, renderPrometheusRule } from './render.js';

/**
 * `npm run rules`: rewrites rules/<domain>.yml and deploy/kubernetes/prometheusrule.yaml from the
 * domain modules, and rules/alertmanager.yml as `steadfast alertmanager-config` renders it with
 * its defaults (so that the shipped file and the command's output never differ), and the table of
 * rule files in docs/alerts.md.
 */
const changed = await writeRuleFiles();

for (const [path, text] of [
  [SHIPPED_PROMETHEUS_RULE, await renderPrometheusRule(DEFAULT_PROMETHEUS_RULE)],
  [ALERTMANAGER_CONFIG, renderAlertmanagerConfig({ webhookUrl: DEFAULT_WEBHOOK_URL, credentialsFile: DEFAULT_CREDENTIALS_FILE })],
  [RULE_TABLE_DOC, withRuleTable(readFileSync(RULE_TABLE_DOC, 'utf8'), await renderRuleTable())],
] as const) {
  if (writeIfChanged(path, text)) changed.push(path);
}
process.stdout.write(changed.length === 0 ? 'rules: every file up to date\n' : `rules: wrote ${changed.join(', ')}\n`);
