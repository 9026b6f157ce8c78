import { InputError } from '../core/errors.js';
import type { CollectorFactory } from './collector.js';
import { diagnoseCollectorFactory } from './collectors/diagnose.js';
import { gpuCollectorFactory } from './collectors/gpu/collector.js';
import { gpuResetCollectorFactory } from './collectors/gpu-reset.js';
import { nfsCollectorFactory } from './collectors/nfs/collector.js';
import { nvlinkCollectorFactory } from './collectors/nvlink.js';
import { processCollectorFactory } from './collectors/process.js';
import { rdmaCollectorFactory } from './collectors/rdma.js';
import { trainingCollectorFactory } from './collectors/training/collector.js';
import { validateCollectorFactory } from './collectors/validate.js';
import { kernelLogCollectorFactory } from './collectors/kernel-log/collector.js';

/**
 * The node agent's collector registry. The agent itself (HTTP server, exposition, fast-path
 * client, standby reporter, log follower, bounded commands) sits beside this file;
 * collectors/ holds one Collector per file, or per folder (collectors/<name>/collector.ts and the
 * parts only it uses; the `xid` collector's is kernel-log/, for all it reads there);
 * sources/ holds the readers and parsers of what a node offers (nvidia-smi, dcgm-exporter, the
 * kernel log, sysfs, procfs, training logs, py-spy, flight-recorder dumps), free of metrics.
 */

/** Every collector the agent knows, in the order they appear in `--help`. */
export const COLLECTOR_FACTORIES: readonly CollectorFactory[] = [
  gpuCollectorFactory,
  nvlinkCollectorFactory,
  kernelLogCollectorFactory,
  rdmaCollectorFactory,
  nfsCollectorFactory,
  trainingCollectorFactory,
  processCollectorFactory,
  diagnoseCollectorFactory,
  gpuResetCollectorFactory,
  validateCollectorFactory,
];

/**
 * The collectors to run: each one's default, overridden by `--collector.<name>` (true) or
 * `--no-collector.<name>` (false). A name that is not a collector is an error, not ignored.
 */
export function enabledFactories(
  choices: Readonly<Record<string, boolean | undefined>>,
  factories: readonly CollectorFactory[] = COLLECTOR_FACTORIES,
): CollectorFactory[] {
  const known = new Set(factories.map((factory) => factory.name));
  for (const name of Object.keys(choices)) {
    if (!known.has(name)) throw new InputError(`unknown collector "${name}"; known: ${[...known].join(', ')}`, `collector.${name}`);
  }
  return factories.filter((factory) => choices[factory.name] ?? factory.defaultEnabled);
}
