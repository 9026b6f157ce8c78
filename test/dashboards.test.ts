import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { dashboardsCommand } from '../cli/dashboards.js';
import { parse } from 'yaml';
import { CLUSTER_LABEL, TRAINING_JOB_LABEL } from '../core/scrape.js';
import { GRAFANA_SCHEMA_VERSION, buildDashboards, writeDashboards } from '../dashboards/index.js';
import { startPrometheus } from '../tryit/parts.js';
import { ProcessGroup } from '../tryit/processes.js';
import { grafanaSchema, type GrafanaSchema } from './support/grafana-schema.js';
import { PROMETHEUS_METRICS, agentMetricNames, controllerMetricNames, grafanaExprAsPromql, parsePromql, readRuleFiles } from './support/promql.js';

const RULES_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', 'rules');
const UIDS = ['steadfast-fleet', 'steadfast-node', 'steadfast-training', 'steadfast-network', 'steadfast-storage', 'steadfast-self'];

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
  annotations: { list: { name: string; enable: boolean; datasource?: { type?: string; uid?: string }; target?: { type?: string; tags?: string[] } }[] };
}

const dashboards = buildDashboards().map(({ uid, title, json }) => ({ uid, title, json: json as DashboardJson }));
const dataPanels = (dashboard: DashboardJson): PanelJson[] => dashboard.panels.filter((panel) => panel.type !== 'row');
/** Every PromQL expression in the dashboards, with where it is. */
const dashboardExprs = dashboards.flatMap(({ uid, json }) => [
  ...dataPanels(json).flatMap((panel) => (panel.targets ?? []).map((target) => ({ where: `${uid} / ${panel.title}`, expr: target.expr ?? '' }))),
  ...json.templating.list.flatMap((variable) =>
    typeof variable.query === 'string' && variable.type === 'query' ? [{ where: `${uid} / variable ${variable.name}`, expr: variable.query }] : [],
  ),
]);

describe('dashboards', () => {
  it('are the six topic dashboards, with stable uids and the steadfast tag', () => {
    expect(dashboards.map(({ uid }) => uid)).toEqual(UIDS);
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
    expect(node).toMatchObject({ type: 'query', multi: true, query: 'label_values(steadfast_gpu_present{cluster=~"$cluster"}, node)' });
  });

  it('each carry the steadfast actions annotation: Grafana annotations tagged steadfast', () => {
    for (const { uid, json } of dashboards) {
      expect(json.annotations.list, uid).toContainEqual(
        expect.objectContaining({
          enable: true,
          datasource: { type: 'grafana', uid: '-- Grafana --' },
          target: expect.objectContaining({ type: 'tags', tags: ['steadfast'] }),
        }),
      );
    }
  });

  it('select the node on the node dashboard (one) and the training job on the training dashboard, by the configured label', () => {
    const variable = (uid: string, name: string) =>
      dashboards.find((dashboard) => dashboard.uid === uid)?.json.templating.list.find((entry) => entry.name === name);
    expect(variable('steadfast-node', 'node')).toMatchObject({ type: 'query', query: 'label_values(steadfast_collector_success{cluster=~"$cluster"}, node)' });
    expect(variable('steadfast-node', 'node')?.multi).not.toBe(true);
    expect(variable('steadfast-training', 'job')).toMatchObject({
      type: 'query',
      multi: true,
      query: `label_values(steadfast_training_iteration{cluster=~"$cluster"}, ${TRAINING_JOB_LABEL})`,
    });
    const training = dashboards.find(({ uid }) => uid === 'steadfast-training')?.json;
    const heatmap = training?.panels.find((panel) => panel.type === 'heatmap');
    expect(heatmap?.targets?.[0]?.expr).toBe(
      `max by (${TRAINING_JOB_LABEL}, rank) (steadfast_training_iteration_seconds{cluster=~"$cluster",${TRAINING_JOB_LABEL}=~"$job"})`,
    );
  });
});

/**
 * Grafana's own schema packages, as published with 10.1 (the first 10.x release that declares its
 * panel configs) and 11.6 (the last 11.x line): what each release's dashboard, panel and panel
 * configs accept. An option only the later release declares is kept and ignored by the earlier.
 */
const GRAFANA_RELEASES = [grafanaSchema('grafana-schema-10'), grafanaSchema('grafana-schema-11')];

/** The property names of the first release that declares any, joined over the releases. */
function declared(read: (release: GrafanaSchema) => ReadonlySet<string> | undefined): Set<string> {
  return new Set(GRAFANA_RELEASES.flatMap((release) => [...(read(release) ?? [])]));
}

describe('dashboards import into Grafana 10 and 11 as they are', () => {
  interface GrafanaPanel extends PanelJson {
    id?: number;
    gridPos?: { x: number; y: number; w: number; h: number };
    options?: Record<string, unknown>;
    fieldConfig?: { defaults?: { custom?: Record<string, unknown> } };
    panels?: unknown[];
  }
  interface Variable {
    name: string;
    type: string;
    query?: unknown;
    includeAll?: boolean;
    allValue?: string;
  }

  it('are checked against the schema packages of Grafana 10 and 11', () => {
    expect(GRAFANA_RELEASES.map((release) => release.version.split('.')[0])).toEqual(['10', '11']);
  });

  it.each(dashboards.map(({ uid, json }) => [uid, json] as const))(
    '%s: schema version 38, and only the fields, panel types and options Grafana 10 and 11 declare',
    (_uid, json) => {
      const dashboard = json as unknown as { schemaVersion: number; panels: GrafanaPanel[] };
      expect(dashboard.schemaVersion).toBe(GRAFANA_SCHEMA_VERSION);
      expect(GRAFANA_SCHEMA_VERSION).toBe(38);
      const unknownFields = (object: object, known: ReadonlySet<string>): string[] => Object.keys(object).filter((key) => !known.has(key));
      expect(
        unknownFields(
          dashboard,
          declared((release) => release.dashboardType('Dashboard')),
        ),
        'dashboard fields',
      ).toEqual([]);
      const ids = dashboard.panels.map((panel) => panel.id);
      expect(new Set(ids).size).toBe(ids.length);
      for (const panel of dashboard.panels) {
        if (panel.type === 'row') {
          expect(
            unknownFields(
              panel,
              declared((release) => release.dashboardType('RowPanel')),
            ),
            `${panel.title}: row fields`,
          ).toEqual([]);
          expect(panel.panels, panel.title).toEqual([]);
        } else {
          for (const release of GRAFANA_RELEASES)
            expect(release.panel(panel.type), `${panel.title}: panel type ${panel.type} in Grafana ${release.version}`).toBeDefined();
          expect(
            unknownFields(
              panel,
              declared((release) => release.dashboardType('Panel')),
            ),
            `${panel.title}: panel fields`,
          ).toEqual([]);
          expect(
            unknownFields(
              panel.options ?? {},
              declared((release) => release.panel(panel.type)?.options),
            ),
            `${panel.title} (${panel.type}): options`,
          ).toEqual([]);
          const defaults = panel.fieldConfig?.defaults ?? {};
          expect(
            unknownFields(
              defaults,
              declared((release) => release.dashboardType('FieldConfig')),
            ),
            `${panel.title}: field config`,
          ).toEqual([]);
          expect(
            unknownFields(
              defaults.custom ?? {},
              declared((release) => release.panel(panel.type)?.fieldCustom),
            ),
            `${panel.title} (${panel.type}): custom field config`,
          ).toEqual([]);
        }
        expect(Number.isInteger(panel.id) && (panel.id ?? 0) > 0, panel.title).toBe(true);
        const grid = panel.gridPos;
        expect(grid && grid.x >= 0 && grid.w > 0 && grid.x + grid.w <= 24 && grid.h > 0 && grid.y >= 0, `${panel.title}: ${JSON.stringify(grid)}`).toBe(true);
      }
    },
  );

  it.each(dashboards.map(({ uid, json }) => [uid, json] as const))(
    '%s: a cluster variable, right after the datasource, that every query and every other variable uses',
    (uid, json) => {
      const variables = json.templating.list as Variable[];
      expect(variables.map((variable) => variable.name).slice(0, 2)).toEqual(['datasource', 'cluster']);
      expect(variables[1]).toMatchObject({ type: 'query', query: `label_values(up, ${CLUSTER_LABEL})`, includeAll: true, allValue: '.*' });
      const clusterFilter = `${CLUSTER_LABEL}=~"$cluster"`;
      for (const { where, expr } of dashboardExprs.filter((entry) => entry.where.startsWith(`${uid} /`))) {
        if (where.endsWith('variable cluster')) continue;
        // Each selector of the query, as Prometheus' grammar finds them, not just one of them.
        const { selectors } = parsePromql(expr);
        expect(selectors.length, where).toBeGreaterThan(0);
        for (const selector of selectors) expect(selector, where).toContain(clusterFilter);
      }
    },
  );
});

describe('PromQL in the dashboards and the rule files', () => {
  const ruleFiles = readRuleFiles(RULES_DIR);
  const ruleExprs = ruleFiles.flatMap((file) => file.exprs.map(({ rule, expr }) => ({ where: rule, expr })));
  const produced = new Set<string>();

  beforeAll(async () => {
    for (const name of [
      ...(await agentMetricNames()),
      ...(await controllerMetricNames()),
      ...PROMETHEUS_METRICS,
      ...ruleFiles.flatMap((file) => file.records),
    ]) {
      produced.add(name);
    }
  });

  it('finds the metrics of a live agent, the controller and the recording rules', () => {
    for (const name of [
      'steadfast_gpu_present',
      'steadfast_rdma_port_cnp_sent_total',
      'steadfast_nfs_rpc_slot_utilization_ratio',
      'steadfast_training_iteration_seconds',
    ]) {
      expect(produced.has(name), name).toBe(true);
    }
    for (const name of [
      'steadfast_queue_oldest_waiting_seconds',
      'steadfast_signal_to_action_seconds_bucket',
      'steadfast_grafana_annotations_failed_total',
      'up',
    ]) {
      expect(produced.has(name), name).toBe(true);
    }
    expect(produced.has('steadfast_gpu_temperature'), 'a name nobody exports').toBe(false);
    expect(ruleFiles.length).toBeGreaterThan(0);
    expect(ruleExprs.length).toBeGreaterThan(0);
  });

  it('parse without error, each naming its metrics', () => {
    expect(dashboardExprs.length).toBeGreaterThan(50);
    for (const { where, expr } of [...dashboardExprs, ...ruleExprs]) {
      const parsed = parsePromql(expr);
      expect(parsed.errors, `${where}: ${expr}`).toEqual([]);
      expect(parsed.unnamed, `${where}: ${expr}`).toEqual([]);
      expect(parsed.metrics.length, `${where}: ${expr}`).toBeGreaterThan(0);
    }
  });

  it('select only metrics that the agent, the controller, Prometheus or a recording rule produce', () => {
    // compat.yml translates other exporters' series (dcgm-exporter's DCGM_FI_*, node_exporter's
    // node_*) into ours: those inputs are theirs, checked by rules/tests/compat.test.yml.
    const foreign = (where: string, name: string): boolean => where.startsWith('compat.yml ') && /^(DCGM_FI_|node_)/.test(name);
    const unknown = [...dashboardExprs, ...ruleExprs].flatMap(({ where, expr }) =>
      parsePromql(expr)
        .metrics.filter((name) => !produced.has(name) && !foreign(where, name))
        .map((name) => `${name} (${where})`),
    );
    expect(unknown).toEqual([]);
  });

  it('are accepted by a real Prometheus, which also checks the argument types the grammar does not', async () => {
    const root = mkdtempSync(join(tmpdir(), 'steadfast-dashboards-prometheus-'));
    const processes = new ProcessGroup();
    try {
      const prometheus = await startPrometheus(processes, root, { targets: [], ruleFiles: [], alertmanagerAddress: '127.0.0.1:9', intervalSeconds: 5 });
      const rejected: string[] = [];
      for (const { where, expr } of dashboardExprs) {
        const query = grafanaExprAsPromql(expr, { node: '.*', job: '.*' });
        const response = await fetch(`${prometheus.url}/api/v1/query?${new URLSearchParams({ query })}`);
        const answer = (await response.json()) as { status: string; error?: string };
        if (answer.status !== 'success') rejected.push(`${where}: ${answer.error ?? response.status} in ${query}`);
      }
      expect(rejected).toEqual([]);
    } finally {
      await processes.stopAll();
      rmSync(root, { recursive: true, force: true });
    }
  });

  it('are checked by a parser that reports bad syntax and finds every selector', () => {
    expect(parsePromql('histogram_quantile(0.95, sum by (le, verb) (rate(steadfast_signal_to_action_seconds_bucket[5m])))').metrics).toEqual([
      'steadfast_signal_to_action_seconds_bucket',
    ]);
    expect(parsePromql('count(a{node=~"$node"} == bool 0) or vector(0) unless on (node) b').metrics).toEqual(['a', 'b']);
    expect(parsePromql('label_values(steadfast_gpu_present, node)').metrics).toEqual(['steadfast_gpu_present']);
    expect(parsePromql('avg_over_time(job:x:bool{job=~"$job"}[$__range])')).toEqual({
      metrics: ['job:x:bool'],
      errors: [],
      unnamed: [],
      selectors: ['job:x:bool{job=~"$job"}'],
    });
    expect(parsePromql('sum(rate(x{a="b"[5m]))').errors).not.toEqual([]);
    expect(parsePromql('ratee(x[5m])').errors).not.toEqual([]);
    expect(parsePromql('{__name__="x"}').unnamed).toEqual(['{__name__="x"}']);
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
    expect(written).toEqual([...UIDS.map((uid) => join(dashboardsDir, `${uid}.json`)), providerFile, datasourceFile]);
    for (const path of written) expect(existsSync(path), path).toBe(true);

    const fleet = JSON.parse(readFileSync(join(dashboardsDir, 'steadfast-fleet.json'), 'utf8')) as DashboardJson;
    expect(fleet.uid).toBe('steadfast-fleet');

    const provider = parse(readFileSync(providerFile, 'utf8')) as {
      apiVersion: number;
      providers: { type: string; folder: string; options: { path: string } }[];
    };
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
    const command = dashboardsCommand()
      .exitOverride()
      .configureOutput({ writeErr: () => undefined });
    await expect(command.parseAsync([], { from: 'user' })).rejects.toThrow(/required option/);
  });
});
