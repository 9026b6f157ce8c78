import type { TopLevelSpec } from 'vega-lite';
import { STRATEGIES, type StrategyName } from './result.js';
import type { Sensitivity } from './sensitivity.js';

/**
 * The sensitivity table as a Vega-Lite chart: ETTR against the checkpoint interval (log scale,
 * all three strategies) beside ETTR against the warm standby pool (steadfast; the baselines, which
 * hold no standbys, as flat levels), sharing one ETTR axis and one legend. Requeue is drawn
 * dashed so it stays visible where it runs on top of reschedule.
 */

/** One point of a curve; the rows the spec carries inline, so the chart is the table and nothing else. */
interface PlotPoint {
  readonly strategy: StrategyName;
  readonly x: number;
  readonly ettr: number;
}

/** The drawing area of one panel; the renderer fits these to the requested picture size. */
export interface PanelSize {
  readonly width: number;
  readonly height: number;
}

const COLORS: Record<StrategyName, string> = { steadfast: '#1f77b4', reschedule: '#ff7f0e', requeue: '#d62728' };
/** Pixels kept free at both ends of an x axis, so the end markers are not cut by the frame. */
const END_PADDING = 8;
/** A dash pattern per strategy, as the dash scale needs one for each; [1, 0] is a solid line. */
const SOLID = [1, 0];
const DASHED = [6, 4];

function checkpointPoints(table: Sensitivity): PlotPoint[] {
  return table.checkpoint.flatMap((row) => STRATEGIES.map((strategy) => ({ strategy, x: row.minutes, ettr: row[strategy] })));
}

function standbyPoints(table: Sensitivity): PlotPoint[] {
  return table.standby.map((row) => ({ strategy: 'steadfast', x: row.standby, ettr: row.steadfast }));
}

/** The baselines hold no standbys: one level each across the whole standby axis (drawn as rules, which ignore x). */
function baselineLevels(table: Sensitivity): PlotPoint[] {
  return (['reschedule', 'requeue'] as const).map((strategy) => ({ strategy, x: 0, ettr: table.baselines[strategy] }));
}

/** Color and dash by strategy with fixed domains, so both panels and the single legend agree. */
const strategyEncoding = {
  color: {
    field: 'strategy',
    type: 'nominal' as const,
    title: null,
    sort: [...STRATEGIES],
    scale: { domain: [...STRATEGIES], range: STRATEGIES.map((strategy) => COLORS[strategy]) },
  },
  strokeDash: {
    field: 'strategy',
    type: 'nominal' as const,
    title: null,
    sort: [...STRATEGIES],
    scale: { domain: [...STRATEGIES], range: STRATEGIES.map((strategy) => (strategy === 'requeue' ? DASHED : SOLID)) },
  },
};

const ettrAxis = { field: 'ettr', type: 'quantitative' as const, title: 'ETTR', scale: { zero: false }, axis: { format: '.0%', tickMinStep: 0.01 } };
/** The right panel shares the left one's scale; its labels repeat the values, the title once is enough. */
const sharedEttrAxis = { ...ettrAxis, axis: { ...ettrAxis.axis, title: null } };

/**
 * Named fonts first: resvg (the PNG) does not resolve the generic family to an installed font,
 * browsers (the SVG) take whichever of these they have.
 */
export const PLOT_FONT = 'DejaVu Sans, Helvetica, Arial, sans-serif';

/** Margin around the picture; the renderer widens it by what rounding leaves over. */
export const PLOT_PADDING = 8;

/** Room between the panels for the right panel's ETTR labels, since the layout counts only the panels themselves. */
const PANEL_SPACING = 56;

/** Markers on the solid curves only: requeue's would sit on reschedule's and hide them. */
const markedOnly = { filter: { not: { field: 'strategy', equal: 'requeue' } } };

export function ettrPlotSpec(table: Sensitivity, panel: PanelSize): TopLevelSpec {
  const minutes = table.checkpoint.map((row) => row.minutes);
  const sizes = table.standby.map((row) => row.standby);
  const checkpointX = {
    field: 'x',
    type: 'quantitative' as const,
    title: 'checkpoint interval (minutes, log scale)',
    scale: { type: 'log' as const, domain: [Math.min(...minutes), Math.max(...minutes)], nice: false, padding: END_PADDING },
    // 3 significant digits so Daly's optimum (e.g. 1.09) reads as itself; colliding labels are dropped.
    axis: { values: minutes, format: '.3~g', labelOverlap: 'greedy' as const, grid: false },
  };
  const standbyX = {
    field: 'x',
    type: 'quantitative' as const,
    title: 'warm standby machines',
    scale: { domain: [Math.min(...sizes), Math.max(...sizes)], nice: false, padding: END_PADDING },
    axis: { values: sizes, format: 'd', grid: false },
  };

  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: { text: 'steadfast simulate ettr', subtitle: `sensitivity, mean over seeds ${table.seeds.join(', ')}`, anchor: 'start' },
    background: 'white',
    padding: PLOT_PADDING,
    config: {
      font: PLOT_FONT,
      legend: { orient: 'top', symbolType: 'stroke', symbolStrokeWidth: 2.5, symbolSize: 400, labelFontSize: 12 },
      axis: { labelFontSize: 11, titleFontSize: 12 },
    },
    // Lay the panels out by their own size, not by estimated label widths, so the picture's size
    // follows the panel size predictably (the renderer relies on that to hit an exact size).
    bounds: 'flush',
    spacing: PANEL_SPACING,
    resolve: { scale: { y: 'shared', color: 'shared', strokeDash: 'shared' } },
    hconcat: [
      {
        title: 'ETTR vs checkpoint interval',
        width: panel.width,
        height: panel.height,
        data: { values: checkpointPoints(table) },
        encoding: { x: checkpointX, y: ettrAxis, ...strategyEncoding },
        layer: [{ mark: { type: 'line', strokeWidth: 2.5 } }, { transform: [markedOnly], mark: { type: 'point', filled: true, size: 40 } }],
      },
      {
        title: 'ETTR vs warm standby pool',
        width: panel.width,
        height: panel.height,
        layer: [
          {
            data: { values: standbyPoints(table) },
            encoding: { x: standbyX, y: sharedEttrAxis, ...strategyEncoding },
            layer: [{ mark: { type: 'line', strokeWidth: 2.5 } }, { mark: { type: 'point', filled: true, size: 40 } }],
          },
          // A rule with only a y position spans the panel: the baselines' level at every pool size.
          { data: { values: baselineLevels(table) }, mark: { type: 'rule', strokeWidth: 2.5 }, encoding: { y: sharedEttrAxis, ...strategyEncoding } },
        ],
      },
    ],
  };
}
