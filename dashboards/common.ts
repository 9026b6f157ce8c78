/**
 * Shared dashboard defaults: the datasource, the tag, units, thresholds, the template variables
 * and the PromQL helpers every panel builds its queries from. A selector is written once here
 * and composed everywhere else (STYLE.md, Dashboards).
 */
import { BigValueGraphMode, ReduceDataOptionsBuilder, type DataSourceRef } from '@grafana/grafana-foundation-sdk/common';
import {
  DatasourceVariableBuilder,
  QueryVariableBuilder,
  ThresholdsConfigBuilder,
  ThresholdsMode,
  VariableRefresh,
  VariableSort,
  type Dashboard,
} from '@grafana/grafana-foundation-sdk/dashboard';
import { DataqueryBuilder, PromQueryFormat } from '@grafana/grafana-foundation-sdk/prometheus';
import { PanelBuilder as StatPanelBuilder } from '@grafana/grafana-foundation-sdk/stat';
import { PanelBuilder as TablePanelBuilder } from '@grafana/grafana-foundation-sdk/table';
import { PanelBuilder as TimeseriesPanelBuilder } from '@grafana/grafana-foundation-sdk/timeseries';
import * as units from '@grafana/grafana-foundation-sdk/units';

export const STEADFAST_TAG = 'steadfast';

export const DATASOURCE_VARIABLE = 'datasource';
export const NODE_VARIABLE = 'node';

/** Every panel and query reads from whichever Prometheus the `datasource` variable selects. */
export const datasource: DataSourceRef = { type: 'prometheus', uid: `\${${DATASOURCE_VARIABLE}}` };

/** Window for rate()/increase() on agent and controller counters. */
export const RATE_WINDOW = '5m';

export const unit = {
  count: units.Short,
  perSecond: units.OpsPerSecond,
  seconds: units.Seconds,
  celsius: units.Celsius,
  watts: units.Watt,
  bool: units.NoUnit,
} as const;

/** Green, turning red at `at` and above (counts of bad things). */
export function thresholdsRedFrom(at: number): ThresholdsConfigBuilder {
  return new ThresholdsConfigBuilder().mode(ThresholdsMode.Absolute).steps([
    { value: null, color: 'green' },
    { value: at, color: 'red' },
  ]);
}

/** Red below `at`, green from it (health flags, where 1 is good). */
export function thresholdsRedBelow(at: number): ThresholdsConfigBuilder {
  return new ThresholdsConfigBuilder().mode(ThresholdsMode.Absolute).steps([
    { value: null, color: 'red' },
    { value: at, color: 'green' },
  ]);
}

// ---- PromQL --------------------------------------------------------------------------------

function quote(value: string): string {
  return JSON.stringify(value);
}

/** `label="value"` */
export function equals(label: string, value: string): string {
  return `${label}=${quote(value)}`;
}

/** `label=~"regex"` */
export function matches(label: string, regex: string): string {
  return `${label}=~${quote(regex)}`;
}

/** The agent-side matcher: series of the nodes picked in the `node` variable. */
export const nodeMatcher = matches(NODE_VARIABLE, `$${NODE_VARIABLE}`);

/** `metric{m1,m2}`, or the bare name without matchers. */
export function series(metric: string, ...matchers: string[]): string {
  return matchers.length === 0 ? metric : `${metric}{${matchers.join(',')}}`;
}

/** A series from the agents on the selected nodes. */
export function nodeSeries(metric: string, ...matchers: string[]): string {
  return series(metric, nodeMatcher, ...matchers);
}

export function rate(selector: string, window: string = RATE_WINDOW): string {
  return `rate(${selector}[${window}])`;
}

export function increase(selector: string, window: string = RATE_WINDOW): string {
  return `increase(${selector}[${window}])`;
}

export function aggregateBy(op: 'sum' | 'min' | 'max', labels: readonly string[], expr: string): string {
  return `${op} by (${labels.join(', ')}) (${expr})`;
}

export function sumBy(labels: readonly string[], expr: string): string {
  return aggregateBy('sum', labels, expr);
}

/** Quantile of `histogram` (its name without `_bucket`) over RATE_WINDOW, per `labels`. */
export function histogramQuantile(quantile: number, histogram: string, labels: readonly string[]): string {
  return `histogram_quantile(${quantile}, ${sumBy(['le', ...labels], rate(`${histogram}_bucket`))})`;
}

// ---- Queries and variables -----------------------------------------------------------------

export interface Query {
  expr: string;
  /** Grafana legend template, e.g. `{{node}} GPU {{gpu}}`. */
  legend?: string;
  /** An instant query (tables, stats of current state) rather than a range. */
  instant?: boolean;
}

const REF_IDS = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ';

export function promQueries(queries: readonly Query[], format = PromQueryFormat.TimeSeries): DataqueryBuilder[] {
  return queries.map((query, index) => {
    const builder = new DataqueryBuilder()
      .datasource(datasource)
      .refId(REF_IDS.charAt(index))
      .expr(query.expr)
      .format(format);
    if (query.legend !== undefined) builder.legendFormat(query.legend);
    if (query.instant === true) builder.instant();
    else builder.range();
    return builder;
  });
}

export function datasourceVariable(): DatasourceVariableBuilder {
  return new DatasourceVariableBuilder(DATASOURCE_VARIABLE).label('Prometheus').type('prometheus');
}

/** Multi-value `node` variable listing every node whose agent reports a GPU. */
export function nodeVariable(sourceMetric: string): QueryVariableBuilder {
  const query = `label_values(${sourceMetric}, ${NODE_VARIABLE})`;
  return new QueryVariableBuilder(NODE_VARIABLE)
    .label('Node')
    .datasource(datasource)
    .query(query)
    .definition(query)
    .multi(true)
    .includeAll(true)
    .allValue('.*')
    .refresh(VariableRefresh.OnTimeRangeChanged)
    .sort(VariableSort.NaturalAsc);
}

// ---- Panels --------------------------------------------------------------------------------

export interface PanelSpec {
  title: string;
  description: string;
  unit: string;
  queries: readonly Query[];
  /** Grid width out of 24 (default 12). */
  width?: number;
  height?: number;
}

function basePanel<P extends StatPanelBuilder | TablePanelBuilder | TimeseriesPanelBuilder>(
  panel: P,
  spec: PanelSpec,
  targets: DataqueryBuilder[] = promQueries(spec.queries),
): P {
  panel
    .title(spec.title)
    .description(spec.description)
    .datasource(datasource)
    .unit(spec.unit)
    .targets(targets)
    .span(spec.width ?? 12)
    .height(spec.height ?? 8);
  return panel;
}

export function timeseriesPanel(spec: PanelSpec): TimeseriesPanelBuilder {
  return basePanel(new TimeseriesPanelBuilder(), spec);
}

/** The latest value of each query, one big number each, without a sparkline. */
export function statPanel(spec: PanelSpec): StatPanelBuilder {
  return basePanel(new StatPanelBuilder(), spec)
    .reduceOptions(new ReduceDataOptionsBuilder().calcs(['lastNotNull']))
    .graphMode(BigValueGraphMode.None);
}

/** One row per series, labels as columns: every query runs as an instant query in table format. */
export function tablePanel(spec: PanelSpec): TablePanelBuilder {
  const instant = spec.queries.map((query) => ({ ...query, instant: true }));
  return basePanel(new TablePanelBuilder(), spec, promQueries(instant, PromQueryFormat.Table));
}

/** Numbers the panels 1..n in layout order; Grafana needs unique ids for links and repeats. */
export function numberPanels(dashboard: Dashboard): Dashboard {
  (dashboard.panels ?? []).forEach((panel, index) => {
    panel.id = index + 1;
  });
  return dashboard;
}
