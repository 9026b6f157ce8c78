import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { analyzeCommand } from '../../cli/analyze.js';
import { GRAD_SYNC, STUCK_ALL_GATHER, STUCK_IRECV, STUCK_ISEND, rankDump } from '../analyzers/stacks/pyspy-fixtures.js';
import { runCli, type CliRun } from '../support/cli.js';

const root = mkdtempSync(join(tmpdir(), 'steadfast-analyze-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** Runs `steadfast analyze ARGS` in-process. */
function analyze(args: string[]): Promise<CliRun> {
  return runCli(analyzeCommand(), args);
}

function writeDir(name: string, files: Record<string, string>): string {
  const dir = join(root, name);
  mkdirSync(dir, { recursive: true });
  for (const [file, text] of Object.entries(files)) writeFileSync(join(dir, file), text);
  return dir;
}

const nodeNames = (count: number): string[] => Array.from({ length: count }, (_, index) => `gpu-${index}`);
const figure7Topology = join(root, 'figure7.json');
writeFileSync(figure7Topology, JSON.stringify({ nodes: nodeNames(16), ranksPerNode: 2, tp: 2, pp: 4, dp: 4, order: 'tp-pp-dp' }));

/** ByteRobust Fig. 7: machines 12-15 (ranks 24-31) stuck in all_gather / isend / irecv. */
const figure7Dumps = writeDir(
  'figure7',
  Object.fromEntries(
    Array.from({ length: 32 }, (_, rank) => {
      const machine = Math.floor(rank / 2);
      const stack = machine === 15 ? STUCK_ALL_GATHER : machine === 14 ? STUCK_ISEND : machine >= 12 ? STUCK_IRECV : GRAD_SYNC;
      // Two dumps in a row per rank: the analyzer reads the newer one.
      return [`rank-${rank}.txt`, `${rankDump(5000 + rank, GRAD_SYNC)}\n${rankDump(5000 + rank, stack)}`];
    }),
  ),
);

describe('steadfast analyze stacks', () => {
  it("prints the aggregation as JSON and over-evicts the stalled pipeline's machines", async () => {
    const { stdout, stderr, exitCode } = await analyze(['stacks', '--topology', figure7Topology, figure7Dumps]);
    expect(stderr).toBe('');
    expect(exitCode).toBe(0);
    const result = JSON.parse(stdout) as Record<string, unknown>;
    expect(Object.keys(result)).toEqual(expect.arrayContaining(['groups', 'outlierRanks', 'suspectGroup', 'evict', 'missingRanks', 'reason']));
    expect(result.outlierRanks).toEqual([24, 25, 26, 27, 28, 29, 30, 31]);
    expect(result.suspectGroup).toEqual({ kind: 'pp', ranks: [24, 26, 28, 30], nodes: ['gpu-12', 'gpu-13', 'gpu-14', 'gpu-15'], coveredOutliers: 8 });
    expect(result.evict).toEqual(['gpu-12', 'gpu-13', 'gpu-14', 'gpu-15']);
    expect(result.missingRanks).toEqual([]);
  });

  it('adds the ranks the NCCL flight recorder finds behind to the outliers', async () => {
    // The 16-rank job of the fixture, assumed on two eight-GPU machines; every stack equal.
    const topology = join(root, 'fr-topology.json');
    writeFileSync(topology, JSON.stringify({ nodes: nodeNames(2), ranksPerNode: 8, tp: 2, dp: 2, pp: 4, order: 'tp-dp-pp' }));
    const dumps = writeDir('fr-stacks', Object.fromEntries(Array.from({ length: 16 }, (_, rank) => [`rank-${rank}.txt`, rankDump(100 + rank, GRAD_SYNC)])));
    const recorder = join(root, 'fr');
    mkdirSync(recorder, { recursive: true });
    copyFileSync(
      'test/fixtures/realworld/pytorch-flight-recorder/gpu_error_1st_all16ranks_decoded.json',
      join(recorder, 'gpu_error_1st_all16ranks_decoded.json'),
    );
    writeFileSync(join(recorder, 'README.txt'), 'not a dump: ignored');
    const { stdout, exitCode } = await analyze(['stacks', '--topology', topology, '--flight-recorder', recorder, dumps]);
    expect(exitCode).toBe(0);
    const result = JSON.parse(stdout) as {
      outlierRanks: number[];
      externalOutlierRanks: number[];
      evict: string[];
      suspectGroup: unknown;
      flightRecorder: { behindRanks: number[] };
    };
    expect(result.flightRecorder.behindRanks).toEqual([12, 14]);
    expect(result.externalOutlierRanks).toEqual([12, 14]);
    expect(result.outlierRanks).toEqual([12, 14]);
    // 12 and 14 form one DP group of this job (the dumps' DATA_PARALLEL_GROUP [12, 14]): the smallest group holding both.
    expect(result.suspectGroup).toEqual({ kind: 'dp', ranks: [12, 14], nodes: ['gpu-1'], coveredOutliers: 2 });
    expect(result.evict).toEqual(['gpu-1']);
  });

  describe('answers bad input with exit code 2 and a message naming what is wrong', () => {
    const cases: Array<[string, () => string[], RegExp]> = [
      [
        'a dumps directory that does not exist',
        () => ['stacks', '--topology', figure7Topology, join(root, 'nowhere')],
        /cannot read dumps directory .*nowhere/,
      ],
      ['a dumps directory without rank files', () => ['stacks', '--topology', figure7Topology, writeDir('empty', {})], /holds no rank-<N>\.txt files/],
      [
        'a file not named rank-<N>.txt',
        () => ['stacks', '--topology', figure7Topology, writeDir('badname', { 'rank-0.txt': 'x', 'notes.md': 'x' })],
        /"notes\.md" is not named rank-<N>\.txt/,
      ],
      [
        'a leading zero in a rank file name',
        () => ['stacks', '--topology', figure7Topology, writeDir('zero', { 'rank-01.txt': 'x' })],
        /"rank-01\.txt" is not named/,
      ],
      [
        'a directory where a rank file should be',
        () => {
          const dir = writeDir('subdir', { 'rank-0.txt': 'x' });
          mkdirSync(join(dir, 'rank-1.txt'), { recursive: true });
          return ['stacks', '--topology', figure7Topology, dir];
        },
        /rank-1\.txt: not a plain file/,
      ],
      [
        'a rank the topology does not have',
        () => ['stacks', '--topology', figure7Topology, writeDir('outside', { 'rank-0.txt': 'x', 'rank-32.txt': 'x' })],
        /rank-32\.txt is for rank 32, but the topology has ranks 0-31/,
      ],
      [
        'a topology file that is not JSON',
        () => ['stacks', '--topology', writeDir('bad-topology', { 't.json': '{ nodes' }) + '/t.json', figure7Dumps],
        /topology file .*t\.json is not JSON/,
      ],
      [
        'a topology file that does not describe a job',
        () => ['stacks', '--topology', writeDir('wrong-topology', { 't.json': '{"nodes": ["a"], "ranksPerNode": 2, "tp": 4}' }) + '/t.json', figure7Dumps],
        /topology/,
      ],
      ['a missing topology file', () => ['stacks', '--topology', join(root, 'none.json'), figure7Dumps], /cannot read topology file .*none\.json/],
      [
        'a flight-recorder file that is not JSON',
        () => ['stacks', '--topology', figure7Topology, '--flight-recorder', writeDir('fr-bad', { 'rank-0.json': '{' }), figure7Dumps],
        /flight recorder file .*rank-0\.json is not JSON/,
      ],
    ];
    for (const [what, args, message] of cases) {
      it(what, async () => {
        const { stdout, stderr, exitCode } = await analyze(args());
        expect(exitCode).toBe(2);
        expect(stdout).toBe('');
        expect(stderr).toMatch(message);
      });
    }
  });
});
