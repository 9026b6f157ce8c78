import { mkdtempSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { planRestore, planRestoreByStep } from '../actuators/restore-plan.js';
import { CHECKPOINT_SHARDS_PER_REPORT, checkpointStepsKept } from '../controller/checkpoint-store.js';
import { JobStore } from '../controller/job-store.js';
import { CHECKPOINT_TIERS, type CheckpointShard } from '../core/checkpoint.js';
import { seededUniform } from '../core/random.js';
import { Keys, workerConnection } from '../core/redis.js';
import { startRedis } from '../tryit/parts.js';
import { ProcessGroup } from '../tryit/processes.js';

/**
 * Time to plan a restore (actuators/restore-plan.ts) against the number of checkpoint copies of
 * one step, for the linear planner and, measured in the same run, the planner it replaced: for
 * each rank it filtered and sorted every copy of the step (copies × ranks). A job of R ranks on
 * R / 8 nodes reports 2R copies of a step (every rank present, so both planners walk every rank;
 * the other copies' ranks, tiers and holders drawn by a seeded generator); R doubles from row to
 * row, and the planner before runs up to 20,000 ranks. Then the largest plan for a job of 4,096 ranks, planned from memory: 64 steps of ranks ×
 * 4 copies, none complete. Last, the same job through the job store on a real Redis, at the most
 * it keeps (16 steps of 16,384 copies): the time of a report of 1,000 copies (and the part of it
 * Redis spends in the job store's script), the Redis bytes of
 * what the job keeps, and a restore plan read a step at a time, with the longest the event loop
 * was held meanwhile.
 */

const RANKS = 4096;
const NODES = 512;
const RANKS_PER_NODE = 8;
const RUNS = 9;
const BEFORE_RUNS = 3;
const BEFORE_MAX_RANKS = 20_000;

function seededCopies(ranks: number, seed: number, step = 10): CheckpointShard[] {
  const next = seededUniform(seed);
  const nodes = ranks / RANKS_PER_NODE;
  return Array.from({ length: 2 * ranks }, (_, index) => {
    const rank = index < ranks ? index : Math.floor(next() * ranks);
    const tier = CHECKPOINT_TIERS[Math.floor(next() * CHECKPOINT_TIERS.length)] ?? 'host';
    return tier === 'remote' ? { step, rank, tier } : { step, rank, tier, holder: `n${Math.floor(next() * nodes)}` };
  });
}

const nodesOf = (ranks: number): Map<number, string> =>
  new Map(Array.from({ length: ranks }, (_, rank) => [rank, `n${Math.floor(rank / RANKS_PER_NODE)}`] as const));

/** The planner before: per rank, every copy of the step filtered, mapped and sorted. */
function quadraticPlan(shards: readonly CheckpointShard[], ranks: number, rankNodes: ReadonlyMap<number, string>): number | undefined {
  const cost = (shard: CheckpointShard, local: boolean): number => {
    if (shard.tier === 'remote') return 5;
    if (local) return { gpu: 0, host: 1, disk: 2, peer: 1 }[shard.tier];
    return shard.tier === 'disk' ? 4 : 3;
  };
  const steps = [...new Set(shards.map((shard) => shard.step))].sort((a, b) => b - a);
  for (const step of steps) {
    const copies = shards.filter((shard) => shard.step === step);
    let complete = true;
    for (let rank = 0; rank < ranks; rank += 1) {
      const node = rankNodes.get(rank);
      const best = copies
        .filter((copy) => copy.rank === rank)
        .map((copy) => ({ copy, local: copy.holder === node }))
        .sort((a, b) => cost(a.copy, a.local) - cost(b.copy, b.local))[0];
      if (!best) {
        complete = false;
        break;
      }
    }
    if (complete) return step;
  }
  return undefined;
}

/** The fastest of `runs` after one warm-up: on a shared machine the least disturbed run is the closest to the planner's own cost. */
function fastestMs(run: () => unknown, runs = RUNS): number {
  run();
  let fastest = Number.POSITIVE_INFINITY;
  for (let sample = 0; sample < runs; sample += 1) {
    const started = process.hrtime.bigint();
    run();
    fastest = Math.min(fastest, Number(process.hrtime.bigint() - started) / 1e6);
  }
  return fastest;
}

async function main(): Promise<void> {
  const cpu = cpus()[0]?.model ?? 'unknown CPU';
  process.stdout.write(
    `\nRestore plan over one step of 2R copies for a job of R ranks, fastest of ${RUNS} runs (the planner before: ${BEFORE_RUNS}) after one warm-up\n`,
  );
  process.stdout.write(`machine: ${cpus().length} × ${cpu}, Node ${process.version}\n\n`);
  process.stdout.write('| ranks | copies | linear planner (ms) | per copy (ns) | planner before (ms) | ratio to the row above |\n|---|---|---|---|---|---|\n');
  const sizes = [5_000, 10_000, 20_000, 40_000, 80_000].map((ranks) => ({ ranks, shards: seededCopies(ranks, ranks), rankNodes: nodesOf(ranks) }));
  // Every size once first, so that the first row does not pay for compiling the planners.
  for (const { ranks, shards, rankNodes } of sizes) planRestore(shards, { ranks, evicted: new Set(), rankNodes });
  let before: number | undefined;
  for (const { ranks, shards, rankNodes } of sizes) {
    const linear = fastestMs(() => planRestore(shards, { ranks, evicted: new Set(), rankNodes }));
    // The planner before takes seconds past 20,000 ranks (copies × ranks); it is not run there.
    const quadratic = ranks <= BEFORE_MAX_RANKS ? fastestMs(() => quadraticPlan(shards, ranks, rankNodes), BEFORE_RUNS) : undefined;
    const ratio = quadratic === undefined || before === undefined ? '—' : `${(quadratic / before).toFixed(2)}×`;
    process.stdout.write(
      `| ${ranks} | ${shards.length} | ${linear.toFixed(2)} | ${((linear * 1e6) / shards.length).toFixed(0)} | ${quadratic === undefined ? 'not run' : quadratic.toFixed(0)} | ${ratio} |\n`,
    );
    before = quadratic;
  }
  process.stdout.write(
    'Per copy, the linear planner levels off once the copies no longer fit the CPU caches; the work it does per copy is constant (test/actuators/restore-plan.test.ts counts it).\n',
  );
  const rankNodes = nodesOf(RANKS);
  // The most a job of this size keeps: 64 steps of ranks × 4 copies; rank 0's copies all lost, so no step is complete.
  const kept = Array.from({ length: 64 }, (_, index) =>
    Array.from({ length: RANKS }, (_, rank) =>
      [0, 1, 2, 3].map((offset) => ({ step: 1000 + index, rank, tier: 'peer' as const, holder: `n${(rank + offset) % NODES}` })),
    ).flat(),
  ).flat();
  const lost = new Set(['n0', 'n1', 'n2', 'n3']);
  const boundMs = fastestMs(() => planRestore(kept, { ranks: RANKS, evicted: lost, rankNodes }));
  process.stdout.write(
    `\n64 steps × ${RANKS} ranks × 4 copies = ${kept.length} copies in memory, no step complete: ${boundMs.toFixed(1)} ms for the whole plan (${(boundMs / 64).toFixed(2)} ms a step).\n`,
  );
  await throughTheStore(rankNodes);
}

/** The job store on a real Redis, at the most it keeps for a job of RANKS ranks. */
async function throughTheStore(rankNodes: ReadonlyMap<number, string>): Promise<void> {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-bench-restore-'));
  const processes = new ProcessGroup();
  try {
    const redis = await startRedis(processes, root, 'redis', undefined, ['--appendonly', 'no']);
    const connection = workerConnection(redis.url);
    const keys = new Keys('bench');
    const jobs = new JobStore(connection, keys);
    const nodes = Array.from({ length: NODES }, (_, index) => `n${index}`);
    await jobs.create({ name: 'big', nodes, ranksPerNode: RANKS / NODES, topology: { tp: 8, pp: 8 }, launcher: 'bench', codeVersion: 'v1' });
    const steps = checkpointStepsKept(RANKS);
    const reportMs: number[] = [];
    const scriptMs: number[] = [];
    // Every command goes to the slow log, with the microseconds Redis spent on it.
    await connection.call('CONFIG', 'SET', 'slowlog-log-slower-than', '0');
    for (let index = 0; index < steps; index += 1) {
      const step = Array.from({ length: RANKS }, (_, rank) =>
        [0, 1, 2, 3].map((offset) => ({ step: 1000 + index, rank, tier: 'peer', holder: `n${(Math.floor(rank / (RANKS / NODES)) + offset) % NODES}` })),
      ).flat();
      for (let from = 0; from + CHECKPOINT_SHARDS_PER_REPORT <= step.length; from += CHECKPOINT_SHARDS_PER_REPORT) {
        await connection.call('SLOWLOG', 'RESET');
        const started = process.hrtime.bigint();
        await jobs.addCheckpoints('big', step.slice(from, from + CHECKPOINT_SHARDS_PER_REPORT));
        reportMs.push(Number(process.hrtime.bigint() - started) / 1e6);
        const logged = (await connection.call('SLOWLOG', 'GET', '16')) as [number, number, number, string[]][];
        scriptMs.push(Math.max(0, ...logged.filter((entry) => String(entry[3][0]).toLowerCase().startsWith('eval')).map((entry) => entry[2] / 1000)));
      }
      await jobs.addCheckpoints('big', step.slice(step.length - (step.length % CHECKPOINT_SHARDS_PER_REPORT)));
    }
    const bytes = Number(await connection.call('MEMORY', 'USAGE', keys.jobCheckpoints('big'), 'SAMPLES', '0'));
    const copies = await connection.zcard(keys.jobCheckpoints('big'));
    const delay = monitorEventLoopDelay({ resolution: 1 });
    delay.enable();
    const started = process.hrtime.bigint();
    const lost = new Set(['n0', 'n1', 'n2', 'n3']);
    const { plan, stepsRead } = await planRestoreByStep(jobs.checkpointSteps('big'), { ranks: RANKS, rankNodes }, async (holders) =>
      holders.filter((holder) => lost.has(holder)),
    );
    const planMs = Number(process.hrtime.bigint() - started) / 1e6;
    delay.disable();
    reportMs.sort((a, b) => a - b);
    scriptMs.sort((a, b) => a - b);
    process.stdout.write(
      `\nThrough the job store (a real Redis): ${steps} steps kept × ${RANKS * 4} copies = ${copies} copies, ${(bytes / 1048576).toFixed(1)} MiB of Redis (${(bytes / copies).toFixed(0)} bytes a copy); ` +
        `a report of ${CHECKPOINT_SHARDS_PER_REPORT} copies ${reportMs[reportMs.length >> 1]?.toFixed(1)} ms, of which Redis ran the script ${scriptMs[scriptMs.length >> 1]?.toFixed(1)} ms (medians of ${reportMs.length}); ` +
        `a plan reading all ${stepsRead} steps (${plan === undefined ? 'none complete' : `step ${plan.step}`}) ${planMs.toFixed(0)} ms, the event loop held at most ${(delay.max / 1e6).toFixed(1)} ms at a time.\n`,
    );
    connection.disconnect();
  } finally {
    await processes.stopAll();
    rmSync(root, { recursive: true, force: true });
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`${String(error)}\n`);
  process.exitCode = 1;
});
