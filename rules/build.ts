import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { stringify } from 'yaml';
import { repoRoot } from '../core/paths.js';
import { DOMAINS, PAGE_HUMANS_LABEL, type AlertRule, type Domain, type DomainRules, type RuleGroup } from './spec.js';
import { DEFAULT_THRESHOLDS, thresholds as validate, type Thresholds } from './thresholds.js';

/**
 * Renders the rule domains to Prometheus rule files: `rules/<domain>.yml`. The files are
 * committed (Prometheus and promtool read them as they are); test/rules.test.ts fails when one
 * differs from what this renders, and `npm run rules` rewrites them.
 */

export const RULES_DIR = join(repoRoot(), 'rules');

export function ruleFile(domain: Domain): string {
  return join(RULES_DIR, `${domain}.yml`);
}

const DOMAIN_MODULES_DIR = join(dirname(fileURLToPath(import.meta.url)), 'domains');

/**
 * Whether rules/domains/<domain> exists: compiled (.js, in dist/) or as source (.ts, under tsx
 * or vitest). Checked up front, so a domain module that fails to import (a broken import of its
 * own) is an error rather than a domain silently left out.
 */
function hasDomainModule(domain: Domain): boolean {
  return ['.js', '.ts'].some((extension) => existsSync(join(DOMAIN_MODULES_DIR, `${domain}${extension}`)));
}

/** Loads each domain module that exists (rules/domains/<domain>.ts), in DOMAINS order. */
export async function loadDomains(): Promise<DomainRules[]> {
  const loaded: DomainRules[] = [];
  for (const domain of DOMAINS) {
    if (!hasDomainModule(domain)) continue;
    // @vite-ignore: vitest must resolve this at run time (`.js` to the `.ts` source), not as a glob.
    const module = (await import(/* @vite-ignore */ `./domains/${domain}.js`)) as { rules?: DomainRules };
    if (!module.rules || module.rules.domain !== domain) throw new Error(`rules/domains/${domain}.ts must export \`rules\` for domain ${domain}`);
    loaded.push(module.rules);
  }
  return loaded;
}

/** The labels the renderer owns; a rule setting them in `labels` would be silently overwritten. */
const RESERVED_LABELS = ['severity', 'domain', PAGE_HUMANS_LABEL.name] as const;

/** An alert's labels as rendered: its own, the people's route label where its meaning routes it to them, severity and domain. */
function alertLabels(rule: AlertRule, domain: Domain): Record<string, string> {
  const route: Record<string, string> = rule.meaning.route === 'humans' ? { [PAGE_HUMANS_LABEL.name]: PAGE_HUMANS_LABEL.value } : {};
  return { ...(rule.labels ?? {}), ...route, severity: rule.severity, domain: rule.domain ?? domain };
}

/** One domain's rule groups as the plain object Prometheus (and a PrometheusRule's `spec.groups`) reads. */
function groupsDocument(domain: Domain, groups: readonly RuleGroup[], config: Thresholds): { groups: object[] } {
  for (const rule of groups.flatMap((group) => group.rules)) {
    if (rule.kind !== 'alert') continue;
    const reserved = RESERVED_LABELS.filter((label) => rule.labels?.[label] !== undefined);
    if (reserved.length > 0) {
      const fields = "use its severity / domain fields and its meaning's route";
      throw new Error(`rules/domains/${domain}.ts: ${rule.alert} sets ${reserved.join(', ')} in labels; ${fields}`);
    }
  }
  return {
    groups: groups.map((group) => ({
      name: group.name,
      rules: group.rules.map((rule) =>
        rule.kind === 'record'
          ? { record: rule.record, expr: rule.expr, ...(rule.labels ? { labels: { ...rule.labels } } : {}) }
          : {
              alert: rule.alert,
              expr: rule.expr,
              for: rule.for,
              labels: alertLabels(rule, domain),
              annotations: {
                summary: rule.summary,
                description: rule.description,
                runbook_url: `${config.runbookBaseUrl}${rule.runbook}`,
              },
            },
      ),
    })),
  };
}

function renderGroups(domain: Domain, groups: readonly RuleGroup[], config: Thresholds): string {
  const document = groupsDocument(domain, groups, config);
  const header = `# Generated from rules/domains/${domain}.ts and rules/thresholds.ts by \`npm run rules\`; edit those, not this file.\n`;
  return header + stringify(document, { lineWidth: 0 });
}

/** The rendered text of every domain's rule file. */
export async function renderRuleFiles(config: Thresholds = DEFAULT_THRESHOLDS): Promise<Map<Domain, string>> {
  const valid = validate(config);
  const rendered = new Map<Domain, string>();
  for (const domain of await loadDomains()) rendered.set(domain.domain, renderGroups(domain.domain, domain.groups(valid), valid));
  return rendered;
}

/** Every domain's rule groups, in DOMAINS order, as objects (for a PrometheusRule). */
export async function ruleGroups(config: Thresholds = DEFAULT_THRESHOLDS): Promise<object[]> {
  const valid = validate(config);
  return (await loadDomains()).flatMap((domain) => groupsDocument(domain.domain, domain.groups(valid), valid).groups);
}

/** Where docs/alerts.md holds the table of rule files that `npm run rules` writes. */
export const RULE_TABLE_DOC = join(repoRoot(), 'docs', 'alerts.md');
const TABLE_BEGIN = '<!-- rule-files: written by `npm run rules` from rules/domains; do not edit -->';
const TABLE_END = '<!-- /rule-files -->';

/** The docs' summary of the rule files: how many, their groups, alerts and recording rules. */
export async function renderRuleTable(config: Thresholds = DEFAULT_THRESHOLDS): Promise<string> {
  const valid = validate(config);
  const rows = (await loadDomains()).map((domain) => {
    const groups = domain.groups(valid);
    const rules = groups.flatMap((group) => group.rules);
    return {
      file: `rules/${domain.domain}.yml`,
      groups: groups.map((group) => `\`${group.name}\``).join(', '),
      alerts: rules.filter((rule) => rule.kind === 'alert').length,
      records: rules.filter((rule) => rule.kind === 'record').length,
    };
  });
  const total = (key: 'alerts' | 'records'): number => rows.reduce((sum, row) => sum + row[key], 0);
  const groupCount = rows.reduce((sum, row) => sum + row.groups.split(', ').length, 0);
  const count = (n: number): string => (n === 0 ? '—' : String(n));
  return [
    TABLE_BEGIN,
    `${rows.length} files, ${groupCount} rule groups, ${total('alerts')} alerts and ${total('records')} recording rules in all:`,
    '',
    '| file | groups | alerts | recording rules |',
    '|---|---|---|---|',
    ...rows.map((row) => `| \`${row.file}\` | ${row.groups} | ${count(row.alerts)} | ${count(row.records)} |`),
    TABLE_END,
  ].join('\n');
}

/** `doc` with its rule-file table replaced by `table`; throws when the doc has no such table. */
export function withRuleTable(doc: string, table: string): string {
  const begin = doc.indexOf(TABLE_BEGIN);
  const end = doc.indexOf(TABLE_END);
  if (begin < 0 || end < begin) throw new Error(`${RULE_TABLE_DOC} has no rule-file table (between ${TABLE_BEGIN} and ${TABLE_END})`);
  return doc.slice(0, begin) + table + doc.slice(end + TABLE_END.length);
}

/** Writes `text` to `path` unless the file already holds it; whether it wrote. */
export function writeIfChanged(path: string, text: string): boolean {
  let current: string;
  try {
    current = readFileSync(path, 'utf8');
  } catch {
    current = '';
  }
  if (current === text) return false;
  writeFileSync(path, text);
  return true;
}

/** Writes every rule file; returns the paths whose content changed. */
export async function writeRuleFiles(config: Thresholds = DEFAULT_THRESHOLDS): Promise<string[]> {
  const changed: string[] = [];
  for (const [domain, text] of await renderRuleFiles(config)) {
    const path = ruleFile(domain);
    if (writeIfChanged(path, text)) changed.push(path);
  }
  return changed;
}
