import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';
import { detectCommand } from '../../cli/detect.js';
import type { FailSlowReport } from '../../analyzers/failslow/detector.js';
import { runCli, type CliRun } from '../support/cli.js';

const dir = mkdtempSync(join(tmpdir(), 'steadfast-detect-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
afterEach(() => {
  process.exitCode = undefined;
  vi.restoreAllMocks();
});

function write(name: string, text: string): string {
  const path = join(dir, name);
  writeFileSync(path, text);
  return path;
}

/** Runs `detect <args>` in-process. */
function detect(...args: string[]): Promise<CliRun> {
  return runCli(detectCommand(), args);
}

/** Four ranks, 300 iterations each; rank 2 becomes 1.4× slower from iteration 150. */
function recording(): string {
  const rows = ['time,rank,iteration_seconds'];
  for (let rank = 0; rank < 4; rank += 1) {
    let time = 1_700_000_000;
    for (let i = 0; i < 300; i += 1) {
      const wobble = 1 + 0.01 * Math.sin(i * 1.7 + rank);
      const seconds = (rank === 2 && i >= 150 ? 1.4 : 1) * wobble;
      time += seconds;
      rows.push(`${time.toFixed(3)},${rank},${seconds.toFixed(4)}`);
    }
  }
  return `${rows.join('\n')}\n`;
}

describe('steadfast detect failslow', () => {
  it('prints the report as JSON with the slow rank, its change point and the slow group', async () => {
    const input = write('run.csv', recording());
    const topology = write('topology.json', JSON.stringify({ nodes: ['a', 'b', 'c', 'd'], ranksPerNode: 1, dp: 4 }));
    const result = await detect('failslow', '--input', input, '--topology', topology);
    expect(result.exitCode).toBe(0);
    expect(result.stderr).toBe('');
    const report = JSON.parse(result.stdout) as FailSlowReport;
    expect(Object.keys(report)).toEqual(['rankCount', 'sampleCount', 'changePoints', 'slowRanks', 'slowGroups', 'ranks']);
    expect(report).toMatchObject({ rankCount: 4, sampleCount: 1200, slowRanks: [2] });
    expect(report.changePoints).toHaveLength(1);
    expect(report.changePoints[0]).toMatchObject({ rank: 2, iteration: 150, direction: 'slowdown' });
    expect(Object.keys(report.changePoints[0] ?? {})).toEqual(['rank', 'time', 'iteration', 'beforeSeconds', 'afterSeconds', 'ratio', 'direction']);
    expect(report.slowGroups.map((group) => [group.kind, group.index, group.slowestRank])).toEqual([['dp-replica', { dp: 2 }, 2]]);
  });

  it('accepts the columns in any order and CRLF line ends, without a topology', async () => {
    const input = write('reordered.csv', 'rank,iteration_seconds,time\r\n0,1.0,1\r\n1,1.0,1\r\n\r\n0,1.0,2\r\n');
    const result = await detect('failslow', '--input', input);
    expect(result.exitCode).toBe(0);
    expect(JSON.parse(result.stdout)).toMatchObject({ rankCount: 2, sampleCount: 3, changePoints: [], slowRanks: [], slowGroups: [] });
  });

  it.each([
    { what: 'a missing file', file: null, message: 'cannot read input file' },
    { what: 'a wrong header', file: 'time,rank,seconds\n1,0,1\n', message: 'line 1: header must be time,rank,iteration_seconds' },
    { what: 'a non-numeric field', file: 'time,rank,iteration_seconds\n1,0,1\n2,0,fast\n', message: 'line 3: iteration_seconds is not a number: "fast"' },
    { what: 'an empty field', file: 'time,rank,iteration_seconds\n1,,1\n', message: 'line 2: rank is not a number: ""' },
    { what: 'a negative time', file: 'time,rank,iteration_seconds\n1,0,1\n-5,0,1\n', message: 'line 3: time must be ≥ 0, got -5' },
    { what: 'a fractional rank', file: 'time,rank,iteration_seconds\n1,0.5,1\n', message: 'line 2: rank must be a whole number' },
    { what: 'a zero iteration time', file: 'time,rank,iteration_seconds\n1,0,0\n', message: 'line 2: iteration_seconds must be > 0' },
    { what: 'a short row', file: 'time,rank,iteration_seconds\n1,0\n', message: 'line 2: expected 3 fields, got 2' },
    { what: 'an empty file', file: '', message: 'empty file' },
  ])('exits 2 and names the line and field for $what', async ({ file, message }) => {
    const input = file === null ? join(dir, 'no-such.csv') : write('bad.csv', file);
    const result = await detect('failslow', '--input', input);
    expect(result.exitCode).toBe(2);
    expect(result.stdout).toBe('');
    expect(result.stderr).toContain(message);
  });

  it('exits 2 naming the line of a rank the topology does not have', async () => {
    const input = write('outside.csv', 'time,rank,iteration_seconds\n1,0,1\n1,7,1\n');
    const topology = write('small.json', JSON.stringify({ nodes: ['a', 'b'], ranksPerNode: 1, dp: 2 }));
    const result = await detect('failslow', '--input', input, '--topology', topology);
    expect(result.exitCode).toBe(2);
    expect(result.stderr).toContain('line 3: rank 7 is not in the topology (2 ranks)');
  });

  it('exits 2 when the topology file is not valid', async () => {
    const input = write('fine.csv', 'time,rank,iteration_seconds\n1,0,1\n');
    const topology = write('broken.json', '{"nodes": [');
    const result = await detect('failslow', '--input', input, '--topology', topology);
    expect(result.exitCode).toBe(2);
    expect(result.stderr).toContain('is not JSON');
  });
});

describe('steadfast detect suspects: bad input', () => {
  it('exits 2 naming a Prometheus address that is not an http URL, a time that is not one, and a window too long', async () => {
    const url = await detect('suspects', '--prometheus', 'ftp://prom');
    expect(url).toMatchObject({ exitCode: 2 });
    expect(url.stderr).toContain('--prometheus: not an http(s) URL: ftp://prom');
    process.exitCode = 0;
    const at = await detect('suspects', '--prometheus', 'http://127.0.0.1:9', '--at', 'yesterday-ish');
    expect(at.stderr).toContain('--at: not a time: yesterday-ish');
    process.exitCode = 0;
    const long = await detect('suspects', '--prometheus', 'http://127.0.0.1:9', '--minutes', '100000', '--step-seconds', '1');
    expect(long.stderr).toContain('6000000 evaluations; between 1 and 10000 are allowed');
    process.exitCode = 0;
  });
});
