import type { GpuResetReport } from '../../core/remedy.js';

/** Resets one GPU on a node: the agent's POST /api/v1/gpu-reset, or a recorder under dry-run. */
export interface GpuResetter {
  reset(node: string, gpu: string, timeoutSeconds: number): Promise<GpuResetReport>;
}

/** Dry-run: reports the reset as done without asking any agent. */
export class DryRunGpuResetter implements GpuResetter {
  async reset(node: string, gpu: string): Promise<GpuResetReport> {
    return { node, gpu, index: null, outcome: 'reset', processes: [], stopped: [], reason: 'dry-run: no agent was asked', seconds: 0 };
  }
}
