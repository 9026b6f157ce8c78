import { readFileSync } from 'node:fs';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  aggregateRankStacks,
  aggregateStacks,
  findSuspectGroup,
  normaliseFrame,
  normaliseModulePath,
  parsePySpyDump,
  selectTrainingThread,
  stacksFromDumps,
} from '../../../analyzers/stacks/aggregate.js';
import { InputError } from '../../../core/errors.js';
import { Topology } from '../../../core/topology.js';
import { GRAD_SYNC, STUCK_ALL_GATHER, STUCK_IRECV, STUCK_ISEND, rankDump } from './pyspy-fixtures.js';

const PY_SPY = 'test/fixtures/realworld/py-spy';
const nodes = (count: number): string[] => Array.from({ length: count }, (_, index) => `node-${index}`);
const range = (from: number, to: number): number[] => Array.from({ length: to - from }, (_, index) => from + index);

/** ByteRobust Fig. 7: TP=2, PP=4, DP=4 on 16 two-GPU machines; the pipeline of DP replica 3 runs on machines 12-15. */
const figure7 = Topology.from({ nodes: nodes(16), ranksPerNode: 2, tp: 2, pp: 4, dp: 4, order: 'tp-pp-dp' });

function figure7Dumps(): Map<number, string> {
  const dumps = new Map<number, string>();
  for (let rank = 0; rank < 32; rank += 1) {
    const machine = Math.floor(rank / 2);
    const stack = machine === 15 ? STUCK_ALL_GATHER : machine === 14 ? STUCK_ISEND : machine >= 12 ? STUCK_IRECV : GRAD_SYNC;
    // Odd ranks print install prefixes and run a build with other line numbers: still the same code path.
    dumps.set(rank, rankDump(4000 + rank, stack, rank % 2 === 1 ? { fullPaths: true, lineShift: 3 } : {}));
  }
  return dumps;
}

describe('parsePySpyDump on real dumps', () => {
  it('gives every hand-grouped Thread header of the BLOOM-176B notes the one stack printed below them', () => {
    const parse = parsePySpyDump(readFileSync(`${PY_SPY}/bigscience_bloom176b_and_ml-engineering_pyspy_dumps.txt`, 'utf8'));
    const threads = parse.processes.flatMap((process) => process.threads);
    const byId = (id: string) => threads.filter((thread) => thread.id === id);
    for (const id of ['688510', '688511', '599212', '599213']) {
      const [thread] = byId(id);
      expect(thread?.frames).toHaveLength(10);
      expect(thread?.frames[0]).toEqual({ function: 'broadcast', file: 'torch/distributed/distributed_c10d.py', line: 1191 });
      expect(thread?.frames[9]).toEqual({ function: '<module>', file: 'pretrain_gpt.py', line: 249 });
    }
    const [dataloaderWait] = byId('688514');
    expect(dataloaderWait?.state).toBe('idle');
    expect(dataloaderWait?.frames.slice(0, 3).map((frame) => frame.function)).toEqual(['wait', 'get', '_try_get_data']);
    expect(byId('686188')[0]?.frames[1]).toEqual({ function: 'recv', file: 'deepspeed/runtime/pipe/p2p.py', line: 83 });
    const [hexMain] = byId('0x7F6D3C29D740');
    expect(hexMain?.name).toBe('MainThread');
    expect(hexMain?.frames.map((frame) => frame.function)).toEqual(['wait', 'result', 'main', '<module>']);
    expect(byId('0x7F6CF5FFB700')[0]?.name).toBe('Thread-CallbackRequestDispatcher');
    // The `#` and `###` provenance lines are not dump text.
    expect(parse.skippedLines).toBe(14);
    expect(threads).toHaveLength(22);
  });

  it('starts a new section when a thread id repeats, so concatenated dumps stay apart', () => {
    const parse = parsePySpyDump(readFileSync(`${PY_SPY}/bigscience_bloom176b_and_ml-engineering_pyspy_dumps.txt`, 'utf8'));
    expect(parse.processes).toHaveLength(2);
    expect(parse.processes[1]?.threads.map((thread) => thread.id)).toEqual(['835995', '0x7F6D3C29D740', '0x7F6CF5FFB700']);
  });

  it('reads the multi-process Process / Python headers, active+gil and <frozen …> locations', () => {
    const parse = parsePySpyDump(readFileSync(`${PY_SPY}/pyspy_multiprocess_header_format_excerpt.txt`, 'utf8'));
    expect(parse.processes.map(({ pid, command, python }) => ({ pid, command, python }))).toEqual([
      { pid: null, command: null, python: '3.12.3' },
      { pid: 165, command: 'sglang::data_parallel_controller', python: '3.12.3' },
    ]);
    const controller = parse.processes[1]?.threads[0];
    expect(controller).toMatchObject({ id: '165', state: 'active+gil', name: 'MainThread' });
    expect(controller?.frames[0]).toEqual({ function: 'recv_pyobj', file: 'zmq/sugar/socket.py', line: 989 });
    expect(controller?.frames.at(-1)).toEqual({ function: '<module>', file: '<string>', line: 1 });
    expect(parse.processes[0]?.threads[0]?.frames.at(-1)).toEqual({ function: '_run_module_as_main', file: '<frozen runpy>', line: 198 });
    expect(parse.processes[1]?.threads[1]?.name).toBe('Thread-1 (_read_thread)');
    expect(parse.skippedLines).toBe(4);
  });

  it('keeps --native frames, including C++ names with parentheses, and sets --locals lines aside', () => {
    const parse = parsePySpyDump(
      [
        'Thread 7 (active): "MainThread"',
        '    c10d::ProcessGroupNCCL::WorkNCCL::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >) (libtorch_cuda.so)',
        '    0x7caaa50b1a9b (?)',
        '    forward (model.py:12)',
        '        Arguments:',
        '            self: <Model at 0x7f00>',
        '    <module> (train.py:3)',
      ].join('\n'),
    );
    const frames = parse.processes[0]?.threads[0]?.frames ?? [];
    expect(frames.map((frame) => frame.function)).toEqual([
      'c10d::ProcessGroupNCCL::WorkNCCL::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >)',
      '0x7caaa50b1a9b',
      'forward',
      '<module>',
    ]);
    expect(frames[0]).toMatchObject({ file: 'libtorch_cuda.so', line: null });
    expect(parse.detailLines).toBe(2);
    expect(parse.skippedLines).toBe(0);
  });

  it('never throws on arbitrary text, and reads no thread out of text without a Thread header', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 400 }), (text) => {
        const parse = parsePySpyDump(text);
        if (!text.includes('Thread')) expect(parse.processes).toEqual([]);
      }),
    );
    const garbage = parsePySpyDump('\u0000\u00ff garbage\n    dangling (frame.py:1)\nError: Failed to suspend process\n```\n');
    expect(garbage.processes).toEqual([]);
    expect(garbage.skippedLines).toBe(4);
  });
});

describe('normalising frames', () => {
  it('drops install prefixes, line numbers and library versions so one code path compares equal everywhere', () => {
    expect(normaliseModulePath('/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py')).toBe('torch/distributed/distributed_c10d.py');
    expect(normaliseModulePath('/usr/local/lib/python3.10/dist-packages/megatron/core/utils.py')).toBe('megatron/core/utils.py');
    expect(normaliseModulePath('/usr/lib/python3.10/threading.py')).toBe('threading.py');
    expect(normaliseModulePath('/home/alice/runs/Megatron-LM/megatron/training.py')).toBe('Megatron-LM/megatron/training.py');
    expect(normaliseModulePath('C:\\work\\repo\\pkg\\mod.py')).toBe('repo/pkg/mod.py');
    expect(normaliseModulePath('libcudart.so.12')).toBe('libcudart.so');
    expect(normaliseModulePath('<frozen runpy>')).toBe('<frozen runpy>');
    const a = normaliseFrame({ function: 'broadcast', file: 'torch/distributed/distributed_c10d.py', line: 1191 });
    const b = normaliseFrame({ function: 'broadcast', file: '/opt/conda/lib/python3.8/site-packages/torch/distributed/distributed_c10d.py', line: 1200 });
    expect(a).toBe('broadcast (torch/distributed/distributed_c10d.py)');
    expect(b).toBe(a);
    expect(normaliseFrame({ function: '0x7caaa50b1a9b', file: '?', line: null })).toBeNull();
  });
});

describe('selectTrainingThread', () => {
  it('picks the trainer MainThread over pin-memory, checkpoint-writer, dataloader-worker and launcher stacks', () => {
    const launcher = [
      'Process 100: /usr/bin/python3 /usr/local/bin/torchrun --nproc-per-node 8 pretrain_gpt.py',
      'Thread 100 (idle): "MainThread"',
      '    _invoke_run (torch/distributed/elastic/agent/server/api.py:835)',
      '    run (torch/distributed/launcher/api.py:255)',
      '    main (torch/distributed/run.py:812)',
    ].join('\n');
    const worker = [
      'Process 300: /usr/bin/python3 -u pretrain_gpt.py',
      'Thread 300 (idle): "MainThread"',
      '    _worker_loop (torch/utils/data/_utils/worker.py:275)',
      '    run (multiprocessing/process.py:108)',
      '    _bootstrap (multiprocessing/process.py:314)',
    ].join('\n');
    const chosen = selectTrainingThread(parsePySpyDump([launcher, rankDump(200, GRAD_SYNC), worker].join('\n')));
    expect(chosen?.process.pid).toBe(200);
    expect(chosen?.thread.name).toBe('MainThread');
    expect(chosen?.thread.frames[0]?.function).toBe('wait');
  });

  it('takes the newest of several dumps of the same process written one after another', () => {
    const text = [rankDump(200, GRAD_SYNC), rankDump(200, STUCK_IRECV)].join('\n');
    expect(selectTrainingThread(parsePySpyDump(text))?.thread.frames[0]?.function).toBe('irecv');
    const withoutHeaders = text
      .split('\n')
      .filter((line) => !/^(Process|Python)/.test(line))
      .join('\n');
    expect(selectTrainingThread(parsePySpyDump(withoutHeaders))?.thread.frames[0]?.function).toBe('irecv');
  });
});

describe('aggregateStacks on ByteRobust Fig. 7', () => {
  it('over-evicts the PP group of machines 12-15 whose ranks hang in all_gather / isend / irecv', () => {
    const result = aggregateStacks(figure7Dumps(), figure7);
    expect(result.groups.map((group) => ({ size: group.ranks.length, healthy: group.healthy, top: group.frames[0] }))).toEqual([
      { size: 24, healthy: true, top: 'wait (torch/distributed/distributed_c10d.py)' },
      { size: 4, healthy: false, top: 'irecv (torch/distributed/distributed_c10d.py)' },
      { size: 2, healthy: false, top: expect.stringMatching(/^(all_gather_into_tensor|isend) /) },
      { size: 2, healthy: false, top: expect.stringMatching(/^(all_gather_into_tensor|isend) /) },
    ]);
    expect(result.groups[0]?.ranks).toEqual(range(0, 24));
    expect(result.groups[0]?.signature).toMatch(/^[0-9a-f]{12}$/);
    expect(result.outlierRanks).toEqual(range(24, 32));
    expect(result.suspectGroup).toEqual({ kind: 'pp', ranks: [24, 26, 28, 30], nodes: ['node-12', 'node-13', 'node-14', 'node-15'], coveredOutliers: 8 });
    expect(result.suspectGroup?.ranks).toEqual(figure7.group('pp', 24));
    expect(result.evict).toEqual(['node-12', 'node-13', 'node-14', 'node-15']);
    expect(result.evictedRanks).toEqual(range(24, 32));
    expect(result.missingRanks).toEqual([]);
    expect(result.uncoveredOutlierRanks).toEqual([]);
    expect(result.reason).toContain('one pp group');
  });

  it('names the DP group when the ranks of one DP group hang in a collective the rest finished', () => {
    // 8 four-GPU machines; a machine hosts TP 0/1 of two DP replicas of one stage.
    const topology = Topology.from({ nodes: nodes(8), ranksPerNode: 4, tp: 2, pp: 2, dp: 8, order: 'tp-dp-pp' });
    const dpGroup = topology.group('dp', 0);
    const stuck = ['reduce_scatter_tensor (torch/distributed/distributed_c10d.py:3300)', ...GRAD_SYNC.slice(1)];
    const stacks = new Map(range(0, 32).map((rank) => [rank, dpGroup.includes(rank) ? stuck : GRAD_SYNC]));
    const result = aggregateStacks(new Map([...stacks].map(([rank, stack]) => [rank, rankDump(rank + 1, stack)])), topology);
    expect(result.outlierRanks).toEqual(dpGroup);
    expect(result.suspectGroup).toEqual({ kind: 'dp', ranks: dpGroup, nodes: ['node-0', 'node-1', 'node-2', 'node-3'], coveredOutliers: 8 });
    expect(result.evictedRanks).toEqual(range(0, 16));
  });

  it('finds nothing to evict when every rank shows the same stack', () => {
    const dumps = new Map(range(0, 32).map((rank) => [rank, rankDump(rank + 1, GRAD_SYNC, { lineShift: rank })]));
    const result = aggregateStacks(dumps, figure7);
    expect(result.groups).toHaveLength(1);
    expect(result.groups[0]?.healthy).toBe(true);
    expect(result.outlierRanks).toEqual([]);
    expect(result.suspectGroup).toBeNull();
    expect(result.evict).toEqual([]);
    expect(result.reason).toContain('no outliers');
  });
});

describe('missing and unreadable ranks', () => {
  it('counts a rank without a dump as an outlier and evicts its machine', () => {
    const dumps = new Map(
      range(0, 32)
        .filter((rank) => rank !== 5)
        .map((rank) => [rank, rankDump(rank + 1, GRAD_SYNC)]),
    );
    const result = aggregateStacks(dumps, figure7);
    expect(result.missingRanks).toEqual([5]);
    expect(result.outlierRanks).toEqual([5]);
    expect(result.suspectGroup).toMatchObject({ kind: 'node', ranks: [4, 5], nodes: ['node-2'] });
    expect(result.evict).toEqual(['node-2']);
  });

  it('reports a rank whose dump holds no readable thread as missing and unreadable', () => {
    const dumps = new Map(range(0, 32).map((rank) => [rank, rank === 9 ? 'Error: Failed to suspend process\n\u0000\u0001' : rankDump(rank + 1, GRAD_SYNC)]));
    const result = aggregateStacks(dumps, figure7);
    expect(result.unreadableRanks).toEqual([9]);
    expect(result.missingRanks).toEqual([9]);
    expect(result.evict).toEqual(['node-4']);
    expect(result.skippedLines).toBe(2);
  });

  it('does not call untraced ranks hung when they are half the job or more', () => {
    const dumps = new Map(range(0, 16).map((rank) => [rank, rankDump(rank + 1, GRAD_SYNC)]));
    const result = aggregateStacks(dumps, figure7);
    expect(result.missingRanks).toEqual(range(16, 32));
    expect(result.outlierRanks).toEqual([]);
    expect(result.evict).toEqual([]);
    expect(result.reason).toContain('too few ranks were traced');
  });
});

describe('dominant groups', () => {
  it('keeps every group as large as the one that reaches a majority, so equal halves are both healthy', () => {
    const stacks = new Map(range(0, 32).map((rank) => [rank, rank < 16 ? ['a (x.py)'] : ['b (x.py)']]));
    const result = aggregateRankStacks(stacks, figure7);
    expect(result.groups.map((group) => group.healthy)).toEqual([true, true]);
    expect(result.outlierRanks).toEqual([]);
  });

  it('treats several stage-specific stacks as healthy together and the stray ones as outliers', () => {
    // Each PP stage waits somewhere else; the pipeline of DP replica 1 (ranks 8-15) waits in p2p.
    const stacks = new Map(
      figure7.ranks.map(({ rank, coords }) => [rank, coords.dp === 1 ? [`recv_stage_${coords.pp} (p2p.py)`] : [`stage_${coords.pp}_wait (c10d.py)`]]),
    );
    const result = aggregateRankStacks(stacks, figure7);
    expect(result.groups.filter((group) => group.healthy)).toHaveLength(4);
    expect(result.outlierRanks).toEqual(range(8, 16));
    expect(result.suspectGroup).toMatchObject({ kind: 'pp', nodes: ['node-4', 'node-5', 'node-6', 'node-7'] });
  });

  it('never names a group that spans every machine of the job', () => {
    const dpOnly = Topology.from({ nodes: nodes(4), ranksPerNode: 1, dp: 4 });
    expect(findSuspectGroup([0, 2], dpOnly)).toEqual({ kind: 'node', ranks: [0], nodes: ['node-0'], coveredOutliers: 1 });
  });

  it('rejects a rank the topology does not have', () => {
    expect(() => aggregateRankStacks(new Map([[40, ['a (x.py)']]]), figure7)).toThrow(InputError);
    expect(() => aggregateRankStacks(new Map(), figure7, { externalOutliers: [99] })).toThrow(InputError);
  });

  it('adds external outliers (e.g. from the flight recorder) to the stack outliers', () => {
    const stacks = new Map(range(0, 32).map((rank) => [rank, ['same (x.py)']]));
    const result = aggregateRankStacks(stacks, figure7, { externalOutliers: [31, 30] });
    expect(result.externalOutlierRanks).toEqual([30, 31]);
    expect(result.outlierRanks).toEqual([30, 31]);
    expect(result.evict).toEqual(['node-15']);
  });
});

describe('properties', () => {
  const variants = [GRAD_SYNC, STUCK_IRECV, STUCK_ISEND, STUCK_ALL_GATHER].map(
    (stack) => stacksFromDumps(new Map([[0, rankDump(1, stack)]])).stacks.get(0) ?? [],
  );
  const assignment = fc.array(fc.nat({ max: 3 }), { minLength: 32, maxLength: 32 });

  it('gives the same result whatever order the ranks come in', () => {
    fc.assert(
      fc.property(assignment, fc.array(fc.nat(), { minLength: 32, maxLength: 32 }), (choice, keys) => {
        const entries = range(0, 32).map((rank) => [rank, variants[choice[rank] as number] as readonly string[]] as const);
        const shuffled = entries
          .map((entry, index) => ({ entry, key: keys[index] as number }))
          .sort((a, b) => a.key - b.key)
          .map(({ entry }) => entry);
        expect(aggregateRankStacks(new Map(shuffled), figure7)).toEqual(aggregateRankStacks(new Map(entries), figure7));
      }),
    );
  });

  it("never calls the most common stack of a stage an outlier, keeps outliers to at most half a stage, and evicts the suspect group's machines", () => {
    fc.assert(
      fc.property(assignment, fc.subarray(range(0, 32), { maxLength: 6 }), (choice, missing) => {
        const traced = range(0, 32).filter((rank) => !missing.includes(rank));
        const result = aggregateRankStacks(new Map(traced.map((rank) => [rank, variants[choice[rank] as number] as readonly string[]])), figure7);
        const stageOf = (rank: number) => figure7.placement(rank).coords.pp;
        const jobCount = (variant: number) => traced.filter((rank) => choice[rank] === variant).length;
        for (const stage of [0, 1, 2, 3]) {
          const ranks = traced.filter((rank) => stageOf(rank) === stage);
          const count = (variant: number) => ranks.filter((rank) => choice[rank] === variant).length;
          const [top] = [0, 1, 2, 3].sort((a, b) => count(b) - count(a) || jobCount(b) - jobCount(a));
          const stackOutliers = result.outlierRanks.filter((rank) => ranks.includes(rank));
          for (const rank of ranks) if (choice[rank] === top) expect(stackOutliers).not.toContain(rank);
          expect(stackOutliers.length * 2).toBeLessThanOrEqual(ranks.length);
        }
        expect(result.groups.flatMap((group) => group.ranks).sort((a, b) => a - b)).toEqual(traced);
        expect(result.missingRanks).toEqual([...missing].sort((a, b) => a - b));
        if (result.suspectGroup) {
          expect(result.suspectGroup.coveredOutliers).toBe(result.outlierRanks.length - result.uncoveredOutlierRanks.length);
          expect(result.evict).toEqual(figure7.nodesOf(result.suspectGroup.ranks));
        } else expect(result.outlierRanks).toEqual([]);
      }),
    );
  });

  it('never throws on arbitrary dump text for any rank', () => {
    fc.assert(
      fc.property(fc.array(fc.string({ maxLength: 200 }), { minLength: 1, maxLength: 32 }), (texts) => {
        const result = aggregateStacks(new Map(texts.map((text, rank) => [rank, text])), figure7);
        expect(result.missingRanks.length).toBeGreaterThanOrEqual(32 - texts.length);
      }),
    );
  });
});
