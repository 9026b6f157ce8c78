import { createHash } from 'node:crypto';
import type { FleetPlan } from '../../bench/heldout/fleet.js';
import { buildTimelines, type NodeTimeline } from '../../bench/heldout/timeline.js';
import { nodeSeries } from '../../bench/heldout/series.js';

/**
 * Stable digests of a held-out fleet: of its plan (the labelled content, field by field) and of
 * the series of some of its nodes (every sample as the OpenMetrics writer formats it), so that a
 * test can hold a fleet to what it was when it was first used.
 */

export function planDigest(plan: FleetPlan): string {
  const content = {
    seed: plan.seed,
    start: plan.start,
    end: plan.end,
    stepMs: plan.stepMs,
    nodes: plan.nodes,
    gpusPerNode: plan.gpusPerNode,
    traits: [...plan.traits.entries()],
    jobs: plan.jobs,
    faults: plan.faults,
    confusers: plan.confusers,
  };
  return createHash('sha256').update(JSON.stringify(content)).digest('hex');
}

export function seriesDigest(plan: FleetPlan, nodes: readonly string[]): string {
  const timelines = buildTimelines(plan);
  const steps = Math.floor((plan.end - plan.start) / plan.stepMs);
  const hash = createHash('sha256');
  for (const node of nodes) {
    for (const [family, list] of nodeSeries(plan, node, timelines.get(node) as NodeTimeline)) {
      hash.update(`# ${family}\n`);
      for (const series of list) {
        const values: string[] = [series.key];
        for (let step = 0; step < steps; step += 1) {
          const value = series.value(step);
          values.push(value === undefined ? '' : Number.isInteger(value) ? String(value) : value.toFixed(3));
        }
        hash.update(values.join(' '));
        hash.update('\n');
      }
    }
  }
  return hash.digest('hex');
}
