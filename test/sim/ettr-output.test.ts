import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { inflateSync } from 'node:zlib';
import { afterAll, describe, expect, it } from 'vitest';
import { simulateCommand } from '../../cli/simulate.js';
import { ettrParams } from '../../sim/ettr/model.js';
import { ettrPlot } from '../../sim/ettr/plot.js';
import { PNG_SIGNATURE, encodePng, pngSize } from '../../sim/ettr/png.js';
import { sensitivity } from '../../sim/ettr/sensitivity.js';
import { runCli, type CliRun } from '../support/cli.js';

const scratch = mkdtempSync(join(tmpdir(), 'steadfast-ettr-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

describe('the PNG encoder', () => {
  it('writes the signature, an IHDR of the requested size and the pixels, filter byte 0 per row', () => {
    const png = encodePng(2, 1, Uint8Array.from([255, 0, 0, 0, 0, 255]));
    expect(png.subarray(0, 8).equals(PNG_SIGNATURE)).toBe(true);
    expect(pngSize(png)).toEqual({ width: 2, height: 1 });
    const idatAt = png.indexOf('IDAT', 0, 'ascii');
    const length = png.readUInt32BE(idatAt - 4);
    expect([...inflateSync(png.subarray(idatAt + 4, idatAt + 4 + length))]).toEqual([0, 255, 0, 0, 0, 0, 255]);
    expect(png.subarray(png.length - 12).toString('ascii', 4, 8)).toBe('IEND');
  });

  it('refuses a pixel buffer of the wrong size', () => {
    expect(() => encodePng(2, 2, new Uint8Array(3))).toThrow(RangeError);
  });
});

describe('the sensitivity plot', () => {
  it('is a PNG of the requested size with more than the background in it', () => {
    const table = sensitivity(ettrParams({ days: 5 }), { seeds: [1], standbySizes: [0, 2, 4], checkpointMinutes: [1, 30] });
    const png = ettrPlot(table, { width: 640, height: 320 });
    expect(png.subarray(0, 8).equals(PNG_SIGNATURE)).toBe(true);
    expect(pngSize(png)).toEqual({ width: 640, height: 320 });
    const idatAt = png.indexOf('IDAT', 0, 'ascii');
    const pixels = inflateSync(png.subarray(idatAt + 4, idatAt + 4 + png.readUInt32BE(idatAt - 4)));
    // The steadfast blue (31, 119, 180) is drawn somewhere.
    let blue = 0;
    for (let i = 0; i + 2 < pixels.length; i += 1) if (pixels[i] === 31 && pixels[i + 1] === 119 && pixels[i + 2] === 180) blue += 1;
    expect(blue).toBeGreaterThan(50);
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
    const png = readFileSync(file);
    expect(png.subarray(0, 8).equals(PNG_SIGNATURE)).toBe(true);
    expect(pngSize(png)).toEqual({ width: 1000, height: 480 });
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
