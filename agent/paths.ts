/**
 * Where the collectors find what a node offers (/sys, /proc, the kernel log, nvidia-smi), as the
 * agent's `--path.*` and `--nvidia-smi.*` flags give it. Constructor arguments, never globals, so
 * that tests run in parallel on fixture trees. Its own module so that the GPU source (gpu-source.ts)
 * and the collector framework (collector.ts), which names that source, do not import each other.
 */

/** Where a collector finds its sources. */
export interface CollectorPaths {
  /** Root of /sys. */
  readonly sysfs: string;
  /** Root of /proc. */
  readonly procfs: string;
  /** Kernel log to follow: /dev/kmsg or a plain log file. */
  readonly kmsg: string;
  /** A captured `nvidia-smi -q -x` file to read instead of running nvidia-smi. */
  readonly nvidiaSmiXml?: string | undefined;
  /** The nvidia-smi binary. */
  readonly nvidiaSmi: string;
}
