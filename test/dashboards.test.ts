import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { dashboardsCommand } from '../cli/dashboards.js';
import { parse } from 'yaml';
import { buildDashboards, writeDashboards } from '../dashboards/index.js';

/** Series the agent, the controller and Prometheus itself export; dashboards may use only these. */
const AGENT_METRICS = [
  'steadfast_xid_errors_total',
  'steadfast_gpu_present',
  'steadfast_gpu_temperature_celsius',
  'steadfast_gpu_power_watts',
  'steadfast_gpu_power_limit_watts',
  'steadfast_gpu_utilization_ratio',
  'steadfast_gpu_memory_used_bytes',
  'steadfast_gpu_memory_total_bytes',
  'steadfast_gpu_ecc_errors_total',
  'steadfast_gpu_remapped_rows_total',
  'steadfast_gpu_remapped_rows_pending',
  'steadfast_gpu_remapped_rows_failure',
  'steadfast_collector_success',
  'steadfast_collector_duration_seconds',
];
const CONTROLLER_METRICS = [
  'steadfast_signals_accepted_total',
  'steadfast_requests_rejected_total',
  'steadfast_actions_total',
  'steadfast_queue_jobs',
  ...['_bucket', '_sum', '_count'].map((suffix) => `steadfast_signal_to_action_seconds${suffix}`),
];
const KNOWN_METRICS = new Set([...AGENT_METRICS, ...CONTROLLER_METRICS, 'ALERTS']);

const FUNCTIONS = new Set([
  'rate', 'irate', 'increase', 'delta', 'sum', 'min', 'max', 'avg', 'count', 'topk', 'bottomk',
  'histogram_quantile', 'label_values', 'vector', 'abs', 'clamp_min', 'clamp_max', 'time',
  'max_over_time', 'min_over_time', 'avg_over_time', 'label_replace', 'absent',
]);
const KEYWORDS = new Set(['by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'and', 'or', 'unless', 'offset', 'bool']);

/**
 * Metric names in a PromQL expression. Strings, label matchers, range windows and grouping
 * label lists are cut first; of the identifiers left, keywords are skipped, one before `(` must
 * be a known function, and any other is a metric name.
 */
function metricNames(expr: string): string[] {
  const stripped = expr
    .replace(/"(?:[^"\\]|\\.)*"/g, '""')
    .replace(/\{[^}]*\}/g, ' ')
    .replace(/\[[^\]]*\]/g, ' ')
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ')
    .replace(/\blabel_values\(\s*([^,()]+),\s*[A-Za-z_]\w*\s*\)/g, 'label_values($1)');
  const names: string[] = [];
  for (const match of stripped.matchAll(/(?<![\w.:])[A-Za-z_:][\w:]*/g)) {
    const name = match[0];
    const next = stripped.slice(match.index + name.length).trimStart().charAt(0);
    if (KEYWORDS.has(name)) continue;
    if (next !== '(') names.push(name);
    else if (!FUNCTIONS.has(name)) throw new Error(`unknown function ${name} in ${expr}`);
  }
  return names;
}

/** Brackets, braces and parentheses nest properly and every string is closed. */
function balanced(expr: string): boolean {
  const closing: Record<string, string> = { ')': '(', ']': '[', '}': '{' };
  const stack: string[] = [];
  let quote: string | undefined;
  for (let i = 0; i < expr.length; i++) {
    const char = expr.charAt(i);
    if (quote !== undefined) {
      if (char === '\\') i++;
      else if (char === quote) quote = undefined;
    } else if (char === '"' || char === "'" || char === '`') {
      quote = char;
    } else if ('([{'.includes(char)) {
      stack.push(char);
    } else if (char in closing && stack.pop() !== closing[char]) {
      return false;
    }
  }
  return quote === undefined && stack.length === 0;
}

interface PanelJson {
  type: string;
  title: string;
  datasource?: { type?: string; uid?: string };
  targets?: { expr?: string; refId?: string; datasource?: { type?: string; uid?: string } }[];
}

interface DashboardJson {
  uid: string;
  title: string;
  tags: string[];
  panels: PanelJson[];
  templating: { list: { name: string; type: string; query?: unknown; multi?: boolean }[] };
}

const dashboards = buildDashboards().map(({ uid, title, json }) => ({ uid, title, json: json as DashboardJson }));
const dataPanels = (dashboard: DashboardJson): PanelJson[] => dashboard.panels.filter((panel) => panel.type !== 'row');
const allExprs = dashboards.flatMap(({ json }) => [
  ...dataPanels(json).flatMap((panel) => (panel.targets ?? []).map((target) => target.expr ?? '')),
  ...json.templating.list.flatMap((variable) => (typeof variable.query === 'string' && variable.type === 'query' ? [variable.query] : [])),
]);

describe('dashboards', () => {
  it('have stable uids and the steadfast tag', () => {
    expect(dashboards.map(({ uid }) => uid)).toContain('steadfast-fleet');
    expect(new Set(dashboards.map(({ uid }) => uid)).size).toBe(dashboards.length);
    for (const { uid, title, json } of dashboards) {
      expect(uid).toMatch(/^steadfast-[a-z0-9-]+$/);
      expect(json.uid).toBe(uid);
      expect(json.title).toBe(title);
      expect(json.tags).toContain('steadfast');
    }
  });

  it('build the same JSON every time', () => {
    expect(JSON.stringify(buildDashboards())).toBe(JSON.stringify(buildDashboards()));
  });

  it('give every panel a query and the datasource variable', () => {
    for (const { json } of dashboards) {
      expect(json.templating.list.find((variable) => variable.name === 'datasource')).toMatchObject({ type: 'datasource', query: 'prometheus' });
      for (const panel of dataPanels(json)) {
        expect(panel.targets?.length, panel.title).toBeGreaterThan(0);
        expect(panel.datasource, panel.title).toEqual({ type: 'prometheus', uid: '${datasource}' });
        for (const target of panel.targets ?? []) {
          expect(target.expr, panel.title).toBeTruthy();
          expect(target.refId, panel.title).toMatch(/^[A-Z]$/);
          expect(target.datasource, panel.title).toEqual(panel.datasource);
        }
      }
    }
  });

  it('offer a multi-value node variable from steadfast_gpu_present', () => {
    const fleet = dashboards.find(({ uid }) => uid === 'steadfast-fleet');
    const node = fleet?.json.templating.list.find((variable) => variable.name === 'node');
    expect(node).toMatchObject({ type: 'query', multi: true, query: 'label_values(steadfast_gpu_present, node)' });
  });

  it('query only metrics that exist, in balanced expressions', () => {
    expect(allExprs.length).toBeGreaterThan(10);
    for (const expr of allExprs) {
      expect(balanced(expr), expr).toBe(true);
      const names = metricNames(expr);
      expect(names.length, expr).toBeGreaterThan(0);
      for (const name of names) expect(KNOWN_METRICS.has(name), `${name} in ${expr}`).toBe(true);
    }
  });

  it('tokenizer and bracket check catch what they should', () => {
    expect(metricNames('histogram_quantile(0.95, sum by (le, verb) (rate(steadfast_signal_to_action_seconds_bucket[5m])))')).toEqual([
      'steadfast_signal_to_action_seconds_bucket',
    ]);
    expect(metricNames('count(a{node=~"$node"} == 0) or vector(0)')).toEqual(['a']);
    expect(metricNames('label_values(steadfast_gpu_present, node)')).toEqual(['steadfast_gpu_present']);
    expect(metricNames('rate(node_gpu_typo_total[5m])')).toEqual(['node_gpu_typo_total']);
    expect(() => metricNames('ratee(x[5m])')).toThrow(/unknown function/);
    expect(balanced('sum(rate(x{a="}"}[5m]))')).toBe(true);
    expect(balanced('sum(rate(x{a="b"[5m]))')).toBe(false);
    expect(balanced('x{a="b}')).toBe(false);
  });
});

describe('writeDashboards', () => {
  let outDir: string | undefined;
  afterEach(() => {
    if (outDir) rmSync(outDir, { recursive: true, force: true });
  });

  it('writes the dashboards and provisioning that points at them', () => {
    outDir = mkdtempSync(join(tmpdir(), 'steadfast-dashboards-'));
    const written = writeDashboards(outDir, { prometheusUrl: 'http://prometheus:9090' });
    const dashboardsDir = join(outDir, 'dashboards');
    const providerFile = join(outDir, 'provisioning', 'dashboards', 'steadfast.yaml');
    const datasourceFile = join(outDir, 'provisioning', 'datasources', 'steadfast.yaml');
    expect(written).toEqual([join(dashboardsDir, 'steadfast-fleet.json'), providerFile, datasourceFile]);
    for (const path of written) expect(existsSync(path), path).toBe(true);

    const fleet = JSON.parse(readFileSync(join(dashboardsDir, 'steadfast-fleet.json'), 'utf8')) as DashboardJson;
    expect(fleet.uid).toBe('steadfast-fleet');

    const provider = parse(readFileSync(providerFile, 'utf8')) as { apiVersion: number; providers: { type: string; folder: string; options: { path: string } }[] };
    expect(provider.apiVersion).toBe(1);
    expect(provider.providers).toHaveLength(1);
    expect(provider.providers[0]).toMatchObject({ type: 'file', folder: 'steadfast', options: { path: dashboardsDir } });

    const datasources = parse(readFileSync(datasourceFile, 'utf8')) as { apiVersion: number; datasources: { type: string; url: string }[] };
    expect(datasources.apiVersion).toBe(1);
    expect(datasources.datasources).toEqual([expect.objectContaining({ type: 'prometheus', url: 'http://prometheus:9090' })]);
  });

  it('defaults the Prometheus URL, honours a Grafana-side path, and refuses a bad URL', () => {
    outDir = mkdtempSync(join(tmpdir(), 'steadfast-dashboards-'));
    writeDashboards(outDir, { dashboardsPath: '/var/lib/grafana/steadfast' });
    const provider = readFileSync(join(outDir, 'provisioning', 'dashboards', 'steadfast.yaml'), 'utf8');
    expect(provider).toContain('path: /var/lib/grafana/steadfast');
    const datasources = readFileSync(join(outDir, 'provisioning', 'datasources', 'steadfast.yaml'), 'utf8');
    expect(datasources).toContain('url: http://127.0.0.1:9090');
    expect(() => writeDashboards(outDir ?? '', { prometheusUrl: 'prometheus:9090' })).toThrow(/http or https/);
  });
});

describe('steadfast dashboards', () => {
  it('writes the files and says how to load them', async () => {
    const outDir = mkdtempSync(join(tmpdir(), 'steadfast-dashboards-cli-'));
    const output: string[] = [];
    const write = vi.spyOn(process.stdout, 'write').mockImplementation((chunk: string | Uint8Array) => {
      output.push(String(chunk));
      return true;
    });
    try {
      await dashboardsCommand().parseAsync(['--out', outDir, '--prometheus-url', 'http://prom:9090'], { from: 'user' });
    } finally {
      write.mockRestore();
    }
    const text = output.join('');
    try {
      expect(text).toContain(join(outDir, 'dashboards', 'steadfast-fleet.json'));
      expect(text).toContain('/api/dashboards/db');
      expect(readFileSync(join(outDir, 'provisioning', 'datasources', 'steadfast.yaml'), 'utf8')).toContain('http://prom:9090');
    } finally {
      rmSync(outDir, { recursive: true, force: true });
    }
  });

  it('requires --out', async () => {
    const command = dashboardsCommand().exitOverride().configureOutput({ writeErr: () => undefined });
    await expect(command.parseAsync([], { from: 'user' })).rejects.toThrow(/required option/);
  });
});
