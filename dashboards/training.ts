/**
 * "steadfast / Training job": what the training itself reports through the agent's training
 * collector (Megatron-style logs or the push API) — iteration time per rank, loss, grad norm,
 * throughput — and ETTR, productive time over wall-clock time, the measure steadfast is judged
 * by. The actions annotation marks the incidents.
 */
import { RowBuilder, type Dashboard } from '@grafana/grafana-foundation-sdk/dashboard';
import { RATE_WINDOW, aggregateBy, increase, sumBy } from '../core/promql.js';
import { RANK_LABEL, TRAINING_JOB_LABEL } from '../core/scrape.js';
import { jobSeries, jobVariable, numberPanels, steadfastDashboard } from './frame.js';
import { heatmapPanel, stateTimelinePanel, statPanel, thresholdsRedBelow, thresholdsRedFrom, timeseriesPanel, unit } from './panels.js';

export const TRAINING_UID = 'steadfast-training';
export const TRAINING_TITLE = 'steadfast / Training job';

/** Recording rules (rules/training.yml): 1 while the job makes progress, else 0; and its 1-hour mean. */
export const PRODUCTIVE_RULE = `${TRAINING_JOB_LABEL}:steadfast_training_productive:bool`;
export const ETTR_1H_RULE = `${TRAINING_JOB_LABEL}:steadfast_training_ettr:avg1h`;

const JOB = [TRAINING_JOB_LABEL] as const;
const JOB_LEGEND = `{{${TRAINING_JOB_LABEL}}}`;
const RANK = [TRAINING_JOB_LABEL, RANK_LABEL] as const;
const RANK_LEGEND = `{{${TRAINING_JOB_LABEL}}} rank {{${RANK_LABEL}}}`;
/** ETTR below this is shown red. ByteRobust's evaluation keeps cumulative ETTR up to 97 % over three months on 9,600 GPUs. */
const ETTR_TARGET = 0.9;

// ---- ETTR ----------------------------------------------------------------------------------

export function ettrOverRangeStat() {
  return statPanel({
    title: 'ETTR over the time range',
    description:
      'Effective training time ratio over the dashboard time range: the share of rule evaluations at which the job was productive. Time the job reported nothing at all is not counted.',
    unit: unit.ratio,
    queries: [{ expr: `avg_over_time(${jobSeries(PRODUCTIVE_RULE)}[$__range])`, legend: JOB_LEGEND, instant: true }],
    width: 6,
  })
    .min(0)
    .max(1)
    .thresholds(thresholdsRedBelow(ETTR_TARGET));
}

export function ettrWindowPanel() {
  return timeseriesPanel({
    title: 'ETTR, 1-hour window',
    description: 'Productive time over wall-clock time in the hour before each point.',
    unit: unit.ratio,
    queries: [{ expr: jobSeries(ETTR_1H_RULE), legend: JOB_LEGEND }],
    width: 18,
  })
    .min(0)
    .max(1)
    .thresholds(thresholdsRedBelow(ETTR_TARGET));
}

export function productiveTimeline() {
  return stateTimelinePanel({
    title: 'Productive',
    description: 'Whether each job was making progress; the steadfast actions annotation shows what was done about each stall.',
    unit: unit.bool,
    queries: [{ expr: jobSeries(PRODUCTIVE_RULE), legend: JOB_LEGEND }],
    states: [
      { value: 1, text: 'productive', color: 'green' },
      { value: 0, text: 'stalled', color: 'red' },
    ],
    width: 24,
    height: 5,
  });
}

// ---- Iterations ----------------------------------------------------------------------------

export function iterationTimeHeatmap() {
  return heatmapPanel({
    title: 'Iteration time per rank',
    description:
      'Seconds per iteration as each rank last reported it, one row per rank: a fail-slow GPU or link is one bright row, a slow job a bright column.',
    unit: unit.seconds,
    queries: [{ expr: aggregateBy('max', RANK, jobSeries('steadfast_training_iteration_seconds')), legend: RANK_LEGEND }],
    rowLabel: 'rank',
    width: 24,
    height: 10,
  });
}

export function iterationTimeSpreadPanel() {
  const perRank = jobSeries('steadfast_training_iteration_seconds');
  return timeseriesPanel({
    title: 'Iteration time: median and slowest rank',
    description: 'Median and slowest rank per job; a widening gap is a straggler.',
    unit: unit.seconds,
    queries: [
      { expr: `quantile by (${TRAINING_JOB_LABEL}) (0.5, ${perRank})`, legend: `${JOB_LEGEND} median` },
      { expr: aggregateBy('max', JOB, perRank), legend: `${JOB_LEGEND} slowest` },
    ],
  });
}

export function sinceLastIterationPanel() {
  return timeseriesPanel({
    title: 'Seconds since the last iteration',
    description: 'Per rank, how long ago it last reported an iteration: one rank far behind the others is hung.',
    unit: unit.seconds,
    queries: [{ expr: `time() - ${aggregateBy('max', RANK, jobSeries('steadfast_training_last_iteration_timestamp_seconds'))}`, legend: RANK_LEGEND }],
  });
}

// ---- Numerics ------------------------------------------------------------------------------

export function lossPanel() {
  return timeseriesPanel({
    title: 'Loss',
    description: 'Last reported loss per job and loss name, averaged over the ranks that report it; NaN shows as a gap.',
    unit: unit.count,
    queries: [{ expr: aggregateBy('avg', [...JOB, 'loss'], jobSeries('steadfast_training_loss')), legend: `${JOB_LEGEND} {{loss}}` }],
  });
}

export function gradNormPanel() {
  return timeseriesPanel({
    title: 'Gradient norm',
    description: 'Last reported gradient norm per job (the largest over its ranks); a spike of ×5 precedes many blow-ups.',
    unit: unit.count,
    queries: [{ expr: aggregateBy('max', JOB, jobSeries('steadfast_training_grad_norm')), legend: JOB_LEGEND }],
  });
}

export function badIterationsPanel() {
  return timeseriesPanel({
    title: 'Skipped and NaN iterations',
    description: `Iterations skipped (fp16 overflow) and iterations with a NaN loss over ${RATE_WINDOW}, per job.`,
    unit: unit.count,
    queries: [
      { expr: sumBy(JOB, increase(jobSeries('steadfast_training_skipped_iterations_total'))), legend: `${JOB_LEGEND} skipped` },
      { expr: sumBy(JOB, increase(jobSeries('steadfast_training_nan_iterations_total'))), legend: `${JOB_LEGEND} NaN` },
    ],
  }).thresholds(thresholdsRedFrom(1));
}

export function trainingErrorsPanel() {
  return timeseriesPanel({
    title: 'Failures in the training logs',
    description: `NCCL timeouts and errors, CUDA errors and failed children found in the logs over ${RATE_WINDOW}, per job and kind.`,
    unit: unit.count,
    queries: [{ expr: sumBy([...JOB, 'kind'], increase(jobSeries('steadfast_training_errors_total'))), legend: `${JOB_LEGEND} {{kind}}` }],
  });
}

// ---- Throughput ----------------------------------------------------------------------------

export function throughputPanel() {
  return timeseriesPanel({
    title: 'Throughput',
    description: 'Samples per second as the job reports it (Megatron logs the job-wide figure, so ranks are not summed).',
    unit: unit.perSecond,
    queries: [{ expr: aggregateBy('max', JOB, jobSeries('steadfast_training_samples_per_second')), legend: JOB_LEGEND }],
  });
}

export function tflopsPanel() {
  const perRank = jobSeries('steadfast_training_tflops_per_gpu');
  return timeseriesPanel({
    title: 'TFLOP/s per GPU',
    description: 'Model TFLOP/s per GPU: the mean over ranks and the lowest rank.',
    unit: unit.tflops,
    queries: [
      { expr: aggregateBy('avg', JOB, perRank), legend: `${JOB_LEGEND} mean` },
      { expr: aggregateBy('min', JOB, perRank), legend: `${JOB_LEGEND} lowest rank` },
    ],
  });
}

export function trainingDashboard(): Dashboard {
  const builder = steadfastDashboard({
    uid: TRAINING_UID,
    title: TRAINING_TITLE,
    description: 'A training job: ETTR, iteration time per rank, loss, grad norm, throughput; steadfast actions as annotations.',
  })
    .withVariable(jobVariable('steadfast_training_iteration'))
    .withRow(new RowBuilder('ETTR'))
    .withPanel(ettrOverRangeStat())
    .withPanel(ettrWindowPanel())
    .withPanel(productiveTimeline())
    .withRow(new RowBuilder('Iterations'))
    .withPanel(iterationTimeHeatmap())
    .withPanel(iterationTimeSpreadPanel())
    .withPanel(sinceLastIterationPanel())
    .withRow(new RowBuilder('Numerics'))
    .withPanel(lossPanel())
    .withPanel(gradNormPanel())
    .withPanel(badIterationsPanel())
    .withPanel(trainingErrorsPanel())
    .withRow(new RowBuilder('Throughput'))
    .withPanel(throughputPanel())
    .withPanel(tflopsPanel());
  return numberPanels(builder.build());
}
