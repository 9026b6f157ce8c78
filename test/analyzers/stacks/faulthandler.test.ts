import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { isFaulthandlerDump, parseFaulthandlerDump, parseStackDump } from '../../../analyzers/stacks/faulthandler.js';
import { aggregateStacks, parsePySpyDump, selectTrainingThread, stacksFromDumps } from '../../../analyzers/stacks/aggregate.js';
import { Topology } from '../../../core/topology.js';

/** Real CPython 3.11 faulthandler output; see the folder's README for how each was made. */
const DIR = 'test/fixtures/realworld/python-faulthandler';
const read = (name: string): string => readFileSync(`${DIR}/${name}`, 'utf8');
const threadIds = (name: string): Record<string, string> =>
  (JSON.parse(read(name.replace('.stacks', '.threads.json'))) as { threads: Record<string, string> }).threads;

const HUNG_MAIN = ['wait', 'wait', 'all_reduce', 'reduce_gradients', 'train_step', 'train', 'main', '<module>'];

describe('parseFaulthandlerDump on real dumps', () => {
  it('reads the two SIGUSR1 dumps of the hung rank as two sections of four threads, frames innermost first', () => {
    const parse = parseFaulthandlerDump(read('hung-rank.stacks'));
    expect(parse.processes).toHaveLength(2);
    const ids = threadIds('hung-rank.stacks');
    for (const section of parse.processes) {
      expect(section.threads.map((thread) => thread.id)).toEqual([ids.checkpoint_writer, ids.pin_memory, ids['steadfast-client'], ids.MainThread]);
      const main = section.threads[3]!;
      expect(main.frames.map((frame) => frame.function)).toEqual(HUNG_MAIN);
      expect(main.frames[0]).toEqual({ function: 'wait', file: '/usr/lib/python3.11/threading.py', line: 320 });
      expect(main.frames[2]).toEqual({
        function: 'all_reduce',
        file: '/work/wt-agentside/test/fixtures/realworld/python-faulthandler/make-dumps.py',
        line: 38,
      });
      expect(main.state).toBe('current');
      expect(section.threads[1]!.frames.map((frame) => frame.function)).toEqual(['wait', 'get', 'pin_memory_loop', 'run', '_bootstrap_inner', '_bootstrap']);
    }
    // Only the client's `# steadfast:` header is not dump text.
    expect(parse.skippedLines).toBe(1);
    expect(parse.detailLines).toBe(0);
  });

  it('names the last thread of each dump MainThread, which the capture shows is the main thread', () => {
    for (const name of ['hung-rank.stacks', 'busy-rank.stacks', 'segfault-rank.stacks']) {
      const parse = parseFaulthandlerDump(read(name));
      const main = threadIds(name).MainThread;
      for (const section of parse.processes) {
        expect(section.threads.filter((thread) => thread.name === 'MainThread').map((thread) => thread.id)).toEqual([main]);
      }
    }
  });

  it('reads the busy rank caught in pure Python, and the segfault report after its "Fatal Python error" line', () => {
    const busy = parseFaulthandlerDump(read('busy-rank.stacks'));
    expect(busy.processes).toHaveLength(2);
    expect(busy.processes[1]!.threads.at(-1)!.frames.map((frame) => frame.function)).toEqual(['matmul', 'forward', 'train_step', 'train', 'main', '<module>']);
    const crash = parseFaulthandlerDump(read('segfault-rank.stacks'));
    expect(crash.processes).toHaveLength(1);
    expect(crash.processes[0]!.threads.at(-1)!.frames.slice(0, 2)).toEqual([
      { function: 'string_at', file: '/usr/lib/python3.11/ctypes/__init__.py', line: 519 },
      { function: 'load_batch', file: '/work/wt-agentside/test/fixtures/realworld/python-faulthandler/make-dumps.py', line: 59 },
    ]);
    expect(crash.skippedLines).toBe(2);
  });

  it('picks the main thread as the training thread, from the newest dump', () => {
    const parse = parseFaulthandlerDump(read('hung-rank.stacks'));
    const chosen = selectTrainingThread(parse);
    expect(chosen?.section).toBe(1);
    expect(chosen?.thread.name).toBe('MainThread');
    expect(chosen?.thread.frames.map((frame) => frame.function)).toEqual(HUNG_MAIN);
  });

  it('is told apart from py-spy output, and each text goes to its own parser', () => {
    const pySpy = read('../py-spy/bigscience_bloom176b_and_ml-engineering_pyspy_dumps.txt');
    expect(isFaulthandlerDump(read('hung-rank.stacks'))).toBe(true);
    expect(isFaulthandlerDump(pySpy)).toBe(false);
    expect(parseStackDump(pySpy)).toEqual(parsePySpyDump(pySpy));
    expect(parseStackDump(read('busy-rank.stacks'))).toEqual(parseFaulthandlerDump(read('busy-rank.stacks')));
  });
});

describe("parseFaulthandlerDump on the format's rarer lines", () => {
  it('keeps ??? for an unknown file, line or function, and counts the frame and thread limits and frameless threads as detail', () => {
    const text = [
      'Thread 0x00007f0000000001 (most recent call first):',
      '  <no Python frame>',
      '',
      'Thread 0x00007f0000000002 (most recent call first):',
      '  File ???, line ??? in ???',
      '  File "/a/b, line 7 in c.py", line 12 in odd "name"',
      '  ...',
      '',
      '...',
    ].join('\n');
    const parse = parseFaulthandlerDump(text);
    expect(parse.processes).toHaveLength(1);
    const [first, second] = parse.processes[0]!.threads;
    expect(first).toMatchObject({ id: '0x00007f0000000001', frames: [], name: null });
    expect(second?.frames).toEqual([
      { function: '???', file: '???', line: null },
      { function: 'odd "name"', file: '/a/b, line 7 in c.py', line: 12 },
    ]);
    // Cut at 100 threads: the main thread may be missing, so no thread is named.
    expect(second?.name).toBeNull();
    expect(parse.detailLines).toBe(3);
  });

  it('reads a single-thread "Stack" dump, and lowercases hex ids so a repeat is seen whatever the case', () => {
    const stack = parseFaulthandlerDump('Stack (most recent call first):\n  File "t.py", line 3 in f\n');
    expect(stack.processes[0]!.threads).toEqual([{ id: 'stack', state: 'current', name: null, frames: [{ function: 'f', file: 't.py', line: 3 }] }]);
    const twice = parseFaulthandlerDump(
      'Thread 0xABC (most recent call first):\n  File "t.py", line 3 in f\n\nThread 0xabc (most recent call first):\n  File "t.py", line 4 in g\n',
    );
    expect(twice.processes).toHaveLength(2);
  });
});

describe('stack aggregation on faulthandler dumps', () => {
  it('groups ranks that dumped the same stack and names the one that did not', () => {
    const hung = read('hung-rank.stacks');
    const busy = read('busy-rank.stacks');
    const dumps = new Map([
      [0, hung],
      [1, hung],
      [2, hung],
      [3, busy],
    ]);
    const { stacks } = stacksFromDumps(dumps);
    expect(stacks.get(0)?.[2]).toBe('all_reduce (realworld/python-faulthandler/make-dumps.py)');
    const topology = Topology.from({ nodes: ['node-0', 'node-1'], ranksPerNode: 2, tp: 1, pp: 1, dp: 4, order: 'tp-pp-dp' });
    const result = aggregateStacks(dumps, topology);
    expect(result.groups.map((group) => ({ ranks: group.ranks, healthy: group.healthy }))).toEqual([
      { ranks: [0, 1, 2], healthy: true },
      { ranks: [3], healthy: false },
    ]);
    expect(result.outlierRanks).toEqual([3]);
    expect(result.evict).toEqual(['node-1']);
  });
});
