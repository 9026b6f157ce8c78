import { FAULT_CITATIONS } from '../../core/ladder.js';
import { agentSelector } from '../../core/promql.js';
import { CLUSTER_LABEL, TRAINING_JOB_LABEL } from '../../core/scrape.js';
import type { TrainingErrorKind } from '../../agent/sources/training-log-failures.js';
import { alert, humanDuration, record, type DomainRules, type RuleGroup } from '../spec.js';
import type { Thresholds } from '../thresholds.js';

/**
 * Training progress and numerics, from the agent's training collector: steadfast_training_*
 * {training_job, rank}, scraped under the agents' own scrape job like every other agent series.
 * Recording rules are named after the labels they keep (`training_job:…`); they keep `cluster`
 * too, where the series have one, so that one Prometheus can hold several clusters' jobs.
 */

export const ITERATION_MEDIAN = `${TRAINING_JOB_LABEL}:steadfast_training_iteration_seconds:median`;
export const ITERATION_RATIO_TO_MEDIAN = `${TRAINING_JOB_LABEL}_rank:steadfast_training_iteration_seconds:ratio_to_median`;
export const PRODUCTIVE = `${TRAINING_JOB_LABEL}:steadfast_training_productive:bool`;
export const ETTR_HOUR = `${TRAINING_JOB_LABEL}:steadfast_training_ettr:avg1h`;
export const ETTR_MONTH = `${TRAINING_JOB_LABEL}:steadfast_training_ettr:avg30d`;

/** Failures that stop a job outright (a collective timed out, torchrun lost a worker). */
const WORKER_FAILURES: readonly TrainingErrorKind[] = ['nccl_timeout', 'child_failed'];

const RANK = `rank {{ $labels.rank }} of training job {{ $labels.${TRAINING_JOB_LABEL} }} on node {{ $labels.node }}`;
const RANK_SENTENCE = `R${RANK.slice(1)}`;

const percentAbove = (ratio: number) => `${Math.round((ratio - 1) * 100)}%`;

function groups(t: Thresholds): RuleGroup[] {
  const training = t.training;
  const recentLevel = (metric: string) => `avg_over_time(${metric}[${training.baselineWindow}] offset ${training.baselineOffset})`;
  const agent = (metric: string, matchers: Parameters<typeof agentSelector>[0] = {}) => `${metric}${agentSelector(matchers, t.selectors.agentJob)}`;
  const rankProcesses = agent('steadfast_training_processes', { role: 'rank' });
  const jobLabels = `${CLUSTER_LABEL}, ${TRAINING_JOB_LABEL}`;
  const byJob = `by (${jobLabels})`;

  return [
    {
      name: 'steadfast-training',
      rules: [
        // Synchronous training runs at the pace of its slowest rank; the median across ranks is
        // the job's pace, and a rank's ratio to it points at a straggler (Greyhound, 004).
        record({
          record: ITERATION_MEDIAN,
          expr: `quantile ${byJob} (0.5, ${agent('steadfast_training_iteration_seconds')})`,
        }),
        record({
          record: ITERATION_RATIO_TO_MEDIAN,
          expr: `${agent('steadfast_training_iteration_seconds')}\n/ on (${jobLabels}) group_left ()\n${ITERATION_MEDIAN}`,
        }),

        // ETTR (ByteRobust, 000): productive time over wall-clock time. A job is productive while
        // some rank reported an iteration within noProgressSeconds, the same bound past which
        // SteadfastTrainingStalled fires; a stall therefore costs ETTR only beyond that bound.
        record({
          record: PRODUCTIVE,
          expr: `max ${byJob} (\n  time() - ${agent('steadfast_training_last_iteration_timestamp_seconds')} <= bool ${training.noProgressSeconds}\n)`,
        }),
        record({
          record: ETTR_HOUR,
          expr: `avg_over_time(${PRODUCTIVE}[1h])`,
        }),
        // The mean of the hourly ETTRs over the job's life, up to 30 days: each hourly value
        // covers the hour before it, so one sample per hour tiles the month at 720 points
        // instead of re-reading every raw sample.
        record({
          record: ETTR_MONTH,
          expr: `avg_over_time(${ETTR_HOUR}[30d:1h])`,
        }),

        // ByteRobust (000, §4.1): a loss or gradient norm several times its recent level is a
        // numerical fault (bad data, bad hardware, a bad code change) to roll back from.
        alert({
          alert: 'SteadfastTrainingLossSpike',
          expr: `${agent('steadfast_training_loss')} > ${training.spikeFactor} * ${recentLevel(agent('steadfast_training_loss'))}`,
          for: '0s',
          severity: 'critical',
          summary: 'The training loss jumped far above its recent level.',
          description: `Loss {{ $labels.loss }} of ${RANK} is {{ printf "%.4g" $value }}, more than ${training.spikeFactor}× its average over the ${humanDuration(training.baselineWindow)} before the last ${humanDuration(training.baselineOffset)}.`,
          runbook: 'steadfast-training-loss-spike.md',
          meaning: { role: 'fault', faultClass: 'numerical', signal: 'alert', citation: FAULT_CITATIONS.numerical, route: 'controller' },
        }),
        alert({
          alert: 'SteadfastTrainingGradNormSpike',
          expr: `${agent('steadfast_training_grad_norm')} > ${training.spikeFactor} * ${recentLevel(agent('steadfast_training_grad_norm'))}`,
          for: '0s',
          severity: 'critical',
          summary: 'The gradient norm jumped far above its recent level.',
          description: `The gradient norm of ${RANK} is {{ printf "%.4g" $value }}, more than ${training.spikeFactor}× its average over the ${humanDuration(training.baselineWindow)} before the last ${humanDuration(training.baselineOffset)}.`,
          runbook: 'steadfast-training-grad-norm-spike.md',
          meaning: { role: 'fault', faultClass: 'numerical', signal: 'alert', citation: FAULT_CITATIONS.numerical, route: 'controller' },
        }),
        // NaN is the only value not equal to itself.
        alert({
          alert: 'SteadfastTrainingLossNaN',
          expr: `${agent('steadfast_training_loss')} != ${agent('steadfast_training_loss')}`,
          for: '0s',
          severity: 'critical',
          summary: 'The training loss is NaN.',
          description: `Loss {{ $labels.loss }} of ${RANK} is NaN.`,
          runbook: 'steadfast-training-loss-nan.md',
          meaning: { role: 'fault', faultClass: 'numerical', signal: 'alert', citation: FAULT_CITATIONS.numerical, route: 'controller' },
        }),
        alert({
          alert: 'SteadfastTrainingNanIterations',
          expr: `increase(${agent('steadfast_training_nan_iterations_total')}[${training.counterWindow}]) > 0`,
          for: '0s',
          severity: 'critical',
          summary: 'Training iterations produced NaN.',
          description: `${RANK_SENTENCE} reported iterations with a NaN loss ({{ printf "%.0f" $value }} in the last ${humanDuration(training.counterWindow)}).`,
          runbook: 'steadfast-training-nan-iterations.md',
          meaning: { role: 'fault', faultClass: 'numerical', signal: 'alert', citation: FAULT_CITATIONS.numerical, route: 'controller' },
        }),
        // fp16 loss scaling skips an iteration whenever it overflows and then lowers the scale;
        // an odd skip is normal, skips that go on for skippedFor mean it is not recovering.
        alert({
          alert: 'SteadfastTrainingSkippedIterations',
          expr: `increase(${agent('steadfast_training_skipped_iterations_total')}[${training.counterWindow}]) > 0`,
          for: training.skippedFor,
          severity: 'warning',
          summary: 'Training keeps skipping iterations.',
          description: `${RANK_SENTENCE} has kept skipping iterations for ${humanDuration(training.skippedFor)} ({{ printf "%.0f" $value }} in the last ${humanDuration(training.counterWindow)}): the fp16 loss scale keeps overflowing.`,
          runbook: 'steadfast-training-skipped-iterations.md',
          // fp16 loss-scale overflows skip steps by design; the NaN and spike alerts are the numerical triggers.
          meaning: { role: 'fault', faultClass: 'transient', signal: 'alert', citation: FAULT_CITATIONS.transient, route: 'controller' },
        }),

        // Greyhound (004, §4): a fail-slow is confirmed when the iteration time stays at least
        // 10 % above the job's own earlier level. The baseline ends slowdownBaselineOffset ago so
        // the slow period itself does not raise it before `for:` has elapsed.
        alert({
          alert: 'SteadfastTrainingSlowdown',
          expr: `${ITERATION_MEDIAN}\n>= ${training.slowdownRatio} * avg_over_time(${ITERATION_MEDIAN}[${training.baselineWindow}] offset ${training.slowdownBaselineOffset})`,
          for: training.slowdownFor,
          severity: 'warning',
          summary: 'Training iterations became slower.',
          description: `Job {{ $labels.${TRAINING_JOB_LABEL} }} takes {{ $value | humanizeDuration }} per iteration (median over its ranks), at least ${percentAbove(training.slowdownRatio)} more than over the ${humanDuration(training.baselineWindow)} before the last ${humanDuration(training.slowdownBaselineOffset)}, for ${humanDuration(training.slowdownFor)}.`,
          runbook: 'steadfast-training-slowdown.md',
          meaning: { role: 'fault', faultClass: 'performance', signal: 'alert', citation: FAULT_CITATIONS.performance, route: 'controller' },
        }),

        // A rank that reports nothing while its node still runs rank processes is hung. A node
        // that reports no rank processes at all has finished or lost the job (the worker
        // failure alerts cover the latter); one without the process collector still fires.
        alert({
          alert: 'SteadfastTrainingStalled',
          expr: [
            `time() - ${agent('steadfast_training_last_iteration_timestamp_seconds')} > ${training.noProgressSeconds}`,
            `unless on (node)`,
            `${rankProcesses} == 0`,
          ].join('\n'),
          for: '0s',
          severity: 'critical',
          summary: 'A training job stopped making progress.',
          description: `${RANK_SENTENCE} has reported no new iteration for {{ $value | humanizeDuration }}, and its node has not reported the ranks gone: the job is hung.`,
          runbook: 'steadfast-training-stalled.md',
          meaning: { role: 'fault', faultClass: 'performance', signal: 'alert', citation: FAULT_CITATIONS.performance, route: 'controller' },
        }),

        // The agent also sends these on its fast path, within seconds; the alert is the record
        // that survives an agent or controller restart and shows in Alertmanager.
        alert({
          alert: 'SteadfastTrainingWorkerFailed',
          expr: `increase(${agent('steadfast_training_errors_total', { kind: { oneOf: WORKER_FAILURES } })}[${training.counterWindow}]) > 0`,
          for: '0s',
          severity: 'critical',
          summary: 'A training worker failed or a collective timed out.',
          description: `${RANK_SENTENCE} logged a {{ $labels.kind }} failure ({{ printf "%.0f" $value }} in the last ${humanDuration(training.counterWindow)}).`,
          runbook: 'steadfast-training-worker-failed.md',
          // The alert carries no log text, so no exception type: a crash until diagnosis says more.
          meaning: { role: 'fault', faultClass: 'crash', signal: 'alert', citation: FAULT_CITATIONS.crash, route: 'controller' },
        }),
      ],
    },
  ];
}

export const rules: DomainRules = { domain: 'training', groups };
