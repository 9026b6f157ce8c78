import { Ledger, type Cause } from './ledger.js';
import { NAMED_MACHINE_TEST_SECONDS } from './model.js';
import { SIM_START_MS, DAY_MS, type EttrParams } from './params.js';
import type { Incident, IncidentSource } from './incidents.js';
import { increment, schedulingSummary, type StrategyResult } from './result.js';

/**
 * The two baselines of ByteRobust §8.2.1, as recovery policies without a ladder:
 * - requeue: every incident kills the job and requeues it whole through the scheduler, on newly
 *   allocated machines, which reload the checkpoint from remote storage (§2.3);
 * - reschedule: every incident relaunches the job on its own allocation with pods reinstalled,
 *   replacing only the machine found bad; the survivors reload from local copies.
 * Both detect faults as fast as steadfast does (detection is the monitoring's job, not the
 * recovery's), so the difference is recovery alone. Neither knows code from hardware: a user-code
 * fault fails again after the relaunch and a person fixes it. Code updates are a relaunch like any
 * other (Table 7's requeue for requeue), since neither has hot update.
 */

export type BaselineName = 'requeue' | 'reschedule';

const S = 1000;

export function runBaseline(kind: BaselineName, params: EttrParams, source: IncidentSource): StrategyResult {
  const t = params.timings;
  const start = SIM_START_MS;
  const end = start + params.days * DAY_MS;
  const ledger = new Ledger(start, end, params.checkpointIntervalSeconds * S, params.checkpointBlockingSeconds * S);
  const incidentsBySymptom: Record<string, number> = {};
  const scheduling: number[] = [];
  let incidents = 0;

  /** Books a stretch of downtime and returns when it ends. */
  const spend = (cause: Cause, from: number, seconds: number, symptom: string): number => {
    ledger.spend(cause, from, from + seconds * S, symptom);
    return from + seconds * S;
  };
  /** Relaunches the job the baseline's way and reloads; `replacing` counts a machine replacement. */
  const relaunch = (from: number, symptom: string, replacing: boolean): number => {
    const seconds = kind === 'requeue' ? t.requeueSeconds : t.rescheduleSeconds;
    if (replacing) scheduling.push(seconds);
    const launched = spend(kind, from, seconds, symptom);
    return spend('reload', launched, kind === 'requeue' ? t.remoteReloadSeconds : t.localReloadSeconds, symptom);
  };

  let resumedAt = start;
  while (resumedAt < end) {
    const incident = source.next();
    const faultAt = resumedAt + incident.uptimeGapSeconds * S;
    if (!(faultAt < end)) {
      ledger.segment(resumedAt, end, 'horizon', 'none');
      break;
    }
    incidents += 1;
    const symptom = incident.symptom.id;
    increment(incidentsBySymptom, symptom);
    if (incident.signal === 'code_update') {
      ledger.segment(resumedAt, faultAt, 'planned', symptom);
      resumedAt = relaunch(faultAt, symptom, false);
      continue;
    }
    const detection = incident.symptom.detectionSeconds;
    let cursor: number;
    if (incident.signal === 'slowdown') {
      // The job trains on, slowly, until the decline is noticed.
      cursor = faultAt + detection * S;
      ledger.segment(resumedAt, cursor, 'failure', symptom, { fromMs: faultAt, speed: params.slowdownSpeed });
    } else {
      ledger.segment(resumedAt, faultAt, 'failure', symptom);
      cursor = spend('detection', faultAt, detection, symptom);
    }
    const { found, after } = kind === 'reschedule' ? localise(incident, cursor, spend) : { found: false, after: cursor };
    cursor = after;
    // Requeue moves the whole job off its machines (the failed one is not handed out again);
    // reschedule fixes a machine fault only when it knows which machine.
    const machineReplaced = incident.root === 'node' && (kind === 'requeue' || found);
    const fixed = incident.root === 'transient' || machineReplaced;
    cursor = relaunch(cursor, symptom, machineReplaced);
    if (!fixed) {
      cursor = spend('failed_restart', cursor, t.refailSeconds, symptom);
      cursor = spend('detection', cursor, detection, symptom);
      cursor = spend('human', cursor, t.humanSeconds, symptom);
      cursor = relaunch(cursor, symptom, incident.root === 'node');
    }
    resumedAt = cursor;
  }

  return {
    strategy: kind,
    ...ledger.summary(),
    incidents,
    incidentsBySymptom,
    replacementScheduling: schedulingSummary(scheduling),
  };
}

/**
 * Prior practice's localisation (ByteRobust §8.1.4): a selective stress test chosen from the log,
 * taking Table 6's "Selective" time. A fault that names its machine is confirmed (Table 6's time,
 * or its mean over such faults); one Table 6 marks INF, or has no row for, goes untested and the
 * job is relaunched as it was.
 */
function localise(
  incident: Incident,
  from: number,
  spend: (cause: Cause, from: number, seconds: number, symptom: string) => number,
): { found: boolean; after: number } {
  const symptom = incident.symptom;
  const names = incident.signal === 'machine' || incident.signal === 'network';
  if (names) {
    return { found: true, after: spend('diagnosis', from, symptom.selectiveTestSeconds ?? NAMED_MACHINE_TEST_SECONDS, symptom.id) };
  }
  const seconds = symptom.selectiveTestSeconds;
  if (seconds === undefined || seconds === null) return { found: false, after: from };
  return { found: incident.root === 'node', after: spend('diagnosis', from, seconds, symptom.id) };
}
