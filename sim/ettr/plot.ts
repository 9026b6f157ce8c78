import { encodePng } from './png.js';
import { GLYPH_HEIGHT, Raster, type Rgb } from './raster.js';
import type { Sensitivity } from './sensitivity.js';

/**
 * The sensitivity table as a PNG: ETTR against the checkpoint interval (log scale, all three
 * strategies) and against the warm standby pool (steadfast; the baselines, which hold no
 * standbys, as flat levels), sharing one ETTR axis, with a legend. Requeue is drawn dashed so it
 * shows where it lies on top of reschedule.
 */

export interface PlotSize {
  readonly width: number;
  readonly height: number;
}

export const DEFAULT_PLOT_SIZE: PlotSize = { width: 1000, height: 480 };

const COLORS = {
  steadfast: [31, 119, 180],
  reschedule: [255, 127, 14],
  requeue: [214, 39, 40],
  axis: [40, 40, 40],
  grid: [225, 225, 225],
  text: [20, 20, 20],
} as const satisfies Record<string, Rgb>;

interface Series {
  readonly label: string;
  readonly color: Rgb;
  readonly points: readonly { x: number; y: number }[];
  readonly dashed?: boolean;
  readonly markers?: boolean;
}

interface Panel {
  readonly title: string;
  readonly series: readonly Series[];
  readonly xTicks: readonly number[];
  readonly logX: boolean;
}

interface Box {
  readonly left: number;
  readonly top: number;
  readonly width: number;
  readonly height: number;
}

export function ettrPlot(table: Sensitivity, size: PlotSize = DEFAULT_PLOT_SIZE): Buffer {
  if (!Number.isInteger(size.width) || !Number.isInteger(size.height) || size.width < 160 || size.height < 120 || size.width > 8000 || size.height > 8000) {
    throw new RangeError(`plot size must be whole pixels between 160×120 and 8000×8000, not ${size.width}×${size.height}`);
  }
  const raster = new Raster(size.width, size.height);
  const scale = size.width >= 800 && size.height >= 400 ? 2 : 1;
  const line = GLYPH_HEIGHT * scale;

  const sizes = table.standby.map((row) => row.standby);
  const left: Panel = {
    title: 'ETTR VS CHECKPOINT MINUTES',
    logX: true,
    xTicks: table.checkpoint.map((row) => row.minutes),
    series: [
      { label: 'STEADFAST', color: COLORS.steadfast, points: table.checkpoint.map((row) => ({ x: row.minutes, y: row.steadfast })), markers: true },
      { label: 'RESCHEDULE', color: COLORS.reschedule, points: table.checkpoint.map((row) => ({ x: row.minutes, y: row.reschedule })), markers: true },
      // Dashed, so it stays visible where it runs on top of reschedule.
      { label: 'REQUEUE', color: COLORS.requeue, points: table.checkpoint.map((row) => ({ x: row.minutes, y: row.requeue })), dashed: true },
    ],
  };
  const span = [Math.min(...sizes), Math.max(...sizes)];
  const level = (y: number): { x: number; y: number }[] => span.map((x) => ({ x: x ?? 0, y }));
  const right: Panel = {
    title: 'ETTR VS WARM STANDBYS',
    logX: false,
    xTicks: sizes,
    series: [
      { label: 'STEADFAST', color: COLORS.steadfast, points: table.standby.map((row) => ({ x: row.standby, y: row.steadfast })), markers: true },
      { label: 'RESCHEDULE', color: COLORS.reschedule, points: level(table.baselines.reschedule) },
      { label: 'REQUEUE', color: COLORS.requeue, points: level(table.baselines.requeue), dashed: true },
    ],
  };

  const values = [...left.series, ...right.series].flatMap((series) => series.points.map((point) => point.y));
  const yRange = ettrRange(values);

  // Title and legend along the top.
  raster.text(8 * scale, 6 * scale, 'STEADFAST SIMULATE ETTR', COLORS.text, scale);
  let legendX = Raster.textWidth('STEADFAST SIMULATE ETTR', scale) + 30 * scale;
  for (const series of left.series) {
    raster.fill(legendX, 6 * scale, line, line, series.color);
    raster.text(legendX + line + 4 * scale, 6 * scale, series.label, COLORS.text, scale);
    legendX += line + Raster.textWidth(series.label, scale) + 16 * scale;
  }

  const top = 6 * scale + line + 2 * line;
  const bottom = size.height - 3 * line - 6 * scale;
  const yLabelWidth = Raster.textWidth('100.0%', scale) + 6 * scale;
  const gap = 12 * scale;
  const panelWidth = Math.floor((size.width - 2 * (yLabelWidth + gap)) / 2);
  drawPanel(raster, left, { left: yLabelWidth + gap / 2, top, width: panelWidth, height: bottom - top }, yRange, scale);
  drawPanel(raster, right, { left: 2 * yLabelWidth + panelWidth + (gap * 3) / 2, top, width: panelWidth, height: bottom - top }, yRange, scale);
  return encodePng(size.width, size.height, raster.pixels);
}

/** An ETTR axis from a little below the lowest value to 100 %, in round steps. */
function ettrRange(values: readonly number[]): { min: number; max: number; step: number } {
  const low = Math.min(...values, 1);
  const high = Math.max(...values, 0);
  const spread = Math.max(0.002, Math.min(1, high + 0.002) - low);
  const step = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1].find((candidate) => spread / candidate <= 8) ?? 0.2;
  const min = Math.max(0, Math.floor((low - step / 2) / step) * step);
  const max = Math.min(1, Math.ceil((high + step / 4) / step) * step);
  return { min, max: max > min ? max : min + step, step };
}

function percent(value: number, step: number): string {
  return `${(value * 100).toFixed(step < 0.01 ? 1 : 0)}%`;
}

function tickLabel(value: number): string {
  return Number.isInteger(value) ? String(value) : value.toFixed(1);
}

function drawPanel(raster: Raster, panel: Panel, box: Box, y: { min: number; max: number; step: number }, scale: number): void {
  const xs = panel.xTicks.map((value) => (panel.logX ? Math.log(Math.max(value, 1e-9)) : value));
  const xMin = Math.min(...xs);
  const xMax = Math.max(...xs);
  const xPad = xMax > xMin ? (xMax - xMin) * 0.04 : 1;
  const px = (value: number): number => {
    const v = panel.logX ? Math.log(Math.max(value, 1e-9)) : value;
    return box.left + ((v - (xMin - xPad)) / (xMax - xMin + 2 * xPad)) * box.width;
  };
  const py = (value: number): number => box.top + box.height - ((value - y.min) / (y.max - y.min)) * box.height;

  // Grid and Y labels.
  for (let value = y.min; value <= y.max + y.step / 2; value += y.step) {
    const at = py(value);
    raster.line(box.left, at, box.left + box.width, at, COLORS.grid);
    const label = percent(value, y.step);
    raster.text(box.left - Raster.textWidth(label, scale) - 4 * scale, at - (GLYPH_HEIGHT * scale) / 2, label, COLORS.text, scale);
  }
  // X ticks, skipping labels that would overlap the previous one.
  let lastEnd = -Infinity;
  for (const value of panel.xTicks) {
    const at = px(value);
    raster.line(at, box.top + box.height, at, box.top + box.height + 3 * scale, COLORS.axis, scale);
    const label = tickLabel(value);
    const width = Raster.textWidth(label, scale);
    if (at - width / 2 > lastEnd + 3 * scale) {
      raster.text(at - width / 2, box.top + box.height + 5 * scale, label, COLORS.text, scale);
      lastEnd = at + width / 2;
    }
  }
  // Axes and title.
  raster.line(box.left, box.top, box.left, box.top + box.height, COLORS.axis, scale);
  raster.line(box.left, box.top + box.height, box.left + box.width, box.top + box.height, COLORS.axis, scale);
  raster.text(box.left + (box.width - Raster.textWidth(panel.title, scale)) / 2, box.top + box.height + 5 * scale + 2 * GLYPH_HEIGHT * scale, panel.title, COLORS.text, scale);

  for (const series of panel.series) {
    const points = series.points.map((point) => ({ x: px(point.x), y: py(point.y) }));
    for (let i = 1; i < points.length; i += 1) {
      const a = points[i - 1] as { x: number; y: number };
      const b = points[i] as { x: number; y: number };
      raster.line(a.x, a.y, b.x, b.y, series.color, 2 * scale, series.dashed === true ? 6 * scale : 0);
    }
    if (series.markers === true) for (const point of points) raster.fill(point.x - 2 * scale, point.y - 2 * scale, 4 * scale + 1, 4 * scale + 1, series.color);
  }
}
