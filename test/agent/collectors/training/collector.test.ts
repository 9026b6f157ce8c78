import { appendFileSync, copyFileSync, mkdirSync, mkdtempSync, readdirSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { InputError } from '../../../../core/errors.js';
import type { AgentResponse, Collector } from '../../../../agent/collector.js';
import type { CollectorSettings } from '../../../../agent/flags.js';
import {
  createTrainingCollector,
  parseTrainingLogFlags,
  trainingCollectorFactory,
  TRAINING_ROUTE_PATH,
} from '../../../../agent/collectors/training/collector.js';
import { EXPECTED, REALWORLD, expectMatchesAndLints, scrapeOne, seriesValue, testContext, waitFor, type TestContext } from '../../helpers.js';

// Megatron timestamps are read as the node's local time; pin it so the expected files hold everywhere.
process.env.TZ = 'UTC';

const FOLLOW_MS = 20;
const QUIET_MS = 60;
const NOW = new Date('2024-06-01T12:00:00.000Z');
/** Last change of a log file present at start: lines without their own timestamp were written by then. */
const WRITTEN = new Date('2024-06-01T11:00:00.000Z');
const MEGATRON_LOGS = join(REALWORLD, 'megatron-logs');
const NCCL_TORCH_ERRORS = join(REALWORLD, 'nccl-torch-errors');
const SAMPLES = [
  ...readdirSync(MEGATRON_LOGS)
    .filter((name) => /\.(out|txt)$/.test(name))
    .map((name) => join(MEGATRON_LOGS, name)),
  ...readdirSync(NCCL_TORCH_ERRORS)
    .filter((name) => name.endsWith('.txt'))
    .map((name) => join(NCCL_TORCH_ERRORS, name)),
];

const ITERATION_LINE = (iteration: number, loss: string): string =>
  ` iteration ${String(iteration).padStart(8)}/    1000 | consumed samples:  ${iteration * 4} | elapsed time per iteration (ms): 1500.0 | learning rate: 1.000E-04 | global batch size:     4 | lm loss: ${loss} | loss scale: 1.0 | grad norm: 0.500 | number of skipped iterations:   0 | number of nan iterations:   ${loss === 'nan' ? 1 : 0} |\n`;
const WATCHDOG = (rank: number): string =>
  `[rank${rank}]:[E816 01:45:40.183009389 ProcessGroupNCCL.cpp:607] [Rank ${rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=80078, OpType=ALLREDUCE, NumelIn=5056, NumelOut=5056, Timeout(ms)=600000) ran for 600026 milliseconds before timing out.\n`;
const SUMMARY_HEAD =
  'torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n' +
  '============================================================\n' +
  'pretrain_gpt.py FAILED\n' +
  '------------------------------------------------------------\n' +
  'Failures:\n' +
  '[1]:\n' +
  '  time      : 2024-07-26_10:59:45\n' +
  '  host      : gpu-3\n' +
  '  rank      : 13 (local_rank: 5)\n' +
  '  exitcode  : -6 (pid: 2001)\n' +
  '  error_file: <N/A>\n' +
  '  traceback : Signal 6 (SIGABRT) received by PID 2001\n';
const SUMMARY_TAIL =
  '------------------------------------------------------------\n' +
  'Root Cause (first observed failure):\n' +
  '[0]:\n' +
  '  time      : 2024-07-26_10:59:45\n' +
  '  host      : gpu-3\n' +
  '  rank      : 10 (local_rank: 2)\n' +
  '  exitcode  : -6 (pid: 1998)\n' +
  '  error_file: <N/A>\n' +
  '  traceback : Signal 6 (SIGABRT) received by PID 1998\n' +
  '============================================================\n';

let dir: string;
const open: Collector[] = [];

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'steadfast-training-'));
});

afterEach(async () => {
  await Promise.all(open.splice(0).map((collector) => collector.close()));
  rmSync(dir, { recursive: true, force: true });
});

function training(settings: CollectorSettings, clock: () => Date = () => NOW): { collector: Collector; context: TestContext } {
  const context = testContext({}, 5, settings);
  const collector = createTrainingCollector(context, { followIntervalMs: FOLLOW_MS, reportQuietMs: QUIET_MS, clock });
  open.push(collector);
  return { collector, context };
}

async function value(context: TestContext, series: string): Promise<number | undefined> {
  return seriesValue(await context.registry.metrics(), series);
}

function post(collector: Collector, body: unknown): Promise<AgentResponse> {
  const route = collector.routes?.find((candidate) => candidate.path === TRAINING_ROUTE_PATH);
  if (!route) throw new Error('no training route');
  return route.handle({ method: 'POST', path: TRAINING_ROUTE_PATH, query: new URLSearchParams(), body });
}

describe('training collector exposition', () => {
  it.each(SAMPLES.map((path) => [basename(path), path]))(
    'exports %s, followed from its start, exactly as the expected file, which promtool accepts',
    async (name, path) => {
      const job = name.replace(/\.[a-z]+$/, '');
      // A copy, so that its modification time is fixed.
      const log = join(dir, name);
      copyFileSync(path, log);
      utimesSync(log, WRITTEN, WRITTEN);
      const { collector, context } = training({ 'training.log': [`${job}=${log}`] });
      const text = await scrapeOne(context, collector);
      expect(text).toContain('steadfast_collector_success{collector="training"} 1');
      await expectMatchesAndLints(join(EXPECTED, 'training', `${job}.prom`), text);
      // Failures already in the file at start are counted, never sent on the fast path.
      expect(context.events).toEqual([]);
    },
  );

  it('exports no series at all without configuration, and serves its push endpoint', async () => {
    const { collector, context } = training({});
    await collector.start();
    await collector.update();
    expect(await context.registry.metrics()).not.toMatch(/^steadfast_training_\w+\{/m);
    expect(collector.routes?.map((route) => `${route.method} ${route.path}`)).toEqual(['POST /api/v1/training']);
  });
});

describe('training collector following a log', () => {
  it('sees appended iteration lines, NaN loss included, under the rank the flag names', async () => {
    const log = join(dir, 'train.log');
    writeFileSync(log, ITERATION_LINE(10, '2.500000E+00'));
    const { collector, context } = training({ 'training.log': `gpt:7=${log}` });
    utimesSync(log, WRITTEN, WRITTEN);
    await collector.start();
    expect(await value(context, 'steadfast_training_iteration{training_job="gpt",rank="7"}')).toBe(10);
    expect(await value(context, 'steadfast_training_loss{training_job="gpt",rank="7",loss="lm_loss"}')).toBe(2.5);
    // Present at start, the line was written by the file's last change; an appended one arrives now.
    expect(await value(context, 'steadfast_training_last_iteration_timestamp_seconds{training_job="gpt",rank="7"}')).toBe(WRITTEN.getTime() / 1000);

    appendFileSync(log, ITERATION_LINE(20, 'nan'));
    await waitFor(async () => (await value(context, 'steadfast_training_iteration{training_job="gpt",rank="7"}')) === 20);
    expect(await value(context, 'steadfast_training_last_iteration_timestamp_seconds{training_job="gpt",rank="7"}')).toBe(NOW.getTime() / 1000);
    expect(await value(context, 'steadfast_training_loss{training_job="gpt",rank="7",loss="lm_loss"}')).toBeNaN();
    expect(await value(context, 'steadfast_training_iterations_total{training_job="gpt",rank="7"}')).toBe(2);
    expect(await value(context, 'steadfast_training_nan_iterations_total{training_job="gpt",rank="7"}')).toBe(1);
    expect(await value(context, 'steadfast_training_iteration_seconds{training_job="gpt",rank="7"}')).toBe(1.5);
  });

  it('sends appended watchdog timeouts and torchrun summaries once each, but none of those already in the file at start', async () => {
    const log = join(dir, 'train.log');
    writeFileSync(log, ITERATION_LINE(10, '2.5') + WATCHDOG(5) + SUMMARY_HEAD + SUMMARY_TAIL);
    const { collector, context } = training({ 'training.log': `gpt=${log}` });
    await collector.start();
    expect(context.events).toEqual([]);
    expect(await value(context, 'steadfast_training_errors_total{training_job="gpt",rank="0",kind="nccl_timeout"}')).toBe(1);
    expect(await value(context, 'steadfast_training_errors_total{training_job="gpt",rank="0",kind="child_failed"}')).toBe(1);

    appendFileSync(log, WATCHDOG(3));
    await waitFor(() => context.events.length === 1);
    expect(context.events[0]).toEqual({
      kind: 'nccl_timeout',
      node: 'node-1',
      job: 'gpt',
      rank: 3,
      message:
        'rank 3: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=80078, OpType=ALLREDUCE, NumelIn=5056, NumelOut=5056, Timeout(ms)=600000) ran for 600026 milliseconds before timing out.',
      time: NOW.toISOString(),
    });

    // A summary written in two pieces is still one report.
    appendFileSync(log, SUMMARY_HEAD);
    await new Promise((resolve) => setTimeout(resolve, FOLLOW_MS * 2));
    appendFileSync(log, SUMMARY_TAIL);
    await waitFor(() => context.events.length === 2);
    await new Promise((resolve) => setTimeout(resolve, QUIET_MS * 2));
    expect(context.events).toHaveLength(2);
    expect(context.events[1]).toMatchObject({ kind: 'worker_failed', job: 'gpt', rank: 10 });
    expect(context.events[1]?.message).toBe(
      'ChildFailedError: pretrain_gpt.py failed; root cause rank 10 (local_rank 2) exitcode -6 on gpu-3; also failed: rank 13 (local_rank 5) exitcode -6 on gpu-3; Signal 6 (SIGABRT) received by PID 1998',
    );
    expect(await value(context, 'steadfast_training_errors_total{training_job="gpt",rank="0",kind="nccl_timeout"}')).toBe(2);
    expect(await value(context, 'steadfast_training_errors_total{training_job="gpt",rank="0",kind="child_failed"}')).toBe(2);
  });

  it("reports a torchrun agent failure line that no summary follows once the log goes quiet, under the log's rank", async () => {
    const log = join(dir, 'train.log');
    writeFileSync(log, '');
    const { collector, context } = training({ 'training.log': `gpt:4=${log}` });
    await collector.start();
    appendFileSync(
      log,
      'E0801 13:23:20.000000 32974 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 3 (pid: 33054) of binary: /usr/bin/python3\n',
    );
    await waitFor(() => context.events.length === 1);
    expect(context.events[0]).toMatchObject({
      kind: 'worker_failed',
      job: 'gpt',
      rank: 4,
      message: 'torchrun worker failed (binary /usr/bin/python3); failed: local_rank 3 exitcode 1',
    });
  });

  it('waits without failing while a log does not exist yet, and fails the scrape when the path cannot be read as a log', async () => {
    const notYet = join(dir, 'not-yet.log');
    const notALog = join(dir, 'a-directory');
    mkdirSync(notALog);
    const { collector, context } = training({ 'training.log': [`a=${notYet}`, `b=${notALog}`] });
    await collector.start();
    await expect(collector.update()).rejects.toThrow(`cannot read training log ${notALog} (job b)`);
    expect(await context.registry.metrics()).not.toContain('training_job="a"');
    writeFileSync(notYet, ITERATION_LINE(1, '9.0'));
    await waitFor(async () => (await value(context, 'steadfast_training_iteration{training_job="a",rank="0"}')) === 1);
  });
});

describe('training collector flags', () => {
  it('declares its two flags, the log one repeatable', () => {
    expect(trainingCollectorFactory.flags?.map((flag) => [flag.name, flag.repeatable ?? false, flag.default])).toEqual([
      ['training.log', true, undefined],
      ['training.max-jobs', false, '64'],
    ]);
  });

  it('reads <job>=<file> with rank 0 and <job>:<rank>=<file>, and refuses malformed values naming the flag', () => {
    expect(parseTrainingLogFlags(['gpt=/logs/a.log', 'bert:012=/logs/b=c.log'])).toEqual([
      { job: 'gpt', rank: '0', path: '/logs/a.log' },
      { job: 'bert', rank: '12', path: '/logs/b=c.log' },
    ]);
    for (const bad of ['no-equals', 'bad job=/x', 'gpt:x=/x', 'gpt=']) {
      expect(() => parseTrainingLogFlags([bad])).toThrow(InputError);
    }
    expect(() => parseTrainingLogFlags(['gpt=/a', 'gpt:0=/b'])).toThrow('job gpt rank 0 is given twice');
    expect(() => training({ 'training.max-jobs': '0' })).toThrow('--training.max-jobs');
  });
});

describe('POST /api/v1/training', () => {
  const step = {
    job: 'llama',
    rank: 0,
    iteration: 100,
    iteration_seconds: 1.25,
    loss: 2.5,
    grad_norm: 0.75,
    loss_scale: 65536,
    learning_rate: 3e-4,
    samples_per_second: 410.5,
    tflops_per_gpu: 180.2,
    skipped: 1,
    nan: 0,
  };

  it('accepts a step with 202 and exports every field it carries', async () => {
    const { collector, context } = training({});
    expect(await post(collector, step)).toEqual({ status: 202, body: { accepted: 1 } });
    const text = await context.registry.metrics();
    const labels = '{training_job="llama",rank="0"}';
    expect(seriesValue(text, `steadfast_training_iteration${labels}`)).toBe(100);
    expect(seriesValue(text, `steadfast_training_iteration_seconds${labels}`)).toBe(1.25);
    expect(seriesValue(text, 'steadfast_training_loss{training_job="llama",rank="0",loss="loss"}')).toBe(2.5);
    expect(seriesValue(text, `steadfast_training_grad_norm${labels}`)).toBe(0.75);
    expect(seriesValue(text, `steadfast_training_loss_scale${labels}`)).toBe(65536);
    expect(seriesValue(text, `steadfast_training_learning_rate${labels}`)).toBe(3e-4);
    expect(seriesValue(text, `steadfast_training_samples_per_second${labels}`)).toBe(410.5);
    expect(seriesValue(text, `steadfast_training_tflops_per_gpu${labels}`)).toBe(180.2);
    expect(seriesValue(text, `steadfast_training_skipped_iterations_total${labels}`)).toBe(1);
    expect(seriesValue(text, `steadfast_training_nan_iterations_total${labels}`)).toBe(0);
    expect(seriesValue(text, `steadfast_training_last_iteration_timestamp_seconds${labels}`)).toBe(NOW.getTime() / 1000);
  });

  it('names the pushed job in training_job, so that a push named like a scrape job takes no `job` label', async () => {
    const { collector, context } = training({});
    expect(await post(collector, { ...step, job: 'steadfast-controller' })).toEqual({ status: 202, body: { accepted: 1 } });
    const text = await context.registry.metrics();
    expect(seriesValue(text, 'steadfast_training_iteration{training_job="steadfast-controller",rank="0"}')).toBe(100);
    expect(text).not.toMatch(/[{,]job="/);
  });

  it('accepts an array of steps, named losses normalised and "nan" as NaN', async () => {
    const { collector, context } = training({});
    const response = await post(collector, [
      { job: 'moe', rank: 3, iteration: 1, loss: { 'lm loss': 3.5, load_balancing_loss: 0.01 } },
      { job: 'moe', rank: 3, iteration: 2, loss: { 'lm loss': 'nan' }, nan: 1 },
    ]);
    expect(response).toEqual({ status: 202, body: { accepted: 2 } });
    expect(await value(context, 'steadfast_training_loss{training_job="moe",rank="3",loss="lm_loss"}')).toBeNaN();
    expect(await value(context, 'steadfast_training_loss{training_job="moe",rank="3",loss="load_balancing_loss"}')).toBe(0.01);
    expect(await value(context, 'steadfast_training_iterations_total{training_job="moe",rank="3"}')).toBe(2);
  });

  it('answers 400 naming the bad field, and applies nothing of a batch with one bad step', async () => {
    const { collector, context } = training({});
    const single = await post(collector, { ...step, iteration: -1 });
    expect(single.status).toBe(400);
    expect(JSON.stringify(single.body)).toContain('iteration: ');
    const typo = await post(collector, { ...step, losss: 1 });
    expect(typo.status).toBe(400);
    expect(JSON.stringify(typo.body)).toContain('losss');
    const batch = await post(collector, [step, { ...step, loss: 'low' }]);
    expect(batch.status).toBe(400);
    expect(JSON.stringify(batch.body)).toContain('[1].loss: ');
    expect(await context.registry.metrics()).not.toContain('training_job="llama"');
    expect((await post(collector, undefined)).status).toBe(400);
    expect((await post(collector, [])).status).toBe(400);
  });

  it('holds a (job, rank) to 16 loss names over all its pushes, so 2,000 pushes of new names make 16 series, not 32,000', async () => {
    const { collector, context } = training({});
    const answers = [];
    for (let index = 0; index < 2000; index += 1)
      answers.push((await post(collector, { job: 'a', rank: 0, iteration: index, loss: { [`l${index}`]: 1, [`m${index}`]: 2 } })).status);
    expect(answers.slice(0, 8)).toEqual(Array(8).fill(202));
    expect(answers.slice(8).every((status) => status === 400)).toBe(true);
    const refused = await post(collector, { job: 'a', rank: 0, iteration: 2001, loss: { fresh: 1 } });
    expect(JSON.stringify(refused.body)).toContain('at most 16 loss names per (job, rank); a rank 0 has 16 already and this push would make 17');
    // The names it has keep working; another rank has its own 16.
    expect((await post(collector, { job: 'a', rank: 0, iteration: 2002, loss: { l0: 0.5 } })).status).toBe(202);
    expect((await post(collector, { job: 'a', rank: 1, iteration: 1, loss: { fresh: 1 } })).status).toBe(202);
    const text = await scrapeOne(context, collector);
    expect(text.split('\n').filter((line) => line.startsWith('steadfast_training_loss{')).length).toBe(17);
  });

  it('answers 429 once --training.max-jobs distinct (job, rank) series have pushed, still takes the known ones, and frees the place of one idle for an hour', async () => {
    let now = NOW;
    const { collector } = training({ 'training.max-jobs': '2' }, () => now);
    expect((await post(collector, { job: 'a', rank: 0, iteration: 1 })).status).toBe(202);
    expect((await post(collector, { job: 'a', rank: 1, iteration: 1 })).status).toBe(202);
    const refused = await post(collector, { job: 'b', rank: 0, iteration: 1 });
    expect(refused.status).toBe(429);
    expect(JSON.stringify(refused.body)).toContain('at most 2 (job, rank) pairs');
    expect(
      (
        await post(collector, [
          { job: 'a', rank: 0, iteration: 2 },
          { job: 'a', rank: 1, iteration: 2 },
        ])
      ).status,
    ).toBe(202);

    now = new Date(NOW.getTime() + 30 * 60 * 1000);
    expect((await post(collector, { job: 'a', rank: 1, iteration: 3 })).status).toBe(202);
    now = new Date(NOW.getTime() + 61 * 60 * 1000);
    // a/0 has been idle for 61 minutes, a/1 for 31: only a/0 makes way.
    expect((await post(collector, { job: 'b', rank: 0, iteration: 1 })).status).toBe(202);
    expect((await post(collector, { job: 'c', rank: 0, iteration: 1 })).status).toBe(429);
  });
});

describe('training progress on the fast path', () => {
  const progressEvents = (context: TestContext): unknown[] => context.events.filter((event) => event.kind === 'training_progress');

  it('tells the controller when a rank starts or resumes training, then at most once a minute while it trains', async () => {
    let now = NOW.getTime();
    const { collector, context } = training({}, () => new Date(now));
    const push = async (rank: number, iteration: number): Promise<void> => {
      expect((await post(collector, { job: 'llama', rank, iteration })).status).toBe(202);
    };
    await push(0, 100);
    // Another rank of the same relaunch a moment later: the first report speaks for both.
    now += 200;
    await push(1, 100);
    expect(progressEvents(context)).toEqual([
      { kind: 'training_progress', node: 'node-1', job: 'llama', rank: 0, iteration: 100, message: 'rank 0 trains at iteration 100', time: NOW.toISOString() },
    ]);
    // An iteration a second: the next report a minute after the first.
    for (let iteration = 101; iteration <= 159; iteration += 1) {
      now += 1000;
      await push(0, iteration);
    }
    expect(progressEvents(context)).toHaveLength(1);
    now += 1000;
    await push(0, 160);
    expect(progressEvents(context)).toHaveLength(2);
    expect(progressEvents(context)[1]).toMatchObject({ rank: 0, iteration: 160, message: 'rank 0 at iteration 160' });
    // Relaunched from the checkpoint at 150: the iteration goes back, reported at once.
    now += 5_000;
    await push(0, 151);
    expect(progressEvents(context)[2]).toMatchObject({
      rank: 0,
      iteration: 151,
      message: 'rank 0 resumed at iteration 151',
      time: new Date(now).toISOString(),
    });
    // Stalled 10 s or more, then on again (a relaunch resumed from the newest step): at once too.
    now += 12_000;
    await push(0, 152);
    expect(progressEvents(context)).toHaveLength(4);
  });

  it('reports an iteration line appended to a followed log, but none of the lines already there at start', async () => {
    const log = join(dir, 'train.log');
    writeFileSync(log, ITERATION_LINE(10, '2.5') + ITERATION_LINE(20, '2.4'));
    const { collector, context } = training({ 'training.log': `gpt:3=${log}` });
    await collector.start();
    expect(progressEvents(context)).toEqual([]);
    appendFileSync(log, ITERATION_LINE(21, '2.3'));
    await waitFor(() => progressEvents(context).length === 1);
    expect(progressEvents(context)[0]).toMatchObject({ kind: 'training_progress', job: 'gpt', rank: 3, iteration: 21 });
  });
});
