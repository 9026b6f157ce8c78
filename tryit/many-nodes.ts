import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Registry } from 'prom-client';
import type { Logger } from '../core/log.js';
import { silentLogger } from '../core/log.js';
import { TRAINING_JOB_LABEL } from '../core/scrape.js';
import { createFastPathClient, type FastPathSender } from '../agent/fast-path-client.js';
import type { ScrapeTarget } from './parts.js';

/**
 * Many simulated GPU nodes behind one HTTP server, for scale runs where one real agent per node
 * would cost more than the thing being measured. Each node's exposition is served at
 * `/nodes/<name>/metrics` with the agent's metric names and labels (the gpu, xid and rdma
 * collectors' core series, training progress for nodes of a job), so the shipped rules fire on
 * it unchanged; Prometheus scrapes each node as its own target (`__metrics_path__`, a `node`
 * label). A fault is injected the way the agent reports it: its counter rises for the next
 * scrape, and with the fast path the agent's own fast-path client posts the event.
 */

/** PCI bus numbers of the eight GPUs of an HGX board (as tryit/cluster.ts). */
const GPU_BUSES = ['18', '2a', '3a', '5d', '9a', 'ab', 'ba', 'db'];
const PORTS = ['mlx5_0', 'mlx5_1', 'mlx5_2', 'mlx5_3'];

interface NodeState {
  readonly gpusPresent: boolean[];
  readonly portsUp: boolean[];
  readonly linkDowned: number[];
  /** `pci_bus_id|xid|severity` → count. */
  readonly xids: Map<string, number>;
  /** Set for nodes that run a job's ranks. */
  training?: { readonly job: string; readonly rank: number };
}

export interface FleetOptions {
  readonly nodes: readonly string[];
  readonly gpusPerNode?: number;
  /** The controller's base URL for the fast path; without it no event is sent. */
  readonly controllerUrl?: string;
  /** Each node's agent credential (node-bound: one fast-path client per node). */
  readonly agentToken?: (node: string) => string;
  readonly logger?: Logger;
}

export class SimulatedFleet {
  private readonly states = new Map<string, NodeState>();
  private readonly server: Server;
  /** One fast-path client per node that reported, each with its node's credential. */
  private readonly fastPaths = new Map<string, FastPathSender>();
  private readonly started = Date.now();
  private port = 0;
  /** Scrapes served, for the bench. */
  scrapes = 0;

  constructor(private readonly options: FleetOptions) {
    const gpus = options.gpusPerNode ?? 8;
    for (const node of options.nodes) {
      this.states.set(node, {
        gpusPresent: Array.from({ length: gpus }, () => true),
        portsUp: PORTS.map(() => true),
        linkDowned: PORTS.map(() => 0),
        xids: new Map(),
      });
    }
    this.server = createServer((request, response) => {
      const match = /^\/nodes\/([^/]+)\/metrics$/.exec(request.url ?? '');
      const state = match ? this.states.get(decodeURIComponent(match[1] ?? '')) : undefined;
      if (!match || !state) {
        response.writeHead(404, { 'content-type': 'text/plain' }).end('no such node\n');
        return;
      }
      this.scrapes += 1;
      response.writeHead(200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' }).end(this.exposition(state));
    });
  }

  get nodes(): readonly string[] {
    return this.options.nodes;
  }

  async start(): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(0, '127.0.0.1', () => resolve());
    });
    this.port = (this.server.address() as AddressInfo).port;
  }

  /** One scrape target per node, each with its own path and `node` label. */
  targets(): ScrapeTarget[] {
    return this.options.nodes.map((node) => ({
      address: `127.0.0.1:${this.port}`,
      labels: { node, __metrics_path__: `/nodes/${encodeURIComponent(node)}/metrics` },
    }));
  }

  /** Marks the nodes as running ranks of `job` (one rank each, in order): they export training progress. */
  runJob(job: string, nodes: readonly string[]): void {
    nodes.forEach((node, rank) => {
      this.state(node).training = { job, rank };
    });
  }

  pciBusId(gpuIndex: number): string {
    return `0000:${GPU_BUSES[gpuIndex % GPU_BUSES.length] ?? '00'}:00`;
  }

  /**
   * A fatal Xid on one GPU: the counter the next scrape shows rises, and with `fastPath` the
   * event goes to the controller at once, as the agent's xid collector does.
   */
  injectXid(node: string, gpuIndex: number, xid: number, options: { fastPath: boolean; message?: string }): void {
    const state = this.state(node);
    const gpu = this.pciBusId(gpuIndex);
    const key = `${gpu}|${xid}|fatal`;
    state.xids.set(key, (state.xids.get(key) ?? 0) + 1);
    if (options.fastPath) {
      this.fastPathOf(node).send({ kind: 'xid', node, gpu, xid, message: options.message ?? 'GPU has fallen off the bus.', time: new Date().toISOString() });
    }
  }

  /** A port loses its link (a leaf switch down): state down, link_downed counts once. */
  portDown(node: string, portIndex: number): void {
    const state = this.state(node);
    if (state.portsUp[portIndex] === false) return;
    state.portsUp[portIndex] = false;
    state.linkDowned[portIndex] = (state.linkDowned[portIndex] ?? 0) + 1;
  }

  /** Resolves once every fast-path event has been sent (or dropped). */
  fastPathDrained(): Promise<void> {
    return Promise.all([...this.fastPaths.values()].map((client) => client.drained())).then(() => undefined);
  }

  async close(): Promise<void> {
    await Promise.all([...this.fastPaths.values()].map((client) => client.close()));
    await new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections();
    });
  }

  private fastPathOf(node: string): FastPathSender {
    let client = this.fastPaths.get(node);
    if (!client) {
      client = createFastPathClient({
        controllerUrl: this.options.controllerUrl,
        token: this.options.agentToken?.(node),
        registry: new Registry(),
        logger: this.options.logger ?? silentLogger(),
      });
      this.fastPaths.set(node, client);
    }
    return client;
  }

  private state(node: string): NodeState {
    const state = this.states.get(node);
    if (!state) throw new Error(`no simulated node ${node}`);
    return state;
  }

  /** The node's exposition: the same names, types and labels the agent's collectors use. */
  private exposition(state: NodeState): string {
    const seconds = (Date.now() - this.started) / 1000;
    const lines: string[] = [];
    const family = (name: string, type: 'gauge' | 'counter', help: string, samples: [string, number][]): void => {
      if (samples.length === 0) return;
      lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
      for (const [labels, value] of samples) lines.push(`${name}${labels ? `{${labels}}` : ''} ${value}`);
    };
    const gpuLabels = state.gpusPresent.map((_, index) => `gpu="${index}",pci_bus_id="${this.pciBusId(index)}"`);
    family('steadfast_collector_success', 'gauge', 'Whether the collector succeeded.', [
      ['collector="gpu"', 1],
      ['collector="xid"', 1],
      ['collector="rdma"', 1],
      ...(state.training ? ([['collector="training"', 1]] as [string, number][]) : []),
    ]);
    family('steadfast_gpu_attached', 'gauge', 'GPUs nvidia-smi lists.', [['', state.gpusPresent.filter(Boolean).length]]);
    family(
      'steadfast_gpu_present',
      'gauge',
      'Whether the GPU is listed.',
      gpuLabels.map((labels, index) => [labels, state.gpusPresent[index] ? 1 : 0]),
    );
    family(
      'steadfast_gpu_temperature_celsius',
      'gauge',
      'GPU temperature.',
      gpuLabels.map((labels) => [labels, 55]),
    );
    family(
      'steadfast_gpu_memory_temperature_celsius',
      'gauge',
      'GPU memory temperature.',
      gpuLabels.map((labels) => [labels, 60]),
    );
    family(
      'steadfast_gpu_power_watts',
      'gauge',
      'GPU power draw.',
      gpuLabels.map((labels) => [labels, 610]),
    );
    family(
      'steadfast_gpu_utilization_ratio',
      'gauge',
      'GPU utilisation.',
      gpuLabels.map((labels) => [labels, 0.97]),
    );
    family(
      'steadfast_gpu_clock_hertz',
      'gauge',
      'GPU clocks.',
      gpuLabels.map((labels) => [`${labels},clock="sm"`, 1_980_000_000]),
    );
    family(
      'steadfast_xid_errors_total',
      'counter',
      'NVIDIA Xid errors seen in the kernel log, by GPU, Xid code and severity.',
      [...state.xids].map(([key, count]) => {
        const [gpu, xid, severity] = key.split('|');
        return [`pci_bus_id="${gpu}",xid="${xid}",severity="${severity}"`, count];
      }),
    );
    const portLabels = PORTS.map((device) => `device="${device}",port="1"`);
    family(
      'steadfast_rdma_port_up',
      'gauge',
      'Port ACTIVE and LinkUp.',
      portLabels.map((labels, index) => [labels, state.portsUp[index] ? 1 : 0]),
    );
    family(
      'steadfast_rdma_port_state',
      'gauge',
      'Port logical state.',
      portLabels.map((labels, index) => [labels, state.portsUp[index] ? 4 : 1]),
    );
    family(
      'steadfast_rdma_port_link_downed_total',
      'counter',
      'Link down events.',
      portLabels.map((labels, index) => [labels, state.linkDowned[index] ?? 0]),
    );
    const bytes = Math.round(seconds * 12.5e9);
    family(
      'steadfast_rdma_port_data_transmitted_bytes_total',
      'counter',
      'Bytes sent.',
      portLabels.map((labels, index) => [labels, state.portsUp[index] ? bytes : 0]),
    );
    family(
      'steadfast_rdma_port_data_received_bytes_total',
      'counter',
      'Bytes received.',
      portLabels.map((labels, index) => [labels, state.portsUp[index] ? bytes : 0]),
    );
    if (state.training) {
      const labels = `${TRAINING_JOB_LABEL}="${state.training.job}",rank="${state.training.rank}"`;
      family('steadfast_training_iteration', 'gauge', 'Last iteration.', [[labels, Math.floor(seconds / 2)]]);
      family('steadfast_training_iteration_seconds', 'gauge', 'Seconds per iteration.', [[labels, 2]]);
    }
    return `${lines.join('\n')}\n`;
  }
}
