import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { DEFAULT_LADDER_CONFIG } from '../../controller/policy/ladder/index.js';
import { runBaseline } from '../../tryit/ettr/baselines.js';
import { compareStrategies } from '../../tryit/ettr/compare.js';
import { IncidentStream, ScriptedIncidents, type ScriptedIncident } from '../../tryit/ettr/incidents.js';
import { CAUSES } from '../../tryit/ettr/ledger.js';
import { RESCHEDULE_SECONDS, SYMPTOMS, WARM_EVICTION_SECONDS, hotUpdateSeconds, requeueSeconds } from '../../tryit/ettr/model.js';
import { ettrParams, type EttrParams } from '../../tryit/ettr/params.js';
import type { StrategyResult } from '../../tryit/ettr/result.js';
import { runSteadfast } from '../../tryit/ettr/run.js';

const HOUR = 3600;

function steadfastOn(params: EttrParams, script: readonly ScriptedIncident[], ladderConfig = DEFAULT_LADDER_CONFIG): StrategyResult {
  return runSteadfast(params, new ScriptedIncidents(script), { ladderConfig });
}

function unproductiveTotal(result: StrategyResult): number {
  return CAUSES.reduce((sum, cause) => sum + result.unproductiveHours[cause], 0);
}

describe('the ETTR model follows the paper', () => {
  it('derives the warm-standby, reschedule and requeue times from Table 7 and the Fig. 12 ratios', () => {
    // §8.2.1: warm standby is 10.87× faster than requeue (768 s at 1,024 machines, Table 7), 5.36× faster than reschedule, 5.19 % off the oracle.
    expect(requeueSeconds(1024)).toBe(768);
    expect(hotUpdateSeconds(1024)).toBe(65);
    expect(WARM_EVICTION_SECONDS).toBeCloseTo(768 / 10.87 / 1.0519, 9);
    expect(RESCHEDULE_SECONDS).toBeCloseTo((768 / 10.87) * 5.36, 9);
    // Requeue keeps growing with scale past Table 7's largest job (§8.2.1 Scalability).
    expect(requeueSeconds(1200)).toBeGreaterThan(768);
  });

  it('splits every Table 1 symptom into root causes whose shares are probabilities summing to one', () => {
    expect(SYMPTOMS.reduce((sum, symptom) => sum + symptom.count, 0)).toBe(55_365);
    for (const symptom of SYMPTOMS) {
      for (const variant of symptom.variants) expect(variant.share).toBeGreaterThanOrEqual(0);
      expect(symptom.variants.reduce((sum, variant) => sum + variant.share, 0)).toBeCloseTo(1, 12);
    }
  });

  it('sizes the default pool at the P99 of the daily machine-failure binomial and derives the incident rate from the dense job', () => {
    const params = ettrParams();
    // Table 4: 175 incidents in the dense job's 90 days; 82.7 % of Table 1 are failures.
    expect(params.failuresPerDay + params.manualRestartsPerDay).toBeCloseTo(175 / 90, 9);
    expect(params.standby).toBe(4);
    expect(params.gpusPerNode).toBe(8);
  });

  it('rejects a GPU count that does not divide over the nodes, naming the field', () => {
    expect(() => ettrParams({ nodes: 1200, gpus: 9601 })).toThrow(/gpus/);
    expect(() => ettrParams({ nodes: 0 })).toThrow(/nodes/);
  });
});

describe('steadfast simulate ettr', () => {
  it('is deterministic per seed and differs between seeds', () => {
    const params = ettrParams({ days: 20, seed: 7 });
    const first = compareStrategies(params);
    const second = compareStrategies(params);
    expect(second).toEqual(first);
    const other = compareStrategies(ettrParams({ days: 20, seed: 8 }));
    expect(other.strategies.steadfast.ettr).not.toBe(first.strategies.steadfast.ettr);
  });

  it('gives ETTR 1 for every strategy when no incident happens', () => {
    const params = ettrParams({ days: 5 });
    const result = compareStrategies(params, { incidents: () => new ScriptedIncidents([]) });
    for (const strategy of Object.values(result.strategies)) {
      expect(strategy.ettr).toBe(1);
      expect(strategy.incidents).toBe(0);
      expect(unproductiveTotal(strategy)).toBe(0);
    }
  });

  it('costs each machine fault exactly detection + eviction + warm restart + reload + the work since the last checkpoint, with an ample pool', () => {
    const params = ettrParams({ days: 10, checkpointMinutes: 30, standby: 10 });
    // 10 h 7 min of training before each fault: 7 minutes past the last 30-minute checkpoint.
    const script = [1, 2, 3].map(() => ({ symptom: 'gpu_unavailable', gapSeconds: 10 * HOUR + 7 * 60 }));
    const result = steadfastOn(params, script);
    const detection = 10; // Table 3: GPU lost within 10 s
    const evictAndWarmRelaunch = 768 / 10.87 / 1.0519; // Fig. 12 oracle: evict (10 s, Table 6) + wake a standby and relaunch
    const reload = 30;
    const lostWork = 7 * 60;
    const perIncident = detection + evictAndWarmRelaunch + reload + lostWork;
    expect(result.incidents).toBe(3);
    expect(result.unproductiveHours.detection).toBeCloseTo((3 * detection) / HOUR, 9);
    expect(result.unproductiveHours.standby_activation).toBeCloseTo((3 * evictAndWarmRelaunch) / HOUR, 9);
    expect(result.unproductiveHours.reload).toBeCloseTo((3 * reload) / HOUR, 9);
    expect(result.unproductiveHours.lost_work).toBeCloseTo((3 * lostWork) / HOUR, 9);
    expect(unproductiveTotal(result)).toBeCloseTo((3 * perIncident) / HOUR, 9);
    expect(result.ettr).toBeCloseTo(1 - (3 * perIncident) / (10 * 24 * HOUR), 12);
    expect(result.standby).toMatchObject({ activations: 3, poolShortEvictions: 0, coldNodes: 0 });
    expect(result.ladderSteps).toMatchObject({ stop: 3, evict: 3, restart: 3 });
    expect(result.resolvedBy).toEqual({ direct_eviction: 3 });
  });

  it('waits for a cold node (the reschedule time) when the pool is empty', () => {
    const params = ettrParams({ days: 2, checkpointMinutes: 30, standby: 0 });
    const result = steadfastOn(params, [{ symptom: 'gpu_unavailable', gapSeconds: 10 * HOUR }]);
    expect(result.unproductiveHours.standby_activation).toBe(0);
    expect(result.unproductiveHours.cold_provisioning).toBeCloseTo(((768 / 10.87) * 5.36) / HOUR, 9);
    expect(result.standby).toMatchObject({ activations: 0, poolShortEvictions: 1, coldNodes: 1 });
  });

  it('runs the real ladder: a CUDA error from user code goes diagnose → reattempt → rollback (§4.2 steps ③ ⑤ ⑥)', () => {
    const params = ettrParams({ days: 1 });
    const result = steadfastOn(params, [{ symptom: 'cuda_error', root: 'user_code', gapSeconds: HOUR }]);
    expect(result.ladderSteps).toMatchObject({ stop: 1, run_diagnostics: 1, reattempt: 1, rollback: 1, restart: 1 });
    expect(result.resolvedBy).toEqual({ rollback: 1 });
    expect(result.unproductiveHours.diagnosis).toBeCloseTo(params.timings.diagnosticsSeconds / HOUR, 9);
    // The reattempt fails again (the bug is still there); the rollback is held back by the retry chain's first backoff.
    expect(result.unproductiveHours.failed_restart).toBeCloseTo(params.timings.refailSeconds / HOUR, 9);
    expect(result.unproductiveHours.backoff).toBeCloseTo(DEFAULT_LADDER_CONFIG.retryInitialBackoffMs / 1000 / HOUR, 9);
    expect(result.unproductiveHours.restart).toBeCloseTo((2 * params.timings.inPlaceRestartSeconds) / HOUR, 9);
    expect(result.unproductiveHours.human).toBe(0);
    // Without the ladder, a person has to step in.
    expect(
      runBaseline('requeue', params, new ScriptedIncidents([{ symptom: 'cuda_error', root: 'user_code', gapSeconds: HOUR }])).unproductiveHours.human,
    ).toBeGreaterThan(0);
  });

  it('runs the real ladder: a hang in user code is over-evicted first, then rolled back when training fails again (§5.1, §4.2 step ⑦)', () => {
    const params = ettrParams({ days: 1, standby: 8 });
    const result = steadfastOn(params, [{ symptom: 'job_hang', root: 'user_code', gapSeconds: HOUR }]);
    expect(result.ladderSteps).toMatchObject({ analyze_stacks: 1, evict: 1, rollback: 1 });
    expect(result.standby?.activations).toBe(params.overEvictionGroupSize);
    expect(result.resolvedBy).toEqual({ rollback: 1 });
  });

  it('rolls back a crash soon after an eviction only when it repeats the failure or strikes the replacement (§4.2 step ⑦)', () => {
    const params = ettrParams({ days: 1, standby: 8 });
    // A bad GPU found by diagnostics and evicted; its slot (nodePick 0.5) goes to a standby.
    const evicted: ScriptedIncident = { symptom: 'cuda_error', signal: 'crash', root: 'node', gapSeconds: HOUR, diagnosticsFind: true };
    // Ten minutes of training later, an OOM on another node: a new incident for the stop-time checks.
    const unrelated = steadfastOn(params, [evicted, { symptom: 'cpu_oom', gapSeconds: 600, nodePick: 0.1 }]);
    expect(unrelated.ladderSteps).toMatchObject({ run_diagnostics: 2, evict: 1, reattempt: 1 });
    expect(unrelated.ladderSteps?.rollback).toBeUndefined();
    expect(unrelated.resolvedBy).toEqual({ diagnosed_eviction: 1, reattempt: 1 });
    // The same OOM on the standby that took the evicted node's place: the eviction did not help.
    const onReplacement = steadfastOn(params, [evicted, { symptom: 'cpu_oom', gapSeconds: 600, nodePick: 0.5 }]);
    expect(onReplacement.ladderSteps).toMatchObject({ run_diagnostics: 1, rollback: 1 });
    // Another CUDA error elsewhere: the same failure again.
    const again = steadfastOn(params, [evicted, { symptom: 'cuda_error', signal: 'crash', root: 'transient', gapSeconds: 600, nodePick: 0.1 }]);
    expect(again.ladderSteps).toMatchObject({ run_diagnostics: 1, rollback: 1 });
    expect(again.resolvedBy).toEqual({ diagnosed_eviction: 1, rollback: 1 });
  });

  it('runs the real ladder with the configuration it is given: a retry limit of one pages a human instead of rolling back', () => {
    const params = ettrParams({ days: 1 });
    const result = steadfastOn(params, [{ symptom: 'cuda_error', root: 'user_code', gapSeconds: HOUR }], { ...DEFAULT_LADDER_CONFIG, retryLimit: 1 });
    expect(result.ladderSteps).toMatchObject({ page_human: 1 });
    expect(result.ladderSteps?.rollback).toBeUndefined();
    expect(result.unproductiveHours.human).toBeCloseTo(params.timings.humanSeconds / HOUR, 9);
    expect(result.resolvedBy).toEqual({ human: 1 });
  });

  it('tolerates the first network alert and evicts on the second, 30 s later (§4.1, Table 3)', () => {
    const params = ettrParams({ days: 1, standby: 4 });
    const result = steadfastOn(params, [{ symptom: 'infiniband', gapSeconds: HOUR }]);
    expect(result.ladderSteps).toMatchObject({ tolerate: 1, evict: 1, restart: 1 });
    expect(result.unproductiveHours.detection).toBeCloseTo(60 / HOUR, 9);
  });

  it("lets a lazy code update ride the next failure's restart instead of stopping the job (§6.1)", () => {
    const params = ettrParams({ days: 2, standby: 4 });
    const result = steadfastOn(params, [
      { symptom: 'code_adjustment', urgent: false, gapSeconds: HOUR },
      { symptom: 'gpu_unavailable', gapSeconds: 2 * HOUR },
    ]);
    expect(result.ladderSteps).toMatchObject({ stop: 1, evict: 1, apply_update: 1 });
    expect(result.unproductiveHours.restart).toBe(0);
    // An urgent one stops the job at once, for a hot update in place and no lost work.
    const urgent = steadfastOn(params, [{ symptom: 'code_adjustment', urgent: true, gapSeconds: HOUR }]);
    expect(urgent.unproductiveHours.restart).toBeCloseTo(params.timings.inPlaceRestartSeconds / HOUR, 9);
    expect(urgent.unproductiveHours.lost_work).toBe(0);
  });

  it('books every hour of every strategy to productive time or exactly one cause', () => {
    const result = compareStrategies(ettrParams({ days: 30, seed: 3 }));
    for (const strategy of Object.values(result.strategies)) {
      expect(strategy.productiveHours + unproductiveTotal(strategy)).toBeCloseTo(strategy.wallHours, 6);
      const bySymptom = Object.values(strategy.unproductiveHoursBySymptom).reduce((sum, hours) => sum + hours, 0);
      expect(bySymptom).toBeCloseTo(unproductiveTotal(strategy), 6);
    }
  });

  it('keeps steadfast ahead of both baselines on the same incidents', () => {
    for (const seed of [1, 2, 3]) {
      const { strategies, gain } = compareStrategies(ettrParams({ days: 30, seed }));
      expect(strategies.steadfast.ettr).toBeGreaterThan(strategies.requeue.ettr);
      expect(strategies.steadfast.ettr).toBeGreaterThan(strategies.reschedule.ettr);
      expect(gain.overRequeue).toBeGreaterThan(1);
    }
  });

  it('never loses ETTR by adding a warm standby (property over seeds and pool sizes)', () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 100_000 }), fc.integer({ min: 0, max: 5 }), (seed, size) => {
        const smaller = ettrParams({ days: 30, seed, standby: size });
        const larger = ettrParams({ days: 30, seed, standby: size + 1 });
        const a = runSteadfast(smaller, new IncidentStream(smaller)).ettr;
        const b = runSteadfast(larger, new IncidentStream(larger)).ettr;
        expect(b).toBeGreaterThanOrEqual(a);
      }),
      { numRuns: 8, seed: 42 },
    );
  });

  it('runs the default 90-day, 1,200-node job in well under a minute', () => {
    const started = performance.now();
    const result = compareStrategies(ettrParams());
    const seconds = (performance.now() - started) / 1000;
    expect(seconds).toBeLessThan(20);
    // About 1.94 incidents a day for 90 days (Table 4), give or take the Poisson spread.
    expect(result.strategies.steadfast.incidents).toBeGreaterThan(120);
    expect(result.strategies.steadfast.incidents).toBeLessThan(240);
  });
});
