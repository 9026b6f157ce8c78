import type { FaultClass } from '../../core/ladder.js';
import type { Incident } from './incidents.js';
import type { EttrTimings } from './params.js';

/**
 * What steadfast's monitoring reports to the recovery ladder about an incident, and how long after
 * it strikes: one fault signal after the symptom's detection time (Table 3), or two for a network
 * fault. Which machine a signal names is what the monitor could know: the reporter for explicit
 * machine, network and crash faults, none for a NaN loss, a hang or a slowdown, which are seen
 * job-wide (§5.1).
 */

export interface FaultReport {
  readonly afterSeconds: number;
  readonly faultClass: FaultClass;
  readonly nodes: readonly string[];
  readonly detail: string;
  /**
   * What the classifier would name as the kind of failure (controller/policy/fault-signature.ts: the
   * exception type, Xid, NCCL error kind): here the Table 1 row, so two incidents of one row
   * look alike to the ladder and incidents of different rows do not.
   */
  readonly signature: string;
}

/** A code update is not a fault: it reaches the ladder as an update, not through monitoring. */
export function faultReports(incident: Incident, reporter: string, timings: EttrTimings): FaultReport[] {
  return reports(incident, reporter, timings).map((report) => ({ ...report, signature: incident.symptom.id }));
}

function reports(incident: Incident, reporter: string, timings: EttrTimings): Omit<FaultReport, 'signature'>[] {
  const afterSeconds = incident.symptom.detectionSeconds;
  const name = incident.symptom.name;
  switch (incident.signal) {
    case 'code_update':
      return [];
    case 'slowdown':
      return [{ afterSeconds, faultClass: 'performance', nodes: [], detail: 'MFU decline' }];
    case 'machine':
      return [{ afterSeconds, faultClass: 'machine', nodes: [reporter], detail: `${name} on ${reporter}` }];
    case 'network':
      // Table 3: inspected every 30 s; §4.1: the second alert within 5 minutes evicts.
      return [
        { afterSeconds, faultClass: 'network', nodes: [reporter], detail: `${name} on ${reporter}` },
        { afterSeconds: afterSeconds + timings.networkAlertIntervalSeconds, faultClass: 'network', nodes: [reporter], detail: `${name} on ${reporter} again` },
      ];
    case 'crash':
      return [{ afterSeconds, faultClass: 'crash', nodes: [reporter], detail: `${name} reported by ${reporter}` }];
    case 'numerical':
      return [{ afterSeconds, faultClass: 'numerical', nodes: [], detail: 'NaN loss' }];
    case 'hang':
      return [{ afterSeconds, faultClass: 'performance', nodes: [], detail: 'zero RDMA traffic for 10 minutes' }];
  }
}
