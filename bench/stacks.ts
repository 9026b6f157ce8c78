import { cpus, loadavg } from 'node:os';
import { aggregateRankStacks, aggregateStacks, parsePySpyDump, stacksFromDumps } from '../analyzers/stacks/aggregate.js';
import { Topology } from '../core/topology.js';

/**
 * Stack aggregation (ByteRobust §5.1) at the scale of the paper's production jobs: 9,600 GPUs
 * (TP=8 inside each of 1,200 eight-GPU machines, PP=12, DP=100). Every rank's `py-spy dump`
 * text holds a Process / Python header, the training MainThread (~26 Megatron-LM frames, with
 * install prefixes) and three helper threads. Healthy ranks wait in gradient synchronisation,
 * with a stack that differs between the first, middle and last pipeline stages; three machines
 * of one pipeline (24 ranks) hang in irecv / isend / all_gather. Timed in the same run:
 *   - aggregateStacks, end to end from text (the figure the ≤ 300 ms target is about);
 *   - its two halves: stacksFromDumps (parse, pick the thread, normalise) and
 *     aggregateRankStacks (group, pick healthy groups, find the suspect group);
 *   - baseline 1: parsePySpyDump alone, the floor set by reading the text at all;
 *   - baseline 2: naive grouping that compares every pair of stacks frame by frame.
 */

const RUNS = 15;
const WARMUP_RUNS = 3;
const NAIVE_RUNS = 3;
const TARGET_MS = 300;
const PREFIX = '/usr/local/lib/python3.10/dist-packages/';

const LOOP = [
  'forward_backward_pipelining_without_interleaving (megatron/core/pipeline_parallel/schedules.py:1412)',
  'train_step (megatron/training/training.py:1186)',
  'train (megatron/training/training.py:1654)',
  'pretrain (megatron/training/training.py:398)',
  'wrapper (torch/distributed/elastic/multiprocessing/errors/__init__.py:355)',
  'main (pretrain_gpt.py:279)',
  '<module> (pretrain_gpt.py:283)',
];
const COMM = [
  'wait (torch/distributed/distributed_c10d.py:3942)',
  'wrapper (torch/distributed/c10d_logger.py:83)',
  '_coalescing_manager (torch/distributed/distributed_c10d.py:2395)',
  '__exit__ (contextlib.py:142)',
];
const SYNC = [
  'finish_grad_sync (megatron/core/distributed/param_and_grad_buffer.py:512)',
  'finish_grad_sync (megatron/core/distributed/distributed_data_parallel.py:421)',
  'finalize_model_grads (megatron/core/distributed/finalize_model_grads.py:262)',
];
const EMBEDDING = [
  '_allreduce_word_embedding_grads (megatron/core/distributed/finalize_model_grads.py:141)',
  '_allreduce_embedding_grads (megatron/core/distributed/finalize_model_grads.py:170)',
];
const BACKWARD = [
  'run_backward (torch/autograd/graph.py:825)',
  'backward (torch/autograd/__init__.py:347)',
  'backward (torch/_tensor.py:626)',
  'custom_backward (megatron/core/pipeline_parallel/schedules.py:148)',
  'backward_step (megatron/core/pipeline_parallel/schedules.py:366)',
  '_run_1f1b (megatron/core/pipeline_parallel/schedules.py:1350)',
];
const P2P = [
  '_batched_p2p_ops (megatron/core/pipeline_parallel/p2p_communication.py:214)',
  '_communicate (megatron/core/pipeline_parallel/p2p_communication.py:410)',
];

const LAYERNORM = ['_allreduce_layernorm_grads (megatron/core/distributed/finalize_model_grads.py:98)'];
const STAGE_EXTRA = { first: EMBEDDING, middle: [], last: [...LAYERNORM, ...EMBEDDING] } as const;
const healthy = (stage: keyof typeof STAGE_EXTRA): string[] => [...COMM, ...STAGE_EXTRA[stage], ...SYNC, ...BACKWARD.slice(-1), ...LOOP];
const stuckIn = (op: string, caller: string): string[] => [
  `${op} (torch/distributed/distributed_c10d.py:2151)`,
  ...P2P,
  `${caller} (megatron/core/pipeline_parallel/p2p_communication.py:528)`,
  ...BACKWARD,
  ...LOOP,
];
const STUCK_ALL_GATHER = [
  'all_gather_into_tensor (torch/distributed/distributed_c10d.py:3711)',
  '_gather_along_first_dim (megatron/core/tensor_parallel/mappings.py:116)',
  'backward (megatron/core/tensor_parallel/mappings.py:301)',
  'apply (torch/autograd/function.py:307)',
  ...BACKWARD,
  ...LOOP,
];
const HELPERS: Array<[string, string[]]> = [
  [
    'Thread-2 (_pin_memory_loop)',
    [
      'get (queue.py:180)',
      '_pin_memory_loop (torch/utils/data/_utils/pin_memory.py:53)',
      'run (threading.py:982)',
      '_bootstrap_inner (threading.py:1045)',
      '_bootstrap (threading.py:1002)',
    ],
  ],
  [
    'Thread-3 (_write_files_from_queue)',
    [
      'wait (threading.py:324)',
      'get (queue.py:171)',
      '_write_files_from_queue (torch/distributed/checkpoint/filesystem.py:375)',
      'run (threading.py:982)',
      '_bootstrap (threading.py:1002)',
    ],
  ],
  [
    'Thread-4 (_read_thread)',
    [
      '_recv_msg (torch/_inductor/compile_worker/subproc_pool.py:55)',
      '_read_thread (torch/_inductor/compile_worker/subproc_pool.py:191)',
      'run (threading.py:982)',
      '_bootstrap (threading.py:1002)',
    ],
  ],
];

const withPrefix = (frame: string): string => frame.replace(/\((torch|megatron)\//, `(${PREFIX}$1/`);

function rankText(pid: number, main: readonly string[]): string {
  const lines = [
    `Process ${pid}: /usr/bin/python3 -u pretrain_gpt.py --tensor-model-parallel-size 8 --pipeline-model-parallel-size 12`,
    'Python v3.10.12 (/usr/bin/python3.10)',
    '',
    `Thread ${pid} (active): "MainThread"`,
  ];
  for (const frame of main) lines.push(`    ${withPrefix(frame)}`);
  HELPERS.forEach(([name, frames], index) => {
    lines.push(`Thread ${pid + index + 1} (idle): "${name}"`);
    for (const frame of frames) lines.push(`    ${withPrefix(frame)}`);
  });
  return `${lines.join('\n')}\n`;
}

function scenario(): { topology: Topology; dumps: Map<number, string>; stuckNodes: string[]; pipelineNodes: string[] } {
  const nodes = Array.from({ length: 1200 }, (_, index) => `gpu-${String(index).padStart(4, '0')}`);
  const topology = Topology.from({ nodes, ranksPerNode: 8, tp: 8, pp: 12, dp: 100 });
  const faultyReplica = 37;
  const stuck: Record<number, readonly string[]> = {
    5: stuckIn('irecv', 'recv_backward'),
    6: stuckIn('isend', 'send_backward_recv_forward'),
    7: STUCK_ALL_GATHER,
  };
  const dumps = new Map<number, string>();
  for (const { rank, coords } of topology.ranks) {
    const stage = coords.pp === 0 ? 'first' : coords.pp === 11 ? 'last' : 'middle';
    const main = coords.dp === faultyReplica && stuck[coords.pp] ? (stuck[coords.pp] as readonly string[]) : healthy(stage);
    // Through a Buffer, as a file read gives it: one flat string per rank, not a concatenation.
    dumps.set(rank, Buffer.from(rankText(100_000 + rank * 8, main), 'utf8').toString('utf8'));
  }
  const pipeline = topology.group('pp', topology.ranks.find(({ coords }) => coords.dp === faultyReplica && coords.tp === 0)?.rank ?? 0);
  const stuckNodes = topology.nodesOf(pipeline.filter((rank) => [5, 6, 7].includes(topology.placement(rank).coords.pp)));
  return { topology, dumps, stuckNodes, pipelineNodes: topology.nodesOf(pipeline) };
}

/** Baseline: union ranks whose stacks are equal, comparing every pair frame by frame. */
function naivePairwiseGroups(stacks: ReadonlyMap<number, readonly string[]>): number {
  const ranks = [...stacks.keys()];
  const frames = ranks.map((rank) => stacks.get(rank) as readonly string[]);
  const parent = ranks.map((_, index) => index);
  const find = (index: number): number => {
    while (parent[index] !== index) index = parent[index] = parent[parent[index] as number] as number;
    return index;
  };
  for (let a = 0; a < frames.length; a += 1) {
    for (let b = a + 1; b < frames.length; b += 1) {
      const left = frames[a] as readonly string[];
      const right = frames[b] as readonly string[];
      if (left.length === right.length && left.every((frame, index) => frame === right[index])) parent[find(b)] = find(a);
    }
  }
  return new Set(parent.map((_, index) => find(index))).size;
}

interface Figures {
  /** Wall-clock milliseconds. */
  readonly median: number;
  readonly p95: number;
  /** CPU milliseconds of this process (all its threads), median: what the work costs when other jobs share the cores. */
  readonly cpu: number;
}

function timings(run: () => unknown, runs: number, warmups: number): Figures {
  for (let warm = 0; warm < warmups; warm += 1) run();
  const wall: number[] = [];
  const cpu: number[] = [];
  for (let sample = 0; sample < runs; sample += 1) {
    const cpuBefore = process.cpuUsage();
    const started = process.hrtime.bigint();
    run();
    wall.push(Number(process.hrtime.bigint() - started) / 1e6);
    const used = process.cpuUsage(cpuBefore);
    cpu.push((used.user + used.system) / 1e3);
  }
  const median = (values: number[]): number => {
    const sorted = [...values].sort((a, b) => a - b);
    const middle = sorted.length >> 1;
    return sorted.length % 2 === 1 ? (sorted[middle] as number) : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
  };
  const sorted = [...wall].sort((a, b) => a - b);
  return { median: median(wall), p95: sorted[Math.min(sorted.length - 1, Math.ceil(sorted.length * 0.95) - 1)] as number, cpu: median(cpu) };
}

function main(): void {
  const { topology, dumps, stuckNodes, pipelineNodes } = scenario();
  const bytes = [...dumps.values()].reduce((sum, text) => sum + text.length, 0);
  const result = aggregateStacks(dumps, topology);
  const { stacks } = stacksFromDumps(dumps);
  const verdictOk =
    result.suspectGroup?.kind === 'pp' &&
    JSON.stringify(result.evict) === JSON.stringify(pipelineNodes) &&
    stuckNodes.every((node) => result.evict.includes(node)) &&
    result.outlierRanks.length === 24 &&
    naivePairwiseGroups(stacks) === result.groups.length;

  const parseOnly = timings(
    () => {
      for (const text of dumps.values()) parsePySpyDump(text);
    },
    RUNS,
    WARMUP_RUNS,
  );
  const readStacks = timings(() => stacksFromDumps(dumps), RUNS, WARMUP_RUNS);
  const grouping = timings(() => aggregateRankStacks(stacks, topology), RUNS, WARMUP_RUNS);
  const endToEnd = timings(() => aggregateStacks(dumps, topology), RUNS, WARMUP_RUNS);
  const naive = timings(() => naivePairwiseGroups(stacks), NAIVE_RUNS, 1);

  const cpu = cpus()[0]?.model ?? 'unknown CPU';
  const out = (line: string): boolean => process.stdout.write(`${line}\n`);
  out(
    `\nStack aggregation, ${topology.ranks.length} ranks on ${new Set(topology.ranks.map((rank) => rank.node)).size} nodes (TP=8, PP=12, DP=100), ${(bytes / 1e6).toFixed(1)} MB of py-spy text`,
  );
  out(
    `median and p95 of ${RUNS} runs after ${WARMUP_RUNS} warm-up runs (naive baseline: ${NAIVE_RUNS} runs after 1); machine: ${cpus().length} × ${cpu}, Node ${process.version}\n`,
  );
  out('| step | median (ms) | p95 (ms) | CPU median (ms) | vs. parse-only baseline |');
  out('|---|---|---|---|---|');
  const row = (name: string, figures: Figures): boolean =>
    out(
      `| ${name} | ${figures.median.toFixed(1)} | ${figures.p95.toFixed(1)} | ${figures.cpu.toFixed(1)} | ${(figures.median / parseOnly.median).toFixed(2)}× |`,
    );
  row('aggregateStacks, end to end from text', endToEnd);
  row('  stacksFromDumps (parse, pick thread, normalise)', readStacks);
  row('  aggregateRankStacks (group, healthy, suspect group)', grouping);
  row('baseline: parsePySpyDump only', parseOnly);
  row('baseline: naive pairwise grouping of normalised stacks', naive);
  out(`\nnaive pairwise grouping / aggregateRankStacks: ${(naive.median / grouping.median).toFixed(0)}×`);
  out(
    `target ≤ ${TARGET_MS} ms end to end: ${endToEnd.median <= TARGET_MS ? 'met' : 'NOT met'} (median ${endToEnd.median.toFixed(1)} ms, p95 ${endToEnd.p95.toFixed(1)} ms, CPU ${endToEnd.cpu.toFixed(1)} ms)`,
  );
  out(
    `load average while measuring: ${loadavg()
      .map((load) => load.toFixed(1))
      .join(' ')} on ${cpus().length} cores (wall-clock figures stretch when other work shares them)`,
  );
  out(
    `verdict: ${result.groups.length} stack groups, ${result.outlierRanks.length} outliers, suspect ${result.suspectGroup?.kind ?? 'none'} group on ${result.evict.length} nodes — ${verdictOk ? 'as expected' : 'WRONG'}`,
  );
  if (!verdictOk) process.exitCode = 1;
}

main();
