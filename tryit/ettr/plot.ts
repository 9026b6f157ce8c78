import { Resvg } from '@resvg/resvg-js';
import { parse, View, type Padding } from 'vega';
import { compile } from 'vega-lite';
import { ettrPlotSpec, PLOT_FONT, PLOT_PADDING, type PanelSize } from './plot-spec.js';
import type { Sensitivity } from './sensitivity.js';

/**
 * Renders the sensitivity chart (plot-spec.ts) headless: Vega draws SVG without a canvas, and
 * resvg turns that SVG into a PNG where a raster picture is wanted (the README's image).
 */

export interface PlotSize {
  readonly width: number;
  readonly height: number;
}

export type PlotFormat = 'png' | 'svg';

export interface PlotOptions {
  readonly format?: PlotFormat;
  readonly size?: PlotSize;
}

export const DEFAULT_PLOT_SIZE: PlotSize = { width: 1000, height: 480 };

/** SVG for a path ending in .svg (vector, for docs), PNG for anything else, as before SVG existed. */
export function plotFormatFor(path: string): PlotFormat {
  return path.toLowerCase().endsWith('.svg') ? 'svg' : 'png';
}

export async function ettrPlot(table: Sensitivity, options: PlotOptions = {}): Promise<Buffer> {
  const size = options.size ?? DEFAULT_PLOT_SIZE;
  checkSize(size);
  const svg = await ettrSvg(table, size);
  return (options.format ?? 'png') === 'svg' ? Buffer.from(svg, 'utf8') : svgToPng(svg);
}

function checkSize(size: PlotSize): void {
  const whole = Number.isInteger(size.width) && Number.isInteger(size.height);
  if (!whole || size.width < 600 || size.height < 300 || size.width > 8000 || size.height > 8000) {
    throw new RangeError(`plot size must be whole pixels between 600×300 and 8000×8000, not ${size.width}×${size.height}`);
  }
}

/**
 * Vega-Lite sizes each panel, not the picture (its "fit" sizing does not apply to side-by-side
 * views). So draw at a trial size to learn what the axes, titles and legend take, give the panels
 * the rest, and pad what is left so the picture is exactly the size asked for. A few rounds,
 * because the margins move a little with the panel size (which tick labels show, how far the top
 * one reaches past the frame); the panel size that fits with the least left over wins.
 */
async function ettrSvg(table: Sensitivity, size: PlotSize): Promise<string> {
  let panel: PanelSize = { width: 300, height: 200 };
  let best: { panel: PanelSize; slack: PlotSize } | undefined;
  for (let round = 0; round < 6; round += 1) {
    const drawn = svgSize(await renderSvg(table, panel, PLOT_PADDING));
    const slack = { width: size.width - drawn.width, height: size.height - drawn.height };
    const fits = slack.width >= 0 && slack.height >= 0;
    if (fits && (best === undefined || slack.width + slack.height < best.slack.width + best.slack.height)) best = { panel, slack };
    if (fits && slack.width < 4 && slack.height < 4) break;
    // Two panels side by side share the spare width; the one row of panels takes all the height.
    panel = { width: Math.max(40, panel.width + Math.floor(slack.width / 2)), height: Math.max(40, panel.height + Math.floor(slack.height)) };
  }
  if (best === undefined) throw new Error(`cannot fit the plot into ${size.width}×${size.height}`);
  const { width, height } = best.slack;
  return renderSvg(table, best.panel, {
    left: PLOT_PADDING + Math.floor(width / 2),
    right: PLOT_PADDING + Math.ceil(width / 2),
    top: PLOT_PADDING + Math.floor(height / 2),
    bottom: PLOT_PADDING + Math.ceil(height / 2),
  });
}

async function renderSvg(table: Sensitivity, panel: PanelSize, padding: Padding): Promise<string> {
  const view = new View(parse(compile(ettrPlotSpec(table, panel)).spec), { renderer: 'none' });
  try {
    return await view.padding(padding).toSVG();
  } finally {
    view.finalize();
  }
}

function svgSize(svg: string): PlotSize {
  const root = /<svg\b[^>]*>/.exec(svg)?.[0] ?? '';
  const width = Number(/\bwidth="([\d.]+)"/.exec(root)?.[1]);
  const height = Number(/\bheight="([\d.]+)"/.exec(root)?.[1]);
  if (!(width > 0) || !(height > 0)) throw new Error('vega produced an SVG without a size');
  return { width, height };
}

function svgToPng(svg: string): Buffer {
  requireTextFont();
  return new Resvg(svg, { font: { loadSystemFonts: true } }).render().asPng();
}

/**
 * resvg draws text only with fonts it finds on the machine, and silently leaves text out without
 * one; a plot without its labels would be committed to the docs unnoticed, so refuse instead.
 */
function requireTextFont(): void {
  const probe = `<svg xmlns="http://www.w3.org/2000/svg" width="40" height="20"><text x="2" y="15" font-family="${PLOT_FONT}">ETTR</text></svg>`;
  if (new Resvg(probe, { font: { loadSystemFonts: true } }).getBBox() === undefined) {
    throw new Error("no font found for the plot's text (resvg loads the system fonts; install one, e.g. fonts-dejavu-core), or write an .svg plot instead");
  }
}
