/**
 * The panel kinds the dashboards are made of, each reading its queries from the `datasource`
 * variable's Prometheus, with the units and threshold colours they share.
 */
import { BigValueGraphMode, ReduceDataOptionsBuilder } from '@grafana/grafana-foundation-sdk/common';
import { MappingType, ThresholdsConfigBuilder, ThresholdsMode, type DynamicConfigValue } from '@grafana/grafana-foundation-sdk/dashboard';
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
import { datasource } from './frame.js';

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

// ---- Queries -------------------------------------------------------------------------------

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
    const builder = new DataqueryBuilder().datasource(datasource).refId(REF_IDS.charAt(index)).expr(query.expr).format(format);
    if (query.legend !== undefined) builder.legendFormat(query.legend);
    if (query.instant === true) builder.instant();
    else builder.range();
    return builder;
  });
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

function basePanel<P extends AnyPanelBuilder>(panel: P, spec: PanelSpec, targets: DataqueryBuilder[] = promQueries(spec.queries)): P {
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
      new HeatmapColorOptionsBuilder()
        .mode(HeatmapColorMode.Scheme)
        .scheme('Oranges')
        .scale(HeatmapColorScale.Exponential)
        .exponent(0.5)
        .steps(64)
        .fill('dark-orange'),
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
