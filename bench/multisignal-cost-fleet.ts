import { createWriteStream } from 'node:fs';
import { seededUniform } from '../core/random.js';
import { AGENT_SCRAPE_JOB } from '../core/scrape.js';
import { HOUR, MINUTE, nodeName, type Confuser, type FleetPlan, type JobPhase, type NodeTraits } from './heldout/fleet.js';
import { noise } from './heldout/timeline.js';

/** The one-job fleet bench/multisignal-cost.ts measures the detector over, and the series it adds to bench/heldout's writer. */

export const GPUS = 8;
export const STEP_SECONDS = 30;
export const JOB = 'pretrain';

/**
 * A healthy fleet of one job on every node: per-node and per-GPU offsets (some nodes run warmer),
 * checkpoints every 100 minutes, and a few application Xids early on (their counters live on
 * until a reboot, so the Xid queries read real series), but no fault, reboot or restart.
 */
export function costPlan(nodes: number, start: number, hours: number, seed = 1024): FleetPlan {
  const random = seededUniform(seed + nodes);
  const between = (low: number, high: number) => low + (high - low) * random();
  const end = start + hours * HOUR;
  const names = Array.from({ length: nodes }, (_, index) => nodeName(index));
  const traits = new Map<string, NodeTraits>();
  for (const node of names) {
    const warm = random() < 0.125 ? between(4, 7) : 0;
    traits.set(node, {
      temperatureOffset: warm + between(-1.5, 1.5),
      gpuOffsets: Array.from({ length: GPUS }, () => between(-2, 2)),
      powerScale: between(0.96, 1.04),
    });
  }
  const phases: JobPhase[] = [];
  // Checkpoints, none in the last 80 minutes (where the online evaluations are timed).
  for (let at = start + 100 * MINUTE; at < end - 80 * MINUTE; at += 100 * MINUTE) phases.push({ kind: 'checkpoint', from: at, to: at + 5 * MINUTE });
  const confusers: Confuser[] = [];
  // About one application Xid per 64 nodes in the first hour (a crash each, no restart here).
  for (let index = 0; index < Math.max(1, Math.round(nodes / 64)); index += 1) {
    const node = names[Math.floor(random() * nodes)] as string;
    confusers.push({
      kind: 'app_xid',
      node,
      gpu: Math.floor(random() * GPUS),
      xid: [13, 31, 43][index % 3] as number,
      at: start + Math.round(between(10, 50)) * MINUTE,
      job: JOB,
    });
  }
  return {
    seed,
    start,
    end,
    stepMs: STEP_SECONDS * 1000,
    nodes: names,
    gpusPerNode: GPUS,
    traits,
    jobs: [{ name: JOB, nodes: names, from: start, to: end, iterationSeconds: 2.4, phases }],
    faults: [],
    confusers,
  };
}

/**
 * The agent's series a feature query reads that bench/heldout's writer leaves out, as a healthy
 * node exports them: the two other hardware clock-event reasons the slowdown share counts
 * (hw_slowdown, sw_thermal_slowdown), whether a row remap is pending, and the transport's
 * retransmits and ack timeouts per port (newer drivers). Written family by family to `path`.
 */
export async function writeExtraSeries(plan: FleetPlan, path: string): Promise<number> {
  const out = createWriteStream(path);
  const steps = Math.floor((plan.end - plan.start) / plan.stepMs);
  const stamps = Array.from({ length: steps }, (_, step) => ` ${(plan.start + step * plan.stepMs) / 1000}\n`);
  let samples = 0;
  let chunk: string[] = [];
  const flush = async () => {
    if (!out.write(chunk.join(''))) await new Promise<void>((resolve) => out.once('drain', () => resolve()));
    chunk = [];
  };
  const labels = (values: Record<string, string | number>) =>
    `{${Object.entries(values)
      .map(([name, value]) => `${name}="${value}"`)
      .join(',')}}`;
  const base = (node: string) => ({ job: AGENT_SCRAPE_JOB, instance: `${node}:9835`, node });
  const gpus = (node: string) =>
    Array.from({ length: plan.gpusPerNode }, (_, gpu) => ({ ...base(node), gpu, pci_bus_id: `0000:${(0x18 + gpu * 0x10).toString(16)}:00` }));
  const series = async (key: string, value: (step: number) => number) => {
    for (let step = 0; step < steps; step += 1) {
      chunk.push(`${key} ${value(step)}${stamps[step]}`);
      samples += 1;
      if (chunk.length >= 20_000) await flush();
    }
  };
  chunk.push('# TYPE steadfast_gpu_throttle_reason gauge\n');
  for (const node of plan.nodes)
    for (const gpu of gpus(node))
      for (const reason of ['hw_slowdown', 'sw_thermal_slowdown']) await series(`steadfast_gpu_throttle_reason${labels({ ...gpu, reason })}`, () => 0);
  chunk.push('# TYPE steadfast_gpu_remapped_rows_pending gauge\n');
  for (const node of plan.nodes) for (const gpu of gpus(node)) await series(`steadfast_gpu_remapped_rows_pending${labels(gpu)}`, () => 0);
  for (const [counter, rate] of [
    ['retransmits', 0.02],
    ['ack_timeouts', 0.002],
  ] as const) {
    chunk.push(`# TYPE steadfast_rdma_port_${counter} counter\n`);
    for (const [nodeIndex, node] of plan.nodes.entries()) {
      for (let port = 0; port < 4; port += 1) {
        let total = 0;
        const key = (nodeIndex + 1) * 7_368_787 + port * 17 + counter.length;
        await series(
          `steadfast_rdma_port_${counter}_total${labels({ ...base(node), device: `mlx5_${port}`, port: 1 })}`,
          (step) => (total += noise(key, step) < rate ? 1 : 0),
        );
      }
    }
  }
  chunk.push('# EOF\n');
  await flush();
  await new Promise<void>((resolve, reject) => out.end((error?: Error | null) => (error ? reject(error) : resolve())));
  return samples;
}
