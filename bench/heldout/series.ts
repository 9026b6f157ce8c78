import { createWriteStream } from 'node:fs';
import { classifyXid } from '../../core/xid.js';
import { AGENT_SCRAPE_JOB, RANK_LABEL, TRAINING_JOB_LABEL } from '../../core/scrape.js';
import type { FleetPlan } from './fleet.js';
import {
  DOWN,
  IDLE,
  STOPPED,
  TRAINING,
  applyFault,
  effectsOf,
  gaussian,
  healthyEffect,
  linkEffect,
  mountEffect,
  noise,
  type GpuEffect,
  type NodeTimeline,
} from './timeline.js';

/**
 * The agents' series for a planned fleet, as OpenMetrics text for `promtool tsdb
 * create-blocks-from openmetrics`: the metric names and labels of agent/collectors (gpu, xid,
 * rdma, nfs, training), with the `job`, `instance` and `node` labels the scrape adds. Counters
 * are counters: they only grow, and start again from 0 when the node reboots. A node that is down
 * has no samples at all; a GPU that fell off the bus keeps only `steadfast_gpu_present 0`.
 */

const RDMA_PORTS = 4;
const NFS_OPERATIONS = ['GETATTR', 'READ', 'WRITE'] as const;
type NfsOperation = (typeof NFS_OPERATIONS)[number];
/** Mean round trip per operation on a quiet mount, seconds. */
const NFS_RTT: Record<NfsOperation, number> = { GETATTR: 0.0004, READ: 0.002, WRITE: 0.004 };

/** One series: its name with labels, and its value at a step (undefined: not exported then). */
interface Series {
  readonly key: string;
  readonly value: (step: number) => number | undefined;
}

/** A Poisson draw with mean `mean` from one uniform number (inverse CDF; means here are small). */
function poisson(mean: number, uniform: number): number {
  if (mean <= 0) return 0;
  let count = 0;
  let term = Math.exp(-mean);
  let cumulative = term;
  while (uniform > cumulative && count < 1000) {
    count += 1;
    term *= mean / count;
    cumulative += term;
  }
  return count;
}

function labelText(labels: Record<string, string | number>): string {
  return `{${Object.entries(labels)
    .map(([name, value]) => `${name}="${value}"`)
    .join(',')}}`;
}

/** A counter that adds `increment(step)` each step it is exported and restarts from 0 after the node was down. */
function counter(key: string, line: NodeTimeline, increment: (step: number) => number | undefined): Series {
  let total = 0;
  return {
    key,
    value: (step) => {
      if (line.mode[step] === DOWN) return undefined;
      const added = increment(step);
      if (added === undefined) return undefined;
      if (step > 0 && line.mode[step - 1] === DOWN) total = 0;
      total += added;
      return total;
    },
  };
}

function gauge(key: string, line: NodeTimeline, value: (step: number) => number | undefined): Series {
  return { key, value: (step) => (line.mode[step] === DOWN ? undefined : value(step)) };
}

/** Every series of one node, grouped by metric family (the OpenMetrics text must keep a family together). */
export function nodeSeries(plan: FleetPlan, node: string, line: NodeTimeline): Map<string, Series[]> {
  const families = new Map<string, Series[]>();
  const add = (family: string, series: Series) => {
    const list = families.get(family) ?? [];
    list.push(series);
    families.set(family, list);
  };
  const nodeIndex = plan.nodes.indexOf(node);
  const traits = plan.traits.get(node);
  const faults = plan.faults.filter((fault) => fault.node === node);
  const spikes = plan.confusers.filter((confuser) => confuser.kind === 'spike' && confuser.node === node);
  const timeOf = (step: number) => plan.start + step * plan.stepMs;
  const stepOf = (time: number) => Math.round((time - plan.start) / plan.stepMs);
  const base = { job: AGENT_SCRAPE_JOB, instance: `${node}:9835`, node };
  const seed = (nodeIndex + 1) * 7_368_787;
  const effects = effectsOf(plan);

  for (let gpu = 0; gpu < plan.gpusPerNode; gpu += 1) {
    const pciBusId = `0000:${(0x18 + gpu * 0x10).toString(16)}:00`;
    const labels = { ...base, gpu, pci_bus_id: pciBusId };
    const key = seed + gpu * 131;
    const effectAt = (step: number): GpuEffect => {
      const effect = healthyEffect();
      for (const fault of faults) applyFault(effect, fault, gpu, step, timeOf(step), effects);
      return effect;
    };
    const spikeKind = (step: number): number => {
      const spike = spikes.findIndex((confuser) => confuser.kind === 'spike' && confuser.gpu === gpu && stepOf(confuser.at) === step);
      return spike < 0 ? -1 : (stepOf((spikes[spike] as { at: number }).at) + spike) % 4;
    };
    const healthy = faults.length === 0;
    const trickle = plan.confusers.reduce(
      (sum, event) => sum + (event.kind === 'replay_trickle' && event.node === node && event.gpu === gpu ? event.perSample : 0),
      0,
    );
    const effect = (step: number): GpuEffect | undefined => {
      const value = healthy ? HEALTHY : effectAt(step);
      return value.gone ? undefined : value;
    };
    const utilization = (step: number, value: GpuEffect) => Math.min(1, Math.max(0, (line.load[step] ?? 0) * value.utilization + 0.012 * gaussian(key, step)));
    const temperature = (step: number, value: GpuEffect) =>
      33 +
      32 * utilization(step, value) +
      (traits?.temperatureOffset ?? 0) +
      (traits?.gpuOffsets[gpu] ?? 0) +
      value.temperature +
      0.5 * gaussian(key + 1, step) +
      (spikeKind(step) === 0 ? 12 : 0);
    const withEffect = (compute: (step: number, value: GpuEffect) => number) => (step: number) => {
      const value = effect(step);
      return value === undefined ? undefined : compute(step, value);
    };

    add(
      'steadfast_gpu_present',
      gauge(`steadfast_gpu_present${labelText(labels)}`, line, (step) => (healthy || !effectAt(step).gone ? 1 : 0)),
    );
    add('steadfast_gpu_utilization_ratio', gauge(`steadfast_gpu_utilization_ratio${labelText(labels)}`, line, withEffect(utilization)));
    add('steadfast_gpu_temperature_celsius', gauge(`steadfast_gpu_temperature_celsius${labelText(labels)}`, line, withEffect(temperature)));
    add(
      'steadfast_gpu_memory_temperature_celsius',
      gauge(
        `steadfast_gpu_memory_temperature_celsius${labelText(labels)}`,
        line,
        withEffect((step, value) => temperature(step, value) + 3 + value.memoryTemperature + 0.4 * gaussian(key + 2, step)),
      ),
    );
    add(
      'steadfast_gpu_power_watts',
      gauge(
        `steadfast_gpu_power_watts${labelText(labels)}`,
        line,
        withEffect((step, value) =>
          Math.max(
            40,
            70 + 600 * utilization(step, value) * value.power * (traits?.powerScale ?? 1) + 8 * gaussian(key + 3, step) - (spikeKind(step) === 1 ? 250 : 0),
          ),
        ),
      ),
    );
    add(
      'steadfast_gpu_clock_hertz',
      gauge(
        `steadfast_gpu_clock_hertz${labelText({ ...labels, clock: 'sm' })}`,
        line,
        withEffect(
          (step, value) => Math.round(((line.load[step] ?? 0) > 0.05 ? 1.98e9 * value.clock * (1 + 0.004 * gaussian(key + 4, step)) : 3.45e8) / 1e6) * 1e6,
        ),
      ),
    );
    for (const [reason, flag] of [
      ['hw_thermal_slowdown', 'thermal'],
      ['hw_power_brake_slowdown', 'brake'],
    ] as const) {
      add(
        'steadfast_gpu_throttle_reason',
        gauge(
          `steadfast_gpu_throttle_reason${labelText({ ...labels, reason })}`,
          line,
          withEffect((_step, value) => (value[flag] ? 1 : 0)),
        ),
      );
    }
    const draw = (offset: number, mean: (step: number, value: GpuEffect) => number) =>
      withEffect((step, value) => poisson(mean(step, value), noise(key + offset, step)));
    add(
      'steadfast_gpu_ecc_errors',
      counter(
        `steadfast_gpu_ecc_errors_total${labelText({ ...labels, scope: 'volatile', type: 'correctable', location: 'dram' })}`,
        line,
        draw(5, (step, value) => value.ecc + 0.0003 + (spikeKind(step) === 2 ? 6 : 0)),
      ),
    );
    add(
      'steadfast_gpu_remapped_rows',
      counter(
        `steadfast_gpu_remapped_rows_total${labelText({ ...labels, type: 'correctable' })}`,
        line,
        draw(6, (_step, value) => value.remaps),
      ),
    );
    add(
      'steadfast_gpu_pcie_replay_errors',
      counter(
        `steadfast_gpu_pcie_replay_errors_total${labelText(labels)}`,
        line,
        draw(7, (step, value) => value.replays + 0.0002 + trickle + (spikeKind(step) === 3 ? 4 : 0)),
      ),
    );

    // An Xid counter is born at its first increment and lives until the node reboots.
    const xids = [
      ...faults.filter((fault) => fault.gpu === gpu && fault.xid !== undefined).map((fault) => ({ xid: fault.xid as number, at: fault.failure })),
      ...plan.confusers.flatMap((confuser) =>
        confuser.kind === 'app_xid' && confuser.node === node && confuser.gpu === gpu ? [{ xid: confuser.xid, at: confuser.at }] : [],
      ),
    ];
    for (const event of xids) {
      const born = stepOf(event.at);
      const severity = classifyXid(event.xid).severity;
      let alive = true;
      add(
        'steadfast_xid_errors',
        gauge(`steadfast_xid_errors_total${labelText({ ...base, pci_bus_id: pciBusId, xid: event.xid, severity })}`, line, (step) => {
          if (step < born || !alive) return undefined;
          if (step > born && line.mode[step - 1] === DOWN) alive = false;
          return alive ? 1 : undefined;
        }),
      );
    }
  }

  const key = seed + 5003;
  const training = (step: number) => line.mode[step] === TRAINING;
  for (let port = 0; port < RDMA_PORTS; port += 1) {
    const labels = labelText({ ...base, device: `mlx5_${port}`, port: 1 });
    const link = (step: number) =>
      faults.reduce(
        (sum, fault) => {
          const effect = linkEffect(fault, port, timeOf(step), effects);
          return { symbols: sum.symbols + effect.symbols, receive: sum.receive + effect.receive, down: sum.down || effect.down };
        },
        { symbols: 0, receive: 0, down: false },
      );
    const linkDownAt = faults.filter((fault) => fault.kind === 'ib_link' && fault.gpu % RDMA_PORTS === port).map((fault) => stepOf(fault.failure));
    add(
      'steadfast_rdma_port_data_transmitted_bytes',
      counter(`steadfast_rdma_port_data_transmitted_bytes_total${labels}`, line, (step) =>
        link(step).down
          ? 0
          : Math.round((training(step) || line.mode[step] === STOPPED ? 6e9 * (line.traffic[step] ?? 0) : 2e4) * (1 + 0.03 * gaussian(key + port, step)) * 30),
      ),
    );
    add(
      'steadfast_rdma_port_symbol_errors',
      counter(`steadfast_rdma_port_symbol_errors_total${labels}`, line, (step) => poisson(0.0003 + link(step).symbols, noise(key + 10 + port, step))),
    );
    add(
      'steadfast_rdma_port_receive_errors',
      counter(`steadfast_rdma_port_receive_errors_total${labels}`, line, (step) => poisson(0.0001 + link(step).receive, noise(key + 20 + port, step))),
    );
    add(
      'steadfast_rdma_port_link_downed',
      counter(`steadfast_rdma_port_link_downed_total${labels}`, line, (step) => (linkDownAt.includes(step) ? 1 : 0)),
    );
  }

  const mount = (step: number) =>
    faults.reduce(
      (sum, fault) => {
        const effect = mountEffect(fault, timeOf(step), effects);
        return {
          rtt: sum.rtt * effect.rtt,
          retransmit: sum.retransmit + effect.retransmit,
          backlog: sum.backlog + effect.backlog,
          timeouts: sum.timeouts + effect.timeouts,
        };
      },
      { rtt: 1, retransmit: 0, backlog: 0, timeouts: 0 },
    );
  const opsPerSecond = (operation: NfsOperation, step: number): number => {
    const mode = line.mode[step];
    const writing = line.checkpoint[step] !== 0;
    if (mode === IDLE) return { GETATTR: 1, READ: 0.2, WRITE: 0.1 }[operation];
    if (mode === STOPPED) return { GETATTR: 8, READ: 400, WRITE: 0.5 }[operation]; // reloading the checkpoint
    return { GETATTR: writing ? 60 : 40, READ: writing ? 20 : 150, WRITE: writing ? 450 : 3 }[operation];
  };
  const operations = (operation: NfsOperation, step: number) =>
    Math.round(opsPerSecond(operation, step) * 30 * (1 + 0.05 * gaussian(key + 40 + operation.length, step)));
  for (const operation of NFS_OPERATIONS) {
    const labels = labelText({ ...base, mount: '/mnt/shared', operation });
    add(
      'steadfast_nfs_operations',
      counter(`steadfast_nfs_operations_total${labels}`, line, (step) => operations(operation, step)),
    );
    add(
      'steadfast_nfs_transmissions',
      counter(`steadfast_nfs_transmissions_total${labels}`, line, (step) => {
        const count = operations(operation, step);
        return count + poisson(count * (0.0005 + mount(step).retransmit), noise(key + 50, step));
      }),
    );
    add(
      'steadfast_nfs_rtt_seconds',
      counter(`steadfast_nfs_rtt_seconds_total${labels}`, line, (step) => {
        // Checkpoints fill the client's RPC slots on every node of the job at once (the 504-GPU report, second finding);
        // rank 0 writing alone fills only its own, its metadata lookups (GETATTR) waiting most.
        const saturated =
          line.checkpoint[step] === 1 ? (operation === 'WRITE' ? 5 : 3) : line.checkpoint[step] === 2 ? { GETATTR: 4, READ: 1.5, WRITE: 3 }[operation] : 1;
        return operations(operation, step) * NFS_RTT[operation] * saturated * mount(step).rtt * (1 + 0.1 * gaussian(key + 60, step));
      }),
    );
    if (operation === 'READ') {
      add(
        'steadfast_nfs_major_timeouts',
        counter(`steadfast_nfs_major_timeouts_total${labels}`, line, (step) => poisson(mount(step).timeouts, noise(key + 70, step))),
      );
    }
  }
  add(
    'steadfast_nfs_rpc_backlog_average',
    gauge(`steadfast_nfs_rpc_backlog_average${labelText({ ...base, mount: '/mnt/shared' })}`, line, (step) =>
      Math.max(
        0,
        (line.checkpoint[step] === 1
          ? 25 + 5 * gaussian(key + 80, step)
          : line.checkpoint[step] === 2
            ? 10 + 3 * gaussian(key + 80, step)
            : 0.2 * noise(key + 81, step)) + mount(step).backlog,
      ),
    ),
  );

  for (const job of plan.jobs) {
    if (!job.nodes.includes(node)) continue;
    const jobIndex = plan.jobs.indexOf(job);
    const labels = labelText({ ...base, [TRAINING_JOB_LABEL]: job.name, [RANK_LABEL]: job.nodes.indexOf(node) * plan.gpusPerNode });
    add(
      'steadfast_training_iteration_seconds',
      gauge(`steadfast_training_iteration_seconds${labels}`, line, (step) => {
        const seconds = line.iteration[step] ?? Number.NaN;
        return line.job[step] === jobIndex && Number.isFinite(seconds) ? seconds * (1 + 0.01 * gaussian(key + 90, step)) : undefined;
      }),
    );
  }
  for (const collector of ['gpu', 'xid'])
    add(
      'steadfast_collector_success',
      gauge(`steadfast_collector_success${labelText({ ...base, collector })}`, line, () => 1),
    );
  return families;
}

const HEALTHY: GpuEffect = healthyEffect();

/**
 * Writes the series of `nodes` to `path` as OpenMetrics, family by family; returns the number of
 * samples written.
 */
export async function writeOpenMetrics(plan: FleetPlan, timelines: ReadonlyMap<string, NodeTimeline>, nodes: readonly string[], path: string): Promise<number> {
  const out = createWriteStream(path);
  const steps = Math.floor((plan.end - plan.start) / plan.stepMs);
  const stamps = Array.from({ length: steps }, (_, step) => ` ${(plan.start + step * plan.stepMs) / 1000}\n`);
  const byFamily = new Map<string, Series[]>();
  for (const node of nodes) {
    for (const [family, series] of nodeSeries(plan, node, timelines.get(node) as NodeTimeline))
      byFamily.set(family, [...(byFamily.get(family) ?? []), ...series]);
  }
  let samples = 0;
  let chunk: string[] = [];
  const flush = async () => {
    if (!out.write(chunk.join(''))) await new Promise<void>((resolve) => out.once('drain', () => resolve()));
    chunk = [];
  };
  for (const [family, list] of byFamily) {
    const type = list[0]?.key.includes('_total{') ? 'counter' : 'gauge';
    chunk.push(`# TYPE ${family} ${type}\n`);
    for (const series of list) {
      for (let step = 0; step < steps; step += 1) {
        const value = series.value(step);
        if (value === undefined) continue;
        chunk.push(`${series.key} ${Number.isInteger(value) ? value : value.toFixed(3)}${stamps[step]}`);
        samples += 1;
        if (chunk.length >= 20_000) await flush();
      }
    }
  }
  chunk.push('# EOF\n');
  await flush();
  await new Promise<void>((resolve, reject) => out.end((error?: Error | null) => (error ? reject(error) : resolve())));
  return samples;
}
