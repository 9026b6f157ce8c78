import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Command, InvalidArgumentError, Option } from 'commander';
import { InputError } from '../core/errors.js';
import { renderRuleFiles } from '../rules/build.js';
import { DEFAULT_PROMETHEUS_RULE, renderPrometheusRule, thresholdsFromFile } from '../rules/render.js';
import { DEFAULT_THRESHOLDS, thresholds as validate, type Thresholds } from '../rules/thresholds.js';
import { runCommand } from './common.js';

/**
 * `steadfast rules`: renders the alerting rules for an operator's Prometheus, with their
 * thresholds, selectors and runbook links, instead of the operator editing the shipped files.
 */

interface RulesOptions {
  out: string;
  format: 'files' | 'prometheusrule';
  thresholds?: string;
  runbookBaseUrl?: string;
  name: string;
  namespace: string;
  label: Record<string, string>;
}

function parseLabel(value: string, previous: Record<string, string>): Record<string, string> {
  const match = /^([^=]+)=(.*)$/.exec(value);
  if (!match?.[1]) throw new InvalidArgumentError('must be key=value');
  return { ...previous, [match[1]]: match[2] ?? '' };
}

function chosenThresholds(options: RulesOptions): Thresholds {
  const base = options.thresholds ? thresholdsFromFile(options.thresholds) : DEFAULT_THRESHOLDS;
  if (options.runbookBaseUrl === undefined) return base;
  const url = options.runbookBaseUrl.endsWith('/') ? options.runbookBaseUrl : `${options.runbookBaseUrl}/`;
  try {
    return validate({ ...base, runbookBaseUrl: url });
  } catch (error) {
    if (error instanceof InputError)
      throw new InputError(`--runbook-base-url: must be a URL, got ${JSON.stringify(options.runbookBaseUrl)}`, '--runbook-base-url');
    throw error;
  }
}

export function rulesCommand(): Command {
  return new Command('rules')
    .description(
      'Render the Prometheus alerting rules with your thresholds, selectors and runbook links: one file per domain, or one PrometheusRule for the prometheus-operator.',
    )
    .requiredOption('-o, --out <dir>', 'directory to write into (created if missing)')
    .addOption(
      new Option('--format <format>', 'files: <domain>.yml for rule_files:; prometheusrule: one PrometheusRule object')
        .choices(['files', 'prometheusrule'])
        .default('files'),
    )
    .option('--thresholds <file>', 'YAML file of thresholds and selectors laid over the defaults (keys as in rules/thresholds.ts)')
    .option('--runbook-base-url <url>', 'where the runbook_url annotations point: your copy of docs/runbooks/ (overrides runbookBaseUrl in --thresholds)')
    .option('--name <name>', 'PrometheusRule name', String(DEFAULT_PROMETHEUS_RULE.name))
    .option('--namespace <namespace>', 'PrometheusRule namespace', String(DEFAULT_PROMETHEUS_RULE.namespace))
    .option('--label <key=value>', 'PrometheusRule label the Prometheus ruleSelector matches (repeatable), e.g. release=kube-prometheus-stack', parseLabel, {})
    .action(async (options: RulesOptions) => {
      await runCommand(async () => {
        const config = chosenThresholds(options);
        const written: string[] = [];
        if (options.format === 'prometheusrule') {
          const text = await renderPrometheusRule({ name: options.name, namespace: options.namespace, labels: options.label }, config);
          mkdirSync(options.out, { recursive: true });
          const path = join(options.out, 'prometheusrule.yaml');
          writeFileSync(path, text);
          written.push(path);
        } else {
          const rendered = await renderRuleFiles(config);
          mkdirSync(options.out, { recursive: true });
          for (const [domain, text] of rendered) {
            const path = join(options.out, `${domain}.yml`);
            writeFileSync(path, text);
            written.push(path);
          }
        }
        process.stdout.write(`Wrote ${written.length} file${written.length === 1 ? '' : 's'}:\n${written.map((path) => `  ${path}\n`).join('')}`);
      });
    });
}
