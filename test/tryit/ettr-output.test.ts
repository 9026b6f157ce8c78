import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Resvg } from '@resvg/resvg-js';
import { afterAll, describe, expect, it } from 'vitest';
import { compile } from 'vega-lite';
import { simulateCommand } from '../../tryit/cli/simulate.js';
import { ettrPlot, plotFormatFor } from '../../tryit/ettr/plot.js';
import { ettrPlotSpec } from '../../tryit/ettr/plot-spec.js';
import type { Sensitivity } from '../../tryit/ettr/sensitivity.js';
import { runCli, type CliRun } from '../support/cli.js';

const scratch = mkdtempSync(join(tmpdir(), 'steadfast-ettr-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

/** Width and height from the IHDR chunk, which the PNG format puts first. */
function pngSize(png: Buffer): { width: number; height: number } {
  expect(png.subarray(0, 8).equals(PNG_SIGNATURE)).toBe(true);
  expect(png.toString('ascii', 12, 16)).toBe('IHDR');
  return { width: png.readUInt32BE(16), height: png.readUInt32BE(20) };
}

/** RGBA pixels of a PNG, decoded by drawing it as an SVG image: resvg is already here, so no PNG decoder is added for the test. */
function pngPixels(png: Buffer): Buffer {
  const { width, height } = pngSize(png);
  const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}"><image width="${width}" height="${height}" href="data:image/png;base64,${png.toString('base64')}"/></svg>`;
  return new Resvg(svg).render().pixels;
}

function pixelsNear(pixels: Buffer, [r, g, b]: readonly [number, number, number], tolerance = 24): number {
  let count = 0;
  for (let i = 0; i + 3 < pixels.length; i += 4) {
    if (Math.abs((pixels[i] ?? 0) - r) <= tolerance && Math.abs((pixels[i + 1] ?? 0) - g) <= tolerance && Math.abs((pixels[i + 2] ?? 0) - b) <= tolerance)
      count += 1;
  }
  return count;
}

/** A table in the sensitivity sweep's shape with values that are easy to recognise in the output. */
const TABLE: Sensitivity = {
  seeds: [1, 2],
  standby: [
    { standby: 0, steadfast: 0.9701, poolShortEvictions: 12, isDefault: false },
    { standby: 2, steadfast: 0.9802, poolShortEvictions: 3, isDefault: false },
    { standby: 4, steadfast: 0.9853, poolShortEvictions: 0, isDefault: true },
  ],
  checkpoint: [
    { minutes: 1.09, steadfast: 0.9854, reschedule: 0.9605, requeue: 0.9611, isDefault: true },
    { minutes: 30, steadfast: 0.9707, reschedule: 0.9456, requeue: 0.9462, isDefault: false },
    { minutes: 120, steadfast: 0.9208, reschedule: 0.8993, requeue: 0.8997, isDefault: false },
  ],
  baselines: { reschedule: 0.9605, requeue: 0.9611 },
};

/** The Vega program the chart compiles to: what the renderer draws, data and scales included. */
function compiled(table: Sensitivity) {
  return compile(ettrPlotSpec(table, { width: 300, height: 200 })).spec;
}

describe('the sensitivity chart', () => {
  it('carries every point of the sensitivity table: three strategies over the checkpoint interval, steadfast over the pool, the baselines as levels', () => {
    const rows = (compiled(TABLE).data ?? []).flatMap((data) => ('values' in data && Array.isArray(data.values) ? (data.values as unknown[]) : []));
    const expected = [
      ...TABLE.checkpoint.flatMap((row) => [
        { strategy: 'steadfast', x: row.minutes, ettr: row.steadfast },
        { strategy: 'reschedule', x: row.minutes, ettr: row.reschedule },
        { strategy: 'requeue', x: row.minutes, ettr: row.requeue },
      ]),
      ...TABLE.standby.map((row) => ({ strategy: 'steadfast', x: row.standby, ettr: row.steadfast })),
      { strategy: 'reschedule', x: 0, ettr: TABLE.baselines.reschedule },
      { strategy: 'requeue', x: 0, ettr: TABLE.baselines.requeue },
    ];
    expect(rows).toHaveLength(expected.length);
    expect(rows).toEqual(expect.arrayContaining(expected));
  });

  it('puts the checkpoint interval on a log axis, shares one ETTR axis and dashes requeue only', () => {
    const scales = compiled(TABLE).scales ?? [];
    expect(scales.filter((scale) => scale.type === 'log')).toHaveLength(1);
    expect(scales.filter((scale) => scale.name.endsWith('y'))).toHaveLength(1);
    const dash = scales.find((scale) => scale.name === 'strokeDash');
    expect(dash).toMatchObject({
      domain: ['steadfast', 'reschedule', 'requeue'],
      range: [
        [1, 0],
        [1, 0],
        [6, 4],
      ],
    });
  });

  it('writes an SVG of the requested size with the title, both panels, the legend and the dashed requeue line', async () => {
    const svg = (await ettrPlot(TABLE, { format: 'svg', size: { width: 900, height: 420 } })).toString('utf8');
    expect(svg).toMatch(/^<svg[^>]* width="900" height="420"/);
    const texts = [...svg.matchAll(/<text[^>]*>([^<]*)<\/text>/g)].map((match) => match[1]);
    expect(texts).toEqual(
      expect.arrayContaining([
        'steadfast simulate ettr',
        'ETTR vs checkpoint interval',
        'ETTR vs warm standby pool',
        'steadfast',
        'reschedule',
        'requeue',
        '30',
        '120',
      ]),
    );
    expect(svg).toContain('stroke="#d62728" stroke-width="2.5" stroke-dasharray="6,4"');
  });

  it.each([
    [1000, 480],
    [720, 360],
  ])('writes a %i×%i PNG with all three curves and its labels drawn', async (width, height) => {
    const png = await ettrPlot(TABLE, { size: { width, height } });
    expect(pngSize(png)).toEqual({ width, height });
    const pixels = pngPixels(png);
    expect(pixelsNear(pixels, [31, 119, 180])).toBeGreaterThan(200);
    expect(pixelsNear(pixels, [255, 127, 14])).toBeGreaterThan(50);
    expect(pixelsNear(pixels, [214, 39, 40])).toBeGreaterThan(50);
    // Text is near-black; without a font resvg would leave it out and only the grey axes remain.
    expect(pixelsNear(pixels, [0, 0, 0], 40)).toBeGreaterThan(500);
  });

  it('refuses a size the labels cannot fit in', async () => {
    await expect(ettrPlot(TABLE, { size: { width: 200, height: 100 } })).rejects.toThrow(RangeError);
    await expect(ettrPlot(TABLE, { size: { width: 1000.5, height: 480 } })).rejects.toThrow(RangeError);
  });

  it('picks SVG for a path ending in .svg, in any case, and PNG for anything else', () => {
    expect(plotFormatFor('docs/ettr.svg')).toBe('svg');
    expect(plotFormatFor('ETTR.SVG')).toBe('svg');
    expect(plotFormatFor('docs/ettr.png')).toBe('png');
    expect(plotFormatFor('plot')).toBe('png');
  });
});

function simulate(...args: string[]): Promise<CliRun> {
  return runCli(simulateCommand(), args);
}

describe('steadfast simulate ettr (CLI)', () => {
  it('prints one JSON object with ETTR, both baselines, hours per cause, standby usage and the gain over requeue', async () => {
    const run = await simulate('ettr', '--days', '10', '--seed', '3', '--json');
    expect(run.exitCode).toBe(0);
    const printed = JSON.parse(run.stdout) as Record<string, unknown> & {
      ettr: number;
      baselines: { requeue: number; reschedule: number };
      unproductiveHours: Record<string, number>;
      standby: { poolSize: number; activations: number; poolShortEvictions: number };
      gainOverRequeue: number;
      paper: { gainOverRequeue: number };
    };
    expect(printed.ettr).toBeGreaterThan(0);
    expect(printed.ettr).toBeLessThanOrEqual(1);
    expect(printed.baselines.requeue).toBeLessThan(printed.ettr);
    expect(printed.baselines.reschedule).toBeLessThan(printed.ettr);
    expect(Object.keys(printed.unproductiveHours)).toContain('lost_work');
    expect(printed.standby.poolSize).toBe(4);
    expect(printed.gainOverRequeue).toBeGreaterThan(1);
    expect(printed.paper.gainOverRequeue).toBe(10.87);
  });

  it('prints the table, the sensitivity sweep and writes the PNG plot where --plot says', async () => {
    const file = join(scratch, 'ettr.png');
    const run = await simulate('ettr', '--days', '3', '--nodes', '600', '--standby', '2', '--checkpoint-minutes', '15', '--plot', file);
    expect(run.exitCode).toBe(0);
    expect(run.stdout).toContain('ETTR');
    expect(run.stdout).toContain('4,800 GPUs on 600 nodes');
    expect(run.stdout).toContain('checkpoint every 15.00 min; 2 warm standbys');
    expect(run.stdout).toContain('sensitivity (mean over seeds 1, 2, 3, 4, 5)');
    expect(run.stdout).toContain(`plot written to ${file}`);
    expect(pngSize(readFileSync(file))).toEqual({ width: 1000, height: 480 });
  });

  it('writes the plot as SVG when the file ends in .svg', async () => {
    const file = join(scratch, 'ettr.svg');
    const run = await simulate('ettr', '--days', '1', '--nodes', '100', '--plot', file);
    expect(run.exitCode).toBe(0);
    expect(run.stdout).toContain(`plot written to ${file}`);
    const svg = readFileSync(file, 'utf8');
    expect(svg).toMatch(/^<svg[^>]* width="1000" height="480"/);
    expect(svg).toContain('>ETTR vs warm standby pool</text>');
  });

  it.each([
    [['--nodes', '0'], '--nodes'],
    [['--days', 'soon'], '--days'],
    [['--checkpoint-minutes', '-5'], '--checkpoint-minutes'],
    [['--standby', '1.5'], '--standby'],
  ])('exits 2 and names the flag for a bad value: %j', async (flags, name) => {
    const run = await simulate('ettr', ...flags);
    expect(run.exitCode).toBe(2);
    expect(run.stderr).toContain(name);
    expect(run.stdout).toBe('');
  });

  it('exits 2 with a clear message when the GPUs do not divide over the nodes', async () => {
    const run = await simulate('ettr', '--gpus', '9601', '--nodes', '1200');
    expect(run.exitCode).toBe(2);
    expect(run.stderr).toContain('gpus (9601) must be a whole multiple of nodes (1200)');
  });

  it('exits 2 when the plot file cannot be written', async () => {
    const run = await simulate('ettr', '--days', '1', '--plot', join(scratch, 'missing', 'dir', 'plot.png'));
    expect(run.exitCode).toBe(2);
    expect(run.stderr).toContain('cannot write plot file');
  });
});
