import type { EttrComparison } from './compare.js';
import { DEADPOOL_SWAP, LAB_SWAP_TARGET_SECONDS, type HotSwapParams } from './hot-swap.js';
import type { StrategyResult } from './result.js';

/** The hot swap's lines of the report: steadfast with and without it, on the same incidents. */

function round(value: number, digits: number): number {
  const factor = 10 ** digits;
  return Math.round(value * factor) / factor;
}

function unproductive(result: StrategyResult): number {
  return result.wallHours - result.productiveHours;
}

/** Where the swap's time came from, in words. */
export function swapSource(params: HotSwapParams, gpus: number): string {
  switch (params.figures) {
    case 'deadpool':
      return (
        `DeadPool §VII-B3: ${DEADPOOL_SWAP.smallSeconds} s at ${DEADPOOL_SWAP.smallGpus} GPUs to ${DEADPOOL_SWAP.largeSeconds} s at ${DEADPOOL_SWAP.largeGpus}, ` +
        `the same seconds per doubling of GPUs, at ${gpus.toLocaleString('en-US')} GPUs`
      );
    case 'lab':
      return `the lab's target of ${LAB_SWAP_TARGET_SECONDS} s (not yet measured), not scaled`;
    case 'set':
      return 'set with --swap-seconds';
  }
}

/** The `hotSwap` object of the JSON report; null when the run with hot swap was left out. */
export function hotSwapJson(comparison: EttrComparison): Record<string, unknown> | null {
  const { params, hotSwap } = comparison;
  const swap = params.hotSwap;
  if (hotSwap === undefined || swap === null) return null;
  const without = comparison.strategies.steadfast;
  const gpus = params.nodes * params.gpusPerNode;
  return {
    ettr: round(hotSwap.ettr, 5),
    ettrWithout: round(without.ettr, 5),
    unproductiveHours: round(unproductive(hotSwap), 2),
    unproductiveHoursWithout: round(unproductive(without), 2),
    swapSeconds: round(swap.swapSeconds, 2),
    figures: swap.figures,
    source: swapSource(swap, gpus),
    deadpoolRestartSeconds: DEADPOOL_SWAP.restartSeconds,
    boundSeconds: swap.boundSeconds,
    timeoutSeconds: swap.timeoutSeconds,
    fallbackShare: swap.fallbackShare,
    stepSeconds: swap.stepSeconds,
    spares: swap.spares,
    sparesCost: 'GPU-hours the idle spares hold, a cost outside ETTR like the warm standbys',
    ...hotSwap.hotSwap,
    ...(hotSwap.hotSwap === undefined ? {} : { reservedGpuHours: Math.round(hotSwap.hotSwap.reservedGpuHours) }),
  };
}

/** The hot swap's paragraph of the text report; empty when it was left out. */
export function hotSwapText(comparison: EttrComparison): string[] {
  const { params, hotSwap } = comparison;
  const swap = params.hotSwap;
  if (hotSwap === undefined || swap === null) return [];
  const without = comparison.strategies.steadfast;
  const gpus = params.nodes * params.gpusPerNode;
  const pct = (value: number): string => `${(value * 100).toFixed(2)} %`;
  const usage = hotSwap.hotSwap;
  const lines = [
    '',
    `hot swap (DeadPool §V-C, §VI): ETTR ${pct(hotSwap.ettr)} with, ${pct(without.ettr)} without ` +
      `(${((hotSwap.ettr - without.ettr) * 100).toFixed(2)} points; unproductive hours ${unproductive(hotSwap).toFixed(2)} against ${unproductive(without).toFixed(2)})`,
    `  swap ${swap.swapSeconds.toFixed(1)} s (${swapSource(swap, gpus)}; restart from checkpoint there: ${DEADPOOL_SWAP.restartSeconds} s); ` +
      `bound ${swap.boundSeconds} s; ${(swap.fallbackShare * 100).toFixed(0)} % of swaps fall back to the relaunch after it; a swap loses at most one ${swap.stepSeconds} s step`,
  ];
  if (usage !== undefined) {
    lines.push(
      `  ${usage.swaps} swaps (${usage.nodesSwapped} nodes), ${usage.fallbacks} fell back; ${usage.noSpare} machine evictions found too few spares and relaunched; ` +
        `${swap.spares} spares held idle: ${Math.round(usage.reservedGpuHours).toLocaleString('en-US')} GPU-hours, a cost outside ETTR like the warm standbys'`,
    );
  }
  return lines;
}
