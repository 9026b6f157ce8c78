import type { Incident as LadderIncident } from '../../controller/policy/ladder/index.js';
import type { Incident } from './incidents.js';

/** The incident the simulated job is being recovered from, as the world knows it (the ladder does not). */
export interface OpenIncident {
  /** null: a lazy code update whose 24 h window ran out (§6.1) stopped the job. */
  readonly incident: Incident | null;
  readonly symptom: string;
  readonly detectionSeconds: number;
  /** The machine at fault, for node-rooted incidents. */
  readonly culprit: string | null;
  /** The node a fault without a culprit is reported from. */
  readonly reporter: string;
  bugActive: boolean;
}

/**
 * What resolved an incident, in the terms of ByteRobust's §4.2 shares (direct eviction, reattempt,
 * rollback, replay, …), from the world's incident and the rung the ladder ended on.
 */
export function resolutionOf(open: OpenIncident | null, ladderIncident: LadderIncident | null): string {
  if (open === null || open.incident === null || open.incident.signal === 'code_update' || ladderIncident === null) return 'hot_update';
  switch (ladderIncident.rung) {
    case 'evict':
      if (ladderIncident.tried.replay > 0) return 'replay';
      if (open.incident.signal === 'hang' || open.incident.signal === 'slowdown') return 'analyzer_eviction';
      return ladderIncident.tried.diagnose > 0 ? 'diagnosed_eviction' : 'direct_eviction';
    case 'update':
      return 'hot_update';
    default:
      return ladderIncident.rung;
  }
}
