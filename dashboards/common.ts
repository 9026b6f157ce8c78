/**
 * Shared dashboard defaults: the datasource, the tag, units, thresholds, the template variables
 * and the PromQL helpers every panel builds its queries from. A selector is written once here
 * and composed everywhere else (STYLE.md, Dashboards).
 */
import type { Builder, Dataquery } from '@grafana/grafana-foundation-sdk/cog';
import { BigValueGraphMode, ReduceDataOptionsBuilder, type DataSourceRef } from '@grafana/grafana-foundation-sdk/common';
import {
  AnnotationQueryBuilder,
  DashboardBuilder,
  DashboardCursorSync,
  DashboardLinkBuilder,
  DashboardLinkType,
  DatasourceVariableBuilder,
  QueryVariableBuilder,
  ThresholdsConfigBuilder,
  ThresholdsMode,
  VariableRefresh,
  VariableSort,
  type Dashboard,
  MappingType,
  type DynamicConfigValue,
} from '@grafana/grafana-foundation-sdk/dashboard';
import {
  CellValuesBuilder,
  HeatmapColorMode,
  HeatmapColorOptionsBuilder,
  HeatmapColorScale,
  PanelBuilder as HeatmapPanelBuilder,
  YAxisConfigBuilder,
} from '@grafana/grafana-foundation-sdk/heatmap';
import { DataqueryBuilder, PromQueryFormat } from '@grafana/grafana-foundation-sdk/prometheus';
import { PanelBuilder as StatPanelBuilder } from '@grafana/grafana-foundation-sdk/stat';
import { PanelBuilder as StateTimelinePanelBuilder } from '@grafana/grafana-foundation-sdk/statetimeline';
import { PanelBuilder as TablePanelBuilder } from '@grafana/grafana-foundation-sdk/table';
import { PanelBuilder as TimeseriesPanelBuilder } from '@grafana/grafana-foundation-sdk/timeseries';
import * as units from '@grafana/grafana-foundation-sdk/units';
import { ACTION_ANNOTATION_TAG } from '../core/action.js';

export const STEADFAST_TAG = 'steadfast';

export const DATASOURCE_VARIABLE = 'datasource';
export const NODE_VARIABLE = 'node';
export const JOB_VARIABLE = 'job';

/**
 * The label that names the training job on the agent's training series. The agent exports it as
 * `job`; Prometheus keeps that name only when the agent scrape sets `honor_labels: true` (as the
 * README's scrape config does), and otherwise renames it `exported_job` and puts the scrape job in
 * `job`. Switch it here and every training query follows.
 */
export const TRAINING_JOB_LABEL = 'job';
/** Prometheus' scrape jobs for the agents and the controller (as in the demo's prometheus.yml), for `up`. */
export const AGENT_SCRAPE_JOB = 'steadfast-agent';
export const CONTROLLER_SCRAPE_JOB = 'steadfast-controller';

/** The training rank on the agent's training series. */
export const RANK_LABEL = 'rank';

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
  hertz: units.Hertz,
  bytes: units.BytesIEC,
  bytesPerSecond: units.BytesPerSecondSI,
  /** A ratio shown as a percentage (0.5 → 50 %). */
  ratio: units.PercentUnit,
  tflops: 'suffix: TFLOP/s',
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

/** `label!="value"` */
export function notEquals(label: string, value: string): string {
  return `${label}!=${quote(value)}`;
}

/** `label=~"regex"` */
export function matches(label: string, regex: string): string {
  return `${label}=~${quote(regex)}`;
}

/** The agent-side matcher: series of the nodes picked in the `node` variable. */
export const nodeMatcher = matches(NODE_VARIABLE, `$${NODE_VARIABLE}`);

/** Training series of the jobs picked in the `job` variable. */
export const jobMatcher = matches(TRAINING_JOB_LABEL, `$${JOB_VARIABLE}`);

/** `metric{m1,m2}`, or the bare name without matchers. */
export function series(metric: string, ...matchers: string[]): string {
  return matchers.length === 0 ? metric : `${metric}{${matchers.join(',')}}`;
}

/** A series from the agents on the selected nodes. */
export function nodeSeries(metric: string, ...matchers: string[]): string {
  return series(metric, nodeMatcher, ...matchers);
}

/** A training series (or a recording rule over them) of the selected jobs. */
export function jobSeries(metric: string, ...matchers: string[]): string {
  return series(metric, jobMatcher, ...matchers);
}

export function rate(selector: string, window: string = RATE_WINDOW): string {
  return `rate(${selector}[${window}])`;
}

export function increase(selector: string, window: string = RATE_WINDOW): string {
  return `increase(${selector}[${window}])`;
}

export function aggregateBy(op: 'sum' | 'min' | 'max' | 'avg' | 'count', labels: readonly string[], expr: string): string {
  return `${op} by (${labels.join(', ')}) (${expr})`;
}

export function sumBy(labels: readonly string[], expr: string): string {
  return aggregateBy('sum', labels, expr);
}

/** `sum by (labels) (rate(numerator)) / sum by (labels) (rate(denominator))`: e.g. seconds per operation. */
export function ratioOfRates(numerator: string, denominator: string, labels: readonly string[]): string {
  return `${sumBy(labels, rate(numerator))} / ${sumBy(labels, rate(denominator))}`;
}

/** 1 where `expr` equals `value`, else 0, keeping every series (a count of bad things that is 0, not absent). */
export function isEqual(expr: string, value: number): string {
  return `(${expr} == bool ${value})`;
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

interface LabelVariable {
  name: string;
  label: string;
  /** The Prometheus label whose values the variable offers. */
  sourceLabel: string;
  sourceMetric: string;
  /** Several values and "All" (default), or exactly one. */
  multi?: boolean;
}

function labelValuesVariable(variable: LabelVariable): QueryVariableBuilder {
  const query = `label_values(${variable.sourceMetric}, ${variable.sourceLabel})`;
  const builder = new QueryVariableBuilder(variable.name)
    .label(variable.label)
    .datasource(datasource)
    .query(query)
    .definition(query)
    .refresh(VariableRefresh.OnTimeRangeChanged)
    .sort(VariableSort.NaturalAsc);
  if (variable.multi ?? true) builder.multi(true).includeAll(true).allValue('.*');
  return builder;
}

/** `node` variable listing every node whose agent reports `sourceMetric`; multi-value unless `multi` is false. */
export function nodeVariable(sourceMetric: string, options: { multi?: boolean } = {}): QueryVariableBuilder {
  return labelValuesVariable({ name: NODE_VARIABLE, label: 'Node', sourceLabel: NODE_VARIABLE, sourceMetric, ...options });
}

/** `job` variable listing every training job that reports `sourceMetric`. */
export function jobVariable(sourceMetric: string): QueryVariableBuilder {
  return labelValuesVariable({ name: JOB_VARIABLE, label: 'Training job', sourceLabel: TRAINING_JOB_LABEL, sourceMetric });
}

// ---- Annotations and the dashboard frame ---------------------------------------------------

/** Grafana's own annotation store, where the controller posts its actions. */
export const GRAFANA_ANNOTATIONS: DataSourceRef = { type: 'grafana', uid: '-- Grafana --' };

/**
 * The target of an annotation query on Grafana's own store, filtered by tags. The SDK types an
 * annotation target as a data query; this is the shape Grafana reads for a tag filter.
 */
class TagsAnnotationTarget implements Builder<Dataquery> {
  constructor(private readonly tags: readonly string[]) {}

  build(): Dataquery {
    return {
      type: 'tags',
      tags: [...this.tags],
      matchAny: false,
      limit: 500,
      _implementsDataqueryVariant: () => undefined,
    } as Dataquery;
  }
}

/** Every action the controller finished (done, refused, failed), as Grafana annotations tagged `steadfast`. */
export function actionsAnnotation(): AnnotationQueryBuilder {
  return new AnnotationQueryBuilder()
    .name('steadfast actions')
    .datasource(GRAFANA_ANNOTATIONS)
    .enable(true)
    .iconColor('orange')
    .target(new TagsAnnotationTarget([ACTION_ANNOTATION_TAG]));
}

export interface DashboardFrame {
  uid: string;
  title: string;
  description: string;
}

/**
 * What every steadfast dashboard shares: uid, the tag, the datasource variable, the actions
 * annotation, links to its sibling dashboards, refresh and time defaults. Callers add their
 * own variables, then rows and panels.
 */
export function steadfastDashboard(frame: DashboardFrame): DashboardBuilder {
  return new DashboardBuilder(frame.title)
    .uid(frame.uid)
    .tags([STEADFAST_TAG])
    .description(frame.description)
    .editable()
    .tooltip(DashboardCursorSync.Crosshair)
    .refresh('30s')
    .time({ from: 'now-6h', to: 'now' })
    .timezone('browser')
    .link(
      new DashboardLinkBuilder('steadfast')
        .type(DashboardLinkType.Dashboards)
        .tags([STEADFAST_TAG])
        .asDropdown(true)
        .includeVars(true)
        .keepTime(true),
    )
    .annotation(actionsAnnotation())
    .withVariable(datasourceVariable());
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

type AnyPanelBuilder = StatPanelBuilder | TablePanelBuilder | TimeseriesPanelBuilder | HeatmapPanelBuilder | StateTimelinePanelBuilder;

function basePanel<P extends AnyPanelBuilder>(
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

/**
 * Each series is one row (its legend on the y axis), coloured by its value: e.g. iteration time
 * per rank, where one slow rank is one bright stripe. Grafana does not bucket the values again.
 */
export function heatmapPanel(spec: PanelSpec & { rowLabel: string }): HeatmapPanelBuilder {
  return basePanel(new HeatmapPanelBuilder(), spec)
    .calculate(false)
    .cellValues(new CellValuesBuilder().unit(spec.unit))
    .yAxis(new YAxisConfigBuilder().axisLabel(spec.rowLabel))
    .color(
      // Grafana's own defaults for a scheme; the builder would otherwise write 0 colour steps.
      new HeatmapColorOptionsBuilder().mode(HeatmapColorMode.Scheme).scheme('Oranges').scale(HeatmapColorScale.Exponential).exponent(0.5).steps(64).fill('dark-orange'),
    );
}

export interface NamedState {
  value: number;
  text: string;
  color: string;
}

/** Each series as a band over time, coloured and named by the state its value stands for. */
export function stateTimelinePanel(spec: PanelSpec & { states: readonly NamedState[] }): StateTimelinePanelBuilder {
  const options: Record<string, { text: string; color: string; index: number }> = {};
  spec.states.forEach(({ value, text, color }, index) => {
    options[String(value)] = { text, color, index };
  });
  return basePanel(new StateTimelinePanelBuilder(), spec).mappings([{ type: MappingType.ValueToText, options }]);
}

export interface TableColumn {
  /** Column header. */
  name: string;
  /** An instant query aggregated `by` the table's key labels. */
  expr: string;
  /** Colour the cell red from this value up (counts of bad things). */
  redFrom?: number;
  /** Colour the cell red below this value (health flags, where 1 is good). */
  redBelow?: number;
}

/**
 * One row per key (e.g. per node), one column per query: instant queries in table format,
 * merged on their labels, each value column renamed after its query.
 */
export function mergedTablePanel(spec: Omit<PanelSpec, 'queries'> & { columns: readonly TableColumn[] }): TablePanelBuilder {
  const panel = tablePanel({ ...spec, queries: spec.columns.map(({ expr }) => ({ expr })) });
  const renames: Record<string, string> = {};
  spec.columns.forEach((column, index) => {
    renames[`Value #${REF_IDS.charAt(index)}`] = column.name;
    const thresholds =
      column.redFrom !== undefined ? thresholdsRedFrom(column.redFrom) : column.redBelow !== undefined ? thresholdsRedBelow(column.redBelow) : undefined;
    if (thresholds === undefined) return;
    const properties: DynamicConfigValue[] = [
      { id: 'thresholds', value: thresholds.build() },
      { id: 'custom.cellOptions', value: { type: 'color-background' } },
    ];
    panel.overrideByName(column.name, properties);
  });
  return panel
    .withTransformation({ id: 'merge', options: {} })
    .withTransformation({ id: 'organize', options: { excludeByName: { Time: true }, renameByName: renames } });
}

/** Numbers the panels 1..n in layout order; Grafana needs unique ids for links and repeats. */
export function numberPanels(dashboard: Dashboard): Dashboard {
  (dashboard.panels ?? []).forEach((panel, index) => {
    panel.id = index + 1;
  });
  return dashboard;
}
