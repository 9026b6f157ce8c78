import { isComputeProcess, type GpuProcess } from './sources/nvidia-smi-xml.js';

/**
 * Which processes hold a context on which GPU, as the gpu collector's last poll listed them
 * (nvidia-smi's `<processes>`, or `--query-compute-apps` beside dcgm-exporter), shared with the
 * process collector: a process running CUDA work on a GPU is a training rank whatever its
 * environment says (`python3 train.py` with no RANK, LOCAL_RANK or SLURM_PROCID), and a stuck or
 * slow rank can be tied to its GPU. Pids are those nvidia-smi reports: the agent's own pid
 * namespace, which is the host's where the agent runs there (systemd, hostPID).
 */

export interface GpuProcessHolding extends GpuProcess {
  /** The GPU: its index, and its PCI bus id and UUID where known. */
  readonly gpu: string;
  readonly pciBusId?: string | undefined;
  readonly uuid?: string | undefined;
}

export class GpuProcessBoard {
  private holdings: readonly GpuProcessHolding[] | undefined;

  /** Replaces the list with a poll's; undefined: the source lists no processes (not "none"). */
  update(holdings: readonly GpuProcessHolding[] | undefined): void {
    this.holdings = holdings;
  }

  /** The last poll's list, or undefined before one or where the source lists none. */
  get current(): readonly GpuProcessHolding[] | undefined {
    return this.holdings;
  }

  /** Pids with a compute (CUDA) context on some GPU; empty while unknown. */
  computePids(): ReadonlySet<number> {
    return new Set((this.holdings ?? []).filter(isComputeProcess).map((holding) => holding.pid));
  }

  /** The GPUs one pid holds. */
  gpusOf(pid: number): GpuProcessHolding[] {
    return (this.holdings ?? []).filter((holding) => holding.pid === pid);
  }
}
