import { describe, expect, it } from 'vitest';
import { simulateCommand } from '../../tryit/cli/simulate.js';
import { compareStrategies } from '../../tryit/ettr/compare.js';
import { deadpoolSwapSeconds, hotSwapParams, type HotSwapOptions } from '../../tryit/ettr/hot-swap.js';
import { ScriptedIncidents, type ScriptedIncident } from '../../tryit/ettr/incidents.js';
import { WARM_EVICTION_SECONDS } from '../../tryit/ettr/model.js';
import { ettrParams, type EttrOptions, type EttrParams } from '../../tryit/ettr/params.js';
import type { StrategyResult } from '../../tryit/ettr/result.js';
import { runSteadfast } from '../../tryit/ettr/run.js';
import { runCli } from '../support/cli.js';

const HOUR = 3600;

function paramsWith(options: EttrOptions & { hotSwap?: HotSwapOptions }): EttrParams {
  return ettrParams(options);
}

/** steadfast on the script, without hot swap and with it, on the same incidents. */
function both(params: EttrParams, script: readonly ScriptedIncident[]): { relaunch: StrategyResult; swap: StrategyResult } {
  const swap = params.hotSwap;
  if (swap === null) throw new Error('the test needs hot swap on');
  return {
    relaunch: runSteadfast(params, new ScriptedIncidents(script)),
    swap: runSteadfast(params, new ScriptedIncidents(script), { hotSwap: swap }),
  };
}

/** Machine faults only, one every ~10 h, each 7 min 3 s past a 30-minute checkpoint. */
const MACHINE_FAULTS: ScriptedIncident[] = [1, 2, 3].map(() => ({ symptom: 'gpu_unavailable', gapSeconds: 10 * HOUR + 7 * 60 + 3 }));

describe('the hot swap model', () => {
  it("takes DeadPool §VII-B3's recovery times at 32 and 512 GPUs and grows them by the same seconds per doubling", () => {
    expect(deadpoolSwapSeconds(32)).toBeCloseTo(17.1, 9);
    expect(deadpoolSwapSeconds(512)).toBeCloseTo(29.8, 9);
    expect(deadpoolSwapSeconds(128)).toBeCloseTo((17.1 + 29.8) / 2, 9);
    expect(deadpoolSwapSeconds(8)).toBeCloseTo(17.1, 9);
    expect(deadpoolSwapSeconds(9600)).toBeCloseTo(29.8 + (12.7 / 4) * Math.log2(9600 / 512), 9);
  });

  it('bounds a swap the way the controller does, min(timeout, max(10, 40 × step)), and gives at least one spare', () => {
    expect(hotSwapParams({ stepSeconds: 10 }, 1200, 9600).boundSeconds).toBe(60);
    expect(hotSwapParams({ stepSeconds: 0.1 }, 1200, 9600).boundSeconds).toBe(10);
    expect(hotSwapParams({ stepSeconds: 0.5, timeoutSeconds: 300 }, 1200, 9600).boundSeconds).toBe(20);
    expect(hotSwapParams({}, 1200, 9600).spares).toBe(4);
    expect(hotSwapParams({}, 16, 128).spares).toBe(1);
    expect(hotSwapParams({ figures: 'lab' }, 1200, 9600).swapSeconds).toBe(3);
    expect(hotSwapParams({ figures: 'lab', swapSeconds: 12 }, 1200, 9600)).toMatchObject({ swapSeconds: 12, figures: 'set' });
  });

  it('costs a machine fault detection + the swap + the interrupted step: no relaunch, no reload, no work back to the checkpoint', () => {
    const params = paramsWith({ days: 10, checkpointMinutes: 30, standby: 10, hotSwap: { fallbackShare: 0, stepSeconds: 10 } });
    const { swap } = both(params, MACHINE_FAULTS);
    const swapSeconds = deadpoolSwapSeconds(9600);
    expect(swap.unproductiveHours.detection).toBeCloseTo((3 * 10) / HOUR, 9);
    expect(swap.unproductiveHours.hot_swap).toBeCloseTo((3 * swapSeconds) / HOUR, 9);
    // 10 h 7 min 3 s of training: 3 s into a 10 s step.
    expect(swap.unproductiveHours.lost_work).toBeCloseTo((3 * 3) / HOUR, 9);
    expect(swap.unproductiveHours.standby_activation).toBe(0);
    expect(swap.unproductiveHours.reload).toBe(0);
    expect(swap.hotSwap).toMatchObject({ swaps: 3, nodesSwapped: 3, fallbacks: 0, noSpare: 0 });
    // The ladder decided each swap (controller/policy/ladder/hot-swap.ts); the job was never stopped and relaunched.
    expect(swap.ladderSteps).toEqual({ hot_swap: 3, notify: 3 });
    expect(swap.resolvedBy).toEqual({ hot_swap: 3 });
    // The warm standbys stay asleep: the spares took the failed nodes' places.
    expect(swap.standby?.activations).toBe(0);
  });

  it('raises ETTR when machine faults dominate', () => {
    const params = paramsWith({ days: 10, checkpointMinutes: 30, standby: 10, hotSwap: { fallbackShare: 0 } });
    const { relaunch, swap } = both(params, MACHINE_FAULTS);
    expect(swap.ettr).toBeGreaterThan(relaunch.ettr);
    const saved = WARM_EVICTION_SECONDS + params.timings.localReloadSeconds + (7 * 60 + 3) - deadpoolSwapSeconds(9600) - 3;
    expect((swap.productiveHours - relaunch.productiveHours) * HOUR).toBeCloseTo(3 * saved, 6);
  });

  it("is no better than the relaunch when every swap falls back: it pays the bound, then the ladder's stop and relaunch", () => {
    const params = paramsWith({ days: 10, checkpointMinutes: 30, standby: 10, hotSwap: { fallbackShare: 1 } });
    const { relaunch, swap } = both(params, MACHINE_FAULTS);
    expect(swap.ettr).toBeLessThan(relaunch.ettr);
    expect(swap.unproductiveHours.swap_fallback).toBeCloseTo((3 * 60) / HOUR, 9);
    // The spares already hold the failed nodes' places: the relaunch is on the job's nodes, no standby woken.
    expect(swap.unproductiveHours.restart).toBeCloseTo((3 * params.timings.inPlaceRestartSeconds) / HOUR, 9);
    expect(swap.unproductiveHours.reload).toBeCloseTo(relaunch.unproductiveHours.reload, 9);
    expect(swap.unproductiveHours.lost_work).toBeCloseTo(relaunch.unproductiveHours.lost_work, 9);
    expect((relaunch.productiveHours - swap.productiveHours) * HOUR).toBeCloseTo(3 * (60 + params.timings.inPlaceRestartSeconds - WARM_EVICTION_SECONDS), 6);
    expect(swap.hotSwap).toMatchObject({ swaps: 3, fallbacks: 3 });
    expect(swap.ladderSteps).toMatchObject({ hot_swap: 3, stop: 3, restart: 3 });
  });

  it('falls back on every swap that cannot finish within its bound, whatever the fallback share', () => {
    const params = paramsWith({ days: 10, checkpointMinutes: 30, standby: 10, hotSwap: { fallbackShare: 0, swapSeconds: 90, timeoutSeconds: 60 } });
    const { swap } = both(params, MACHINE_FAULTS);
    expect(swap.hotSwap).toMatchObject({ swaps: 3, fallbacks: 3 });
    expect(swap.unproductiveHours.hot_swap).toBe(0);
  });

  it("leaves software faults on today's road: a user-code CUDA error costs the same with hot swap", () => {
    const params = paramsWith({ days: 1, hotSwap: { fallbackShare: 0 } });
    const { relaunch, swap } = both(params, [{ symptom: 'cuda_error', root: 'user_code', gapSeconds: HOUR }]);
    expect(swap.ettr).toBe(relaunch.ettr);
    expect(swap.hotSwap).toMatchObject({ swaps: 0 });
  });

  it('swaps an over-evicted group when there are spares for all of it, and relaunches when there are not', () => {
    const hang: ScriptedIncident[] = [{ symptom: 'job_hang', root: 'node', gapSeconds: HOUR }];
    const enough = paramsWith({ days: 1, standby: 8, hotSwap: { fallbackShare: 0, nodesPerSpare: 300 } });
    expect(both(enough, hang).swap.hotSwap).toMatchObject({ swaps: 1, nodesSwapped: enough.overEvictionGroupSize });
    const short = paramsWith({ days: 1, standby: 8, hotSwap: { fallbackShare: 0, nodesPerSpare: 1200 } });
    const { relaunch, swap } = both(short, hang);
    expect(swap.hotSwap).toMatchObject({ swaps: 0, noSpare: 1 });
    expect(swap.ettr).toBe(relaunch.ettr);
  });

  it('runs the default 9,600-GPU, 90-day job with and without hot swap on the same incidents', () => {
    const comparison = compareStrategies(ettrParams());
    expect(comparison.hotSwap?.incidents).toBe(comparison.strategies.steadfast.incidents);
    expect(comparison.hotSwap?.ettr).toBeGreaterThan(comparison.strategies.steadfast.ettr);
    expect(compareStrategies(ettrParams({ days: 5, hotSwap: null })).hotSwap).toBeUndefined();
  });
});

describe('steadfast simulate ettr with hot swap', () => {
  it("prints both ETTRs and the swap's figures, as given, in the JSON", async () => {
    const run = await runCli(simulateCommand(), [
      'ettr',
      '--days',
      '10',
      '--seed',
      '3',
      '--json',
      '--swap-figures',
      'lab',
      '--swap-fallback',
      '0.25',
      '--nodes-per-spare',
      '100',
      '--step-seconds',
      '4',
    ]);
    expect(run.exitCode).toBe(0);
    const printed = JSON.parse(run.stdout) as { ettr: number; hotSwap: Record<string, unknown> & { run: { ettr: number } } };
    expect(printed.hotSwap).toMatchObject({
      swapSeconds: 3,
      figures: 'lab',
      fallbackShare: 0.25,
      spares: 12,
      stepSeconds: 4,
      boundSeconds: 60,
      ettrWithout: printed.ettr,
    });
    expect(printed.hotSwap.ettr).toBe(printed.hotSwap.run.ettr);
    const set = JSON.parse((await runCli(simulateCommand(), ['ettr', '--days', '2', '--json', '--swap-seconds', '25'])).stdout) as {
      hotSwap: Record<string, unknown>;
    };
    expect(set.hotSwap).toMatchObject({ swapSeconds: 25, figures: 'set' });
  });

  it('shows the hot swap beside steadfast in the table, and leaves it out with --no-hot-swap', async () => {
    const on = await runCli(simulateCommand(), ['ettr', '--days', '10']);
    expect(on.stdout).toContain('+ hot swap');
    expect(on.stdout).toMatch(/hot swap \(DeadPool §V-C, §VI\): ETTR \d+\.\d\d % with, \d+\.\d\d % without/);
    expect(on.stdout).toContain('swap 43.2 s (DeadPool §VII-B3');
    const off = await runCli(simulateCommand(), ['ettr', '--days', '10', '--no-hot-swap', '--json']);
    expect((JSON.parse(off.stdout) as { hotSwap: unknown }).hotSwap).toBeNull();
  });

  it('refuses a fallback share outside 0..1 and an unknown source of figures', async () => {
    expect((await runCli(simulateCommand(), ['ettr', '--swap-fallback', '1.5'])).exitCode).toBe(2);
    const unknown = await runCli(simulateCommand(), ['ettr', '--swap-figures', 'paper']);
    expect(unknown.exitCode).toBe(2);
    expect(unknown.stderr).toContain('deadpool, lab');
  });
});
