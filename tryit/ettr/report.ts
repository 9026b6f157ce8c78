import type { EttrComparison } from './compare.js';
import { CAUSES, type Cause } from './ledger.js';
import { LESSON_SHARES, PAPER_INCIDENTS_PER_DAY, SYMPTOMS } from './model.js';
import { jobMtbfHours } from './params.js';
import { hotSwapJson, hotSwapText } from './report-hot-swap.js';
import { STRATEGIES, type StrategyResult } from './result.js';
import type { Sensitivity } from './sensitivity.js';

/** The comparison as the CLI prints it: a table for people, a stable JSON object for programs. */

/** ByteRobust's headline: 97 % ETTR over three months on 9,600 GPUs (abstract, §8.1.3). */
export const PAPER_ETTR = 0.97;

const CAUSE_LABELS: Record<Cause, string> = {
  detection: 'detection',
  diagnosis: 'diagnosis / stress tests',
  replay: 'dual-phase replay',
  standby_activation: 'evict + warm standby',
  cold_provisioning: 'evict + cold node',
  requeue: 'requeue whole job',
  reschedule: 'reschedule pods',
  restart: 'restart in place',
  backoff: 'retry backoff',
  failed_restart: 'failed restarts',
  reload: 'checkpoint reload',
  lost_work: 'lost work (recompute)',
  degraded: 'slow training (MFU)',
  hot_swap: 'hot swap onto a spare',
  swap_fallback: 'hot swap bound (fallback)',
  human: 'human intervention',
};

const RESOLUTION_LABELS: Record<string, string> = {
  direct_eviction: 'direct eviction',
  diagnosed_eviction: 'eviction after diagnosis',
  analyzer_eviction: 'analyzer over-eviction',
  reattempt: 'reattempt',
  rollback: 'rollback',
  replay: 'replay + eviction',
  hot_update: 'hot update',
  hot_swap: 'hot swap',
  human: 'human',
};

export function round(value: number, digits = 4): number {
  const factor = 10 ** digits;
  return Math.round(value * factor) / factor;
}

function roundAll(record: Readonly<Record<string, number>>, digits = 3): Record<string, number> {
  return Object.fromEntries(Object.entries(record).map(([key, value]) => [key, round(value, digits)]));
}

function nullable(value: number | null, digits = 2): number | null {
  return value === null ? null : round(value, digits);
}

function strategyJson(result: StrategyResult): Record<string, unknown> {
  return {
    ettr: round(result.ettr, 5),
    productiveHours: round(result.productiveHours, 2),
    unproductiveHours: roundAll(result.unproductiveHours),
    unproductiveHoursBySymptom: roundAll(result.unproductiveHoursBySymptom),
    checkpointStallHours: round(result.checkpointStallHours, 3),
    incidents: result.incidents,
    incidentsBySymptom: result.incidentsBySymptom,
    replacementScheduling: { count: result.replacementScheduling.count, meanSeconds: nullable(result.replacementScheduling.meanSeconds, 1) },
    ...(result.standby === undefined ? {} : { standby: result.standby }),
    ...(result.ladderSteps === undefined ? {} : { ladderSteps: result.ladderSteps }),
    ...(result.resolvedBy === undefined ? {} : { resolvedBy: result.resolvedBy }),
    ...(result.hotSwap === undefined ? {} : { hotSwap: { ...result.hotSwap, reservedGpuHours: Math.round(result.hotSwap.reservedGpuHours) } }),
  };
}

export function reportJson(comparison: EttrComparison, extra: { sensitivity?: Sensitivity; plot?: string } = {}): Record<string, unknown> {
  const { params, strategies, gain } = comparison;
  const steadfast = strategies.steadfast;
  return {
    ettr: round(steadfast.ettr, 5),
    baselines: { requeue: round(strategies.requeue.ettr, 5), reschedule: round(strategies.reschedule.ettr, 5) },
    unproductiveHours: roundAll(steadfast.unproductiveHours),
    unproductiveHoursBySymptom: roundAll(steadfast.unproductiveHoursBySymptom),
    standby: steadfast.standby,
    gainOverRequeue: nullable(gain.overRequeue),
    gainOverReschedule: nullable(gain.overReschedule),
    gainDefinition:
      'mean time per machine replacement from the decision to replace to the relaunched job (no reload, no lost work), requeue over steadfast: the counterpart of ByteRobust §8.2.1 weighted-average scheduling time',
    unproductiveHoursOverRequeue: nullable(gain.unproductiveHoursOverRequeue),
    unproductiveHoursOverReschedule: nullable(gain.unproductiveHoursOverReschedule),
    paper: { ettr: PAPER_ETTR, gainOverRequeue: gain.paperOverRequeue, gainOverReschedule: gain.paperOverReschedule },
    params: {
      gpus: params.nodes * params.gpusPerNode,
      nodes: params.nodes,
      days: params.days,
      seed: params.seed,
      failuresPerDay: round(params.failuresPerDay, 4),
      manualRestartsPerDay: round(params.manualRestartsPerDay, 4),
      checkpointMinutes: round(params.checkpointIntervalSeconds / 60, 3),
      standby: params.standby,
      dailyMachineFailureRate: round(params.dailyMachineFailureRate, 6),
      timings: roundAll({ ...params.timings }, 2),
    },
    strategies: Object.fromEntries(STRATEGIES.map((name) => [name, strategyJson(strategies[name])])),
    hotSwap: comparison.hotSwap === undefined ? null : { ...hotSwapJson(comparison), run: strategyJson(comparison.hotSwap) },
    ...(extra.sensitivity === undefined ? {} : { sensitivity: sensitivityJson(extra.sensitivity) }),
    ...(extra.plot === undefined ? {} : { plot: extra.plot }),
  };
}

function sensitivityJson(table: Sensitivity): Record<string, unknown> {
  return {
    seeds: table.seeds,
    standby: table.standby.map((row) => ({ ...row, steadfast: round(row.steadfast, 5) })),
    checkpoint: table.checkpoint.map((row) => ({
      ...row,
      minutes: round(row.minutes, 3),
      steadfast: round(row.steadfast, 5),
      reschedule: round(row.reschedule, 5),
      requeue: round(row.requeue, 5),
    })),
  };
}

// ---------------------------------------------------------------------------------------------
// Text

function pct(value: number): string {
  return `${(value * 100).toFixed(2)} %`;
}

function hours(value: number): string {
  return value.toFixed(2);
}

function row(label: string, cells: readonly string[], width = 30, cellWidth = 12): string {
  return `${label.padEnd(width)}${cells.map((cell) => cell.padStart(cellWidth)).join('')}`;
}

export function reportText(comparison: EttrComparison, extra: { sensitivity?: Sensitivity; plot?: string } = {}): string {
  const { params, strategies, gain } = comparison;
  // steadfast with hot swap, when it ran, beside steadfast without it.
  const columns = [
    { name: 'steadfast', result: strategies.steadfast },
    ...(comparison.hotSwap === undefined ? [] : [{ name: '+ hot swap', result: comparison.hotSwap }]),
    { name: 'reschedule', result: strategies.reschedule },
    { name: 'requeue', result: strategies.requeue },
  ];
  const names = columns.map((column) => column.name);
  const all = columns.map((column) => column.result);
  const steadfast = strategies.steadfast;
  const lines: string[] = [];
  const gpus = params.nodes * params.gpusPerNode;
  lines.push(
    `steadfast simulate ettr: ${gpus.toLocaleString('en-US')} GPUs on ${params.nodes.toLocaleString('en-US')} nodes, ${params.days} days, seed ${params.seed}`,
  );
  lines.push(
    `incidents: ${(params.failuresPerDay + params.manualRestartsPerDay).toFixed(2)}/day (${params.failuresPerDay.toFixed(2)} failures, MTBF ${jobMtbfHours(params).toFixed(1)} h; ` +
      `${params.manualRestartsPerDay.toFixed(2)} manual restarts), Table 1 mix; paper's dense job: ${PAPER_INCIDENTS_PER_DAY.toFixed(2)}/day at 1,200 nodes (Table 4)`,
  );
  lines.push(
    `checkpoint every ${(params.checkpointIntervalSeconds / 60).toFixed(2)} min; ${params.standby} warm standbys ` +
      `(P99 of Binomial(${params.nodes}, ${params.dailyMachineFailureRate.toExponential(2)}/day) unless --standby)`,
  );
  lines.push('');
  lines.push(row('', names));
  lines.push(
    row(
      'ETTR',
      all.map((result) => pct(result.ettr)),
    ),
  );
  lines.push(
    row(
      'incidents met',
      all.map((result) => String(result.incidents)),
    ),
  );
  lines.push(
    row(
      'unproductive hours',
      all.map((result) => hours(result.wallHours - result.productiveHours)),
    ),
  );
  for (const cause of CAUSES) {
    if (all.every((result) => result.unproductiveHours[cause] === 0)) continue;
    lines.push(
      row(
        `  ${CAUSE_LABELS[cause]}`,
        all.map((result) => hours(result.unproductiveHours[cause])),
      ),
    );
  }
  lines.push(
    row(
      'checkpoint stalls (MFU cost)',
      all.map((result) => hours(result.checkpointStallHours)),
    ),
  );
  lines.push('');

  lines.push("unproductive hours by incident (Table 1 symptom); min/incident is steadfast's, from fault to training again, lost work included;");
  lines.push('Table 6 "ours" is ByteRobust\'s mean from localisation to restart only');
  lines.push(row('', ['incidents', ...names, 'min/incident', 'Table 6 ours'], 26, 13));
  for (const symptom of SYMPTOMS) {
    const count = steadfast.incidentsBySymptom[symptom.id] ?? 0;
    if (count === 0 && all.every((result) => (result.unproductiveHoursBySymptom[symptom.id] ?? 0) === 0)) continue;
    const ours = steadfast.unproductiveHoursBySymptom[symptom.id] ?? 0;
    const cells = [
      String(count),
      ...all.map((result) => hours(result.unproductiveHoursBySymptom[symptom.id] ?? 0)),
      count === 0 ? '' : ((ours * 60) / count).toFixed(1),
      symptom.table6OursSeconds === undefined ? '' : `${symptom.table6OursSeconds} s`,
    ];
    lines.push(row(`  ${symptom.name}`, cells, 26, 13));
  }
  lines.push('');

  const standby = steadfast.standby;
  if (standby !== undefined) {
    lines.push(
      `standby pool (steadfast): ${standby.poolSize} machines; ${standby.activations} activations; pool emptied ${standby.depletions} times; ` +
        `${standby.poolShortEvictions} evictions waited for ${standby.coldNodes} cold nodes; ${Math.round(standby.reservedGpuHours).toLocaleString('en-US')} GPU-hours held in reserve`,
    );
  }
  const resolved = Object.entries(steadfast.resolvedBy ?? {})
    .sort((a, b) => b[1] - a[1])
    .map(([how, count]) => `${RESOLUTION_LABELS[how] ?? how} ${count}`);
  lines.push(`resolved by (steadfast): ${resolved.join(', ')}`);
  const by = steadfast.resolvedBy ?? {};
  const failures = Object.entries(by).reduce((sum, [how, count]) => (how === 'hot_update' ? sum : sum + count), 0);
  if (failures > 0) {
    const share = (key: string): string => `${(((by[key] ?? 0) / failures) * 100).toFixed(1)} %`;
    lines.push(
      `  of failures: direct eviction ${share('direct_eviction')}, reattempt ${share('reattempt')}, rollback ${share('rollback')}, replay ${share('replay')} ` +
        `(ByteRobust §4.2 Lesson: ${(LESSON_SHARES.directEviction * 100).toFixed(2)} %, ${(LESSON_SHARES.reattempt * 100).toFixed(2)} %, ${(LESSON_SHARES.rollback * 100).toFixed(2)} %, ${(LESSON_SHARES.replay * 100).toFixed(2)} %)`,
    );
  }
  lines.push('');
  const mean = (result: StrategyResult): string =>
    result.replacementScheduling.meanSeconds === null ? 'n/a' : `${result.replacementScheduling.meanSeconds.toFixed(1)} s`;
  lines.push(
    `warm-standby gain over requeue: ${gain.overRequeue === null ? 'n/a' : `${gain.overRequeue.toFixed(2)}×`} (ByteRobust §8.2.1: ${gain.paperOverRequeue}×); ` +
      `over reschedule: ${gain.overReschedule === null ? 'n/a' : `${gain.overReschedule.toFixed(2)}×`} (paper: ${gain.paperOverReschedule}×)`,
  );
  lines.push(
    `  = mean time per machine replacement from the decision to replace to the relaunched job: requeue ${mean(strategies.requeue)}, reschedule ${mean(strategies.reschedule)}, steadfast ${mean(steadfast)}`,
  );
  if (gain.unproductiveHoursOverRequeue !== null) {
    lines.push(
      `  end to end, requeue loses ${gain.unproductiveHoursOverRequeue.toFixed(2)}× and reschedule ${(gain.unproductiveHoursOverReschedule ?? 0).toFixed(2)}× the hours steadfast loses`,
    );
  }
  lines.push(`target: ETTR ≥ ${pct(PAPER_ETTR)} (ByteRobust §8.1.3): steadfast ${pct(steadfast.ettr)} — ${steadfast.ettr >= PAPER_ETTR ? 'met' : 'not met'}`);
  lines.push(...hotSwapText(comparison));
  if (extra.sensitivity !== undefined) lines.push('', sensitivityText(extra.sensitivity));
  if (extra.plot !== undefined) lines.push('', `plot written to ${extra.plot}`);
  return `${lines.join('\n')}\n`;
}

export function sensitivityText(table: Sensitivity): string {
  const seeds = table.seeds.length === 1 ? `seed ${table.seeds[0]}` : `mean over seeds ${table.seeds.join(', ')}`;
  const lines = [`sensitivity (${seeds})`, row('warm standbys', ['steadfast', 'cold waits'], 26)];
  for (const entry of table.standby)
    lines.push(row(`  ${entry.standby}${entry.isDefault ? ' (P99 / chosen)' : ''}`, [pct(entry.steadfast), String(entry.poolShortEvictions)], 26));
  lines.push(row('checkpoint interval (min)', [...STRATEGIES], 26));
  for (const entry of table.checkpoint) {
    lines.push(
      row(
        `  ${entry.minutes.toFixed(entry.minutes < 10 && !Number.isInteger(entry.minutes) ? 2 : 0)}${entry.isDefault ? ' (default)' : ''}`,
        [pct(entry.steadfast), pct(entry.reschedule), pct(entry.requeue)],
        26,
      ),
    );
  }
  return lines.join('\n');
}
