import { Counter, Gauge, type Registry } from 'prom-client';
import type { Logger } from '../../core/log.js';
import type { Collector, CollectorContext, CollectorFactory } from '../collector.js';
import {
  dataBytes,
  infinibandClassDir,
  multicastPackets,
  packetCount,
  portUp,
  readInfinibandClass,
  type StableAttributeCache,
  unicastPackets,
  type FileProblem,
  type InfinibandClass,
  type InfinibandDevice,
  type InfinibandPort,
} from '../sources/infiniband.js';

/**
 * The `rdma` collector, after node_exporter's infiniband collector: reads
 * `<sysfs>/class/infiniband` at every scrape (a few hundred small sysfs reads) and exports
 * per-port state, rate and counters. A node without RDMA hardware has no class directory and
 * exports no series; a counter the kernel cannot give (`N/A (no PMA)`) is absent, not 0.
 */

/** Scrapes between full re-reads of attributes that do not change while a device is present. */
const CACHE_SCRAPES = 60;

type PortLabel = 'device' | 'port';
type PortLabels = Record<PortLabel, string>;

/** A counter series and where its value comes from. The kernel's values are absolute readings. */
interface CounterSpec {
  readonly name: string;
  readonly help: string;
  readonly value: (port: InfinibandPort) => number | undefined;
}

const COUNTERS: readonly CounterSpec[] = [
  {
    name: 'steadfast_rdma_port_data_received_bytes_total',
    help: 'Data octets received on the port (counters_ext/port_rcv_data_64 where present, else port_rcv_data; 4-octet words, times 4).',
    value: (port) => dataBytes(port, 'received'),
  },
  {
    name: 'steadfast_rdma_port_data_transmitted_bytes_total',
    help: 'Data octets transmitted on the port (counters_ext/port_xmit_data_64 where present, else port_xmit_data; 4-octet words, times 4).',
    value: (port) => dataBytes(port, 'transmitted'),
  },
  {
    name: 'steadfast_rdma_port_packets_received_total',
    help: 'Packets received on all VLs, errors included (counters_ext/port_rcv_packets_64, else port_rcv_packets, else unicast + multicast).',
    value: (port) => packetCount(port, 'received'),
  },
  {
    name: 'steadfast_rdma_port_unicast_packets_received_total',
    help: 'Unicast packets received (unicast_rcv_packets, or counters_ext/port_unicast_rcv_packets).',
    value: (port) => unicastPackets(port, 'received'),
  },
  {
    name: 'steadfast_rdma_port_multicast_packets_received_total',
    help: 'Multicast packets received (multicast_rcv_packets, or counters_ext/port_multicast_rcv_packets).',
    value: (port) => multicastPackets(port, 'received'),
  },
  {
    name: 'steadfast_rdma_port_packets_transmitted_total',
    help: 'Packets transmitted on all VLs, errors included (counters_ext/port_xmit_packets_64, else port_xmit_packets, else unicast + multicast).',
    value: (port) => packetCount(port, 'transmitted'),
  },
  {
    name: 'steadfast_rdma_port_unicast_packets_transmitted_total',
    help: 'Unicast packets transmitted (unicast_xmit_packets, or counters_ext/port_unicast_xmit_packets).',
    value: (port) => unicastPackets(port, 'transmitted'),
  },
  {
    name: 'steadfast_rdma_port_multicast_packets_transmitted_total',
    help: 'Multicast packets transmitted (multicast_xmit_packets, or counters_ext/port_multicast_xmit_packets).',
    value: (port) => multicastPackets(port, 'transmitted'),
  },
  {
    name: 'steadfast_rdma_port_link_downed_total',
    help: 'Times the link failed to recover from an error state and went down (link_downed).',
    value: (port) => port.counters.link_downed,
  },
  {
    name: 'steadfast_rdma_port_link_error_recovery_total',
    help: 'Times the link recovered from an error state (link_error_recovery).',
    value: (port) => port.counters.link_error_recovery,
  },
  {
    name: 'steadfast_rdma_port_symbol_errors_total',
    help: 'Minor link errors detected on one or more physical lanes (symbol_error).',
    value: (port) => port.counters.symbol_error,
  },
  {
    name: 'steadfast_rdma_port_receive_errors_total',
    help: 'Packets with an error received on the port (port_rcv_errors).',
    value: (port) => port.counters.port_rcv_errors,
  },
  {
    name: 'steadfast_rdma_port_receive_remote_physical_errors_total',
    help: 'Packets marked with the End of Bad Packet delimiter received on the port (port_rcv_remote_physical_errors).',
    value: (port) => port.counters.port_rcv_remote_physical_errors,
  },
  {
    name: 'steadfast_rdma_port_transmit_discards_total',
    help: 'Outbound packets discarded because the port was down or congested (port_xmit_discards).',
    value: (port) => port.counters.port_xmit_discards,
  },
  {
    name: 'steadfast_rdma_port_receive_discards_total',
    help: 'Inbound packets discarded for lack of receive buffers or an error in the packet (port_rcv_discards, where the driver has it).',
    value: (port) => port.counters.port_rcv_discards,
  },
  {
    name: 'steadfast_rdma_port_transmit_wait_total',
    help: 'Ticks during which the port had data to send but sent none (port_xmit_wait; device ticks, not seconds).',
    value: (port) => port.counters.port_xmit_wait,
  },
  {
    name: 'steadfast_rdma_port_local_link_integrity_errors_total',
    help: 'Times local physical errors exceeded the LocalPhyErrors threshold (local_link_integrity_errors).',
    value: (port) => port.counters.local_link_integrity_errors,
  },
  {
    name: 'steadfast_rdma_port_excessive_buffer_overrun_errors_total',
    help: 'Times consecutive flow-control update periods had buffer overruns (excessive_buffer_overrun_errors).',
    value: (port) => port.counters.excessive_buffer_overrun_errors,
  },
  {
    name: 'steadfast_rdma_port_cnp_sent_total',
    help: 'Congestion notification packets sent as notification point (hw_counters/np_cnp_sent).',
    value: (port) => port.hwCounters?.np_cnp_sent,
  },
  {
    name: 'steadfast_rdma_port_cnp_handled_total',
    help: 'Congestion notification packets handled as reaction point to throttle sending (hw_counters/rp_cnp_handled).',
    value: (port) => port.hwCounters?.rp_cnp_handled,
  },
  {
    name: 'steadfast_rdma_port_ecn_marked_packets_total',
    help: 'RoCEv2 packets received with ECN congestion marking (hw_counters/np_ecn_marked_roce_packets).',
    value: (port) => port.hwCounters?.np_ecn_marked_roce_packets,
  },
  {
    name: 'steadfast_rdma_port_retransmits_total',
    help: 'Adaptive retransmissions sent by the adapter (hw_counters/roce_adp_retrans).',
    value: (port) => port.hwCounters?.roce_adp_retrans,
  },
  {
    name: 'steadfast_rdma_port_ack_timeouts_total',
    help: 'Times a queue pair ack timer expired at the sender, below the retry limit (hw_counters/local_ack_timeout_err).',
    value: (port) => port.hwCounters?.local_ack_timeout_err,
  },
  {
    name: 'steadfast_rdma_port_out_of_sequence_total',
    help: 'Out-of-sequence packets received (hw_counters/out_of_sequence).',
    value: (port) => port.hwCounters?.out_of_sequence,
  },
  {
    name: 'steadfast_rdma_port_packet_sequence_errors_total',
    help: 'NAK sequence error packets received, below the retry limit (hw_counters/packet_seq_err).',
    value: (port) => port.hwCounters?.packet_seq_err,
  },
  {
    name: 'steadfast_rdma_port_out_of_buffer_total',
    help: 'Packets dropped for lack of a receive work queue entry (hw_counters/out_of_buffer).',
    value: (port) => port.hwCounters?.out_of_buffer,
  },
];

type InfoLabel = PortLabel | 'link_layer' | 'hca_type' | 'fw_ver' | 'board_id';

/** Every series the collector exports; made once per collector on the agent's registry. */
class RdmaMetrics {
  private readonly info: Gauge<InfoLabel>;
  private readonly state: Gauge<PortLabel>;
  private readonly physicalState: Gauge<PortLabel>;
  private readonly up: Gauge<PortLabel>;
  private readonly rate: Gauge<PortLabel>;
  private readonly counters: ReadonlyArray<{ readonly spec: CounterSpec; readonly metric: Counter<PortLabel> }>;

  constructor(registry: Registry) {
    const registers = [registry];
    const labelNames = ['device', 'port'] as const;
    const gauge = (name: string, help: string): Gauge<PortLabel> => new Gauge({ name, help, labelNames, registers });
    this.info = new Gauge({
      name: 'steadfast_rdma_port_info',
      help: 'RDMA port identity; always 1. Labels are empty where sysfs does not have the file.',
      labelNames: [...labelNames, 'link_layer', 'hca_type', 'fw_ver', 'board_id'],
      registers,
    });
    this.state = gauge('steadfast_rdma_port_state', 'Logical port state (1 down, 2 init, 3 armed, 4 active, 5 active defer).');
    this.physicalState = gauge(
      'steadfast_rdma_port_physical_state',
      'Physical port state (1 sleep, 2 polling, 3 disabled, 4 port configuration training, 5 link up, 6 link error recovery, 7 phy test).',
    );
    this.up = gauge('steadfast_rdma_port_up', 'Whether the port is logically ACTIVE and physically LinkUp (1) or not (0).');
    this.rate = gauge('steadfast_rdma_port_rate_bytes_per_second', 'Port signalling rate (from the rate file, Gb/sec over 8).');
    this.counters = COUNTERS.map((spec) => ({ spec, metric: new Counter({ name: spec.name, help: spec.help, labelNames, registers }) }));
  }

  /** Forgets every series, so a device or port that is gone has none. */
  reset(): void {
    for (const metric of [this.info, this.state, this.physicalState, this.up, this.rate]) metric.reset();
    for (const { metric } of this.counters) metric.reset();
  }

  write(device: InfinibandDevice, port: InfinibandPort): void {
    const labels: PortLabels = { device: device.name, port: port.port };
    this.info.set(
      {
        ...labels,
        link_layer: port.linkLayer ?? '',
        hca_type: device.hcaType ?? '',
        fw_ver: device.firmwareVersion ?? '',
        board_id: device.boardId ?? '',
      },
      1,
    );
    if (port.state !== undefined) this.state.set(labels, port.state.code);
    if (port.physicalState !== undefined) this.physicalState.set(labels, port.physicalState.code);
    const up = portUp(port);
    if (up !== undefined) this.up.set(labels, Number(up));
    if (port.rateBytesPerSecond !== undefined) this.rate.set(labels, port.rateBytesPerSecond);
    // The counters are absolute readings: after reset(), inc(value) sets them.
    for (const { spec, metric } of this.counters) {
      const value = spec.value(port);
      if (value !== undefined) metric.inc(labels, value);
    }
  }
}

class RdmaCollector implements Collector {
  readonly name = 'rdma';
  private readonly metrics: RdmaMetrics;
  private readonly logger: Logger;
  private readonly classDir: string;
  /** Files already logged as unreadable; logged again only after they have read well once. */
  private readonly reported = new Set<string>();
  /** Firmware, board, link layer and counter listings, re-read when devices change or every CACHE_SCRAPES. */
  private readonly stable: StableAttributeCache = new Map();
  private stableFor = '';
  private scrapesSinceRefresh = 0;

  constructor(context: CollectorContext) {
    this.metrics = new RdmaMetrics(context.registry);
    this.logger = context.logger.child({ collector: this.name });
    this.classDir = infinibandClassDir(context.paths.sysfs);
  }

  async start(): Promise<void> {
    // Nothing runs in the background: sysfs is read at each scrape.
  }

  async update(): Promise<void> {
    let reading: InfinibandClass;
    try {
      reading = await readInfinibandClass(this.classDir, this.stable);
    } catch (error) {
      // A failed read exports nothing rather than the last scrape's values as if they were current.
      this.metrics.reset();
      throw error;
    }
    this.refreshStableCache(reading);
    this.metrics.reset();
    for (const device of reading.devices) {
      for (const port of device.ports) this.metrics.write(device, port);
    }
    this.report(reading.problems);
  }

  async close(): Promise<void> {
    // Nothing to stop.
  }

  // A device set that changed (hot plug, driver reload) may come back with new firmware: forget
  // what was cached, and re-read everything now and then regardless.
  private refreshStableCache(reading: InfinibandClass): void {
    const devices = reading.devices.map((device) => device.name).join(',');
    this.scrapesSinceRefresh += 1;
    if (devices !== this.stableFor || this.scrapesSinceRefresh >= CACHE_SCRAPES) {
      this.stable.clear();
      this.stableFor = devices;
      this.scrapesSinceRefresh = 0;
    }
  }

  private report(problems: readonly FileProblem[]): void {
    const current = new Set<string>();
    for (const problem of problems) {
      current.add(problem.path);
      if (this.reported.has(problem.path)) continue;
      this.reported.add(problem.path);
      this.logger.debug({ path: problem.path, reason: problem.reason }, 'rdma sysfs file unreadable; its value is left out');
    }
    for (const path of this.reported) if (!current.has(path)) this.reported.delete(path);
  }
}

export function createRdmaCollector(context: CollectorContext): Collector {
  return new RdmaCollector(context);
}

export const rdmaCollectorFactory: CollectorFactory = {
  name: 'rdma',
  defaultEnabled: true,
  help: 'RDMA (InfiniBand, RoCE) port state, rate and counters from /sys/class/infiniband.',
  create: (context) => createRdmaCollector(context),
};
