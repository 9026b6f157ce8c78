import type { CollectorContext } from '../../collector.js';
import type { NvmlClient } from '../../sources/nvml/client.js';
import type { GpuSample } from '../../sources/nvidia-smi-xml.js';
import { NvmlXidEvents } from './nvml-events.js';

/**
 * The gpu collector's NVML source: one poll is one request to the agent's NVML thread
 * (sources/nvml/worker.ts), which reads every GPU through the library in-process, under a time
 * limit. A call stuck in the driver fails the poll as a timeout and holds that thread alone;
 * later polls fail at once, naming the call, until it returns. After the first good poll the
 * source also listens for the thread's Xid events (nvml-events.ts).
 */

export interface NvmlGpuSource {
  readonly description: string;
  readonly command: string;
  read(signal: AbortSignal): Promise<{ gpus: readonly GpuSample[] }>;
  close(): Promise<void>;
}

/** `pollNow`: asks the collector for a poll at once (the Xid event wait failed: a GPU may be lost). */
export function nvmlGpuSource(context: CollectorContext, nvml: NvmlClient, timeoutMs: number, pollNow: () => void): NvmlGpuSource {
  let events: NvmlXidEvents | undefined;
  let closed = false;
  return {
    description: `NVML (${nvml.library})`,
    command: 'nvml',
    async read(signal) {
      const result = await nvml.poll(timeoutMs, signal);
      if (events === undefined && !closed && result.gpus.length > 0) {
        events = new NvmlXidEvents(context, nvml, pollNow);
        events.start(timeoutMs);
      }
      return { gpus: result.gpus };
    },
    async close() {
      closed = true;
      events?.close();
    },
  };
}
