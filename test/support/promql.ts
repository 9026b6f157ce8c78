import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parser } from '@prometheus-io/lezer-promql';
import { parse as parseYaml } from 'yaml';
import { silentLogger } from '../../core/log.js';
import { ControllerMetrics } from '../../controller/metrics.js';
import { createAgent } from '../../agent/agent.js';
import { enabledFactories } from '../../agent/index.js';
import { buildFixtureNode } from '../../tryit/fixture-node.js';

/**
 * PromQL checks shared by the dashboard and rule tests: parse an expression with Prometheus'
 * own lezer grammar, list the metric names it selects, and list every metric name steadfast
 * actually produces — read from a live agent and the controller's registry, not from a list.
 */

/** Grafana's built-in interval variables, replaced by a duration so the PromQL parses. */
const GRAFANA_INTERVALS = /\$(?:__range|__rate_interval|__interval)\b|\$\{(?:__range|__rate_interval|__interval)\}/g;
/** Grafana's `label_values(metric, label)` variable query: only `metric` is PromQL. */
const LABEL_VALUES = /^label_values\(\s*(.+?)\s*,\s*[A-Za-z_][A-Za-z0-9_]*\s*\)$/s;

export interface ParsedPromql {
  /** Metric names of every vector selector. */
  metrics: string[];
  /** Where the grammar could not parse, as `offset: text`. */
  errors: string[];
  /** Selectors with no metric name (e.g. only `{__name__=~…}`), which these checks cannot follow. */
  unnamed: string[];
  /** The text of every vector selector, matchers included. */
  selectors: string[];
}

/**
 * The PromQL Prometheus would receive for a Grafana expression: a `label_values` query becomes
 * its selector, Grafana's interval variables a duration, and each `$name` of `variables` its value.
 */
export function grafanaExprAsPromql(rawExpr: string, variables: Readonly<Record<string, string>> = {}): string {
  let expr = (LABEL_VALUES.exec(rawExpr.trim())?.[1] ?? rawExpr).replace(GRAFANA_INTERVALS, '5m');
  for (const [name, value] of Object.entries(variables)) expr = expr.replaceAll(`$${name}`, value);
  return expr;
}

export function parsePromql(rawExpr: string): ParsedPromql {
  const expr = grafanaExprAsPromql(rawExpr);
  const result: ParsedPromql = { metrics: [], errors: [], unnamed: [], selectors: [] };
  parser.parse(expr).iterate({
    enter: (node) => {
      if (node.type.isError) {
        result.errors.push(`${node.from}: ${JSON.stringify(expr.slice(Math.max(0, node.from - 20), node.to + 20))}`);
      } else if (node.name === 'VectorSelector') {
        result.selectors.push(expr.slice(node.from, node.to));
        const identifier = node.node.getChild('Identifier');
        if (identifier) result.metrics.push(expr.slice(identifier.from, identifier.to));
        else result.unnamed.push(expr.slice(node.from, node.to));
      }
    },
  });
  return result;
}

/** Names declared by `# TYPE` lines; a histogram or summary adds the series it really exposes. */
export function exposedNames(exposition: string): string[] {
  const names: string[] = [];
  for (const match of exposition.matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
    const [, name = '', type = ''] = match;
    names.push(name);
    if (type === 'histogram') names.push(`${name}_bucket`, `${name}_sum`, `${name}_count`);
    if (type === 'summary') names.push(`${name}_sum`, `${name}_count`);
  }
  return names;
}

/** What the agent exposes with every collector on a whole fixture node, after a training loop pushed a step. */
export async function agentMetricNames(): Promise<string[]> {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-metric-names-'));
  const node = buildFixtureNode(root);
  const agent = createAgent({
    node: 'fixture-node',
    listen: { host: '127.0.0.1', port: 0 },
    paths: { sysfs: node.sysfs, procfs: node.procfs, kmsg: node.kmsg, nvidiaSmiXml: node.nvidiaSmiXml, nvidiaSmi: '/nonexistent/nvidia-smi' },
    pollIntervalSeconds: 60,
    collectors: enabledFactories({}),
    logger: silentLogger(),
  });
  try {
    const { port } = await agent.start();
    const step = {
      job: 'gpt',
      rank: 0,
      iteration: 10,
      iteration_seconds: 1.5,
      loss: 2.5,
      grad_norm: 1.2,
      samples_per_second: 100,
      tflops_per_gpu: 150,
      skipped: 0,
      nan: 0,
    };
    const pushed = await fetch(`http://127.0.0.1:${port}/api/v1/training`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(step),
    });
    if (!pushed.ok) throw new Error(`training push answered ${pushed.status}: ${await pushed.text()}`);
    return exposedNames(await (await fetch(`http://127.0.0.1:${port}/metrics`)).text());
  } finally {
    await agent.close();
    rmSync(root, { recursive: true, force: true });
  }
}

/** What the controller's registry exposes (its own metrics and the process metrics). */
export async function controllerMetricNames(): Promise<string[]> {
  // No queues: the queue gauges still declare themselves, which is all this needs.
  return exposedNames(await new ControllerMetrics([]).registry.metrics());
}

/** Series Prometheus makes itself. */
export const PROMETHEUS_METRICS = ['up', 'ALERTS', 'ALERTS_FOR_STATE'] as const;

export interface RuleFile {
  path: string;
  records: string[];
  /** Every `expr` with the rule that holds it. */
  exprs: { rule: string; expr: string }[];
}

interface RuleYaml {
  groups?: { name?: string; rules?: { record?: string; alert?: string; expr?: unknown }[] }[];
}

/** Every Prometheus rule file in `dir` (a YAML file with `groups`), as it is on disk now. */
export function readRuleFiles(dir: string): RuleFile[] {
  const files: RuleFile[] = [];
  for (const name of readdirSync(dir)
    .filter((file) => file.endsWith('.yml') || file.endsWith('.yaml'))
    .sort()) {
    const path = join(dir, name);
    const doc = parseYaml(readFileSync(path, 'utf8')) as RuleYaml | null;
    if (!doc || !Array.isArray(doc.groups)) continue;
    const file: RuleFile = { path, records: [], exprs: [] };
    for (const group of doc.groups) {
      for (const rule of group.rules ?? []) {
        const ruleName = rule.record ?? rule.alert ?? '(unnamed)';
        if (rule.record !== undefined) file.records.push(rule.record);
        file.exprs.push({ rule: `${name} ${group.name ?? ''} ${ruleName}`, expr: String(rule.expr ?? '') });
      }
    }
    files.push(file);
  }
  return files;
}
