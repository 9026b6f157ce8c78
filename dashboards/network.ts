/**
 * "steadfast / Network": the InfiniBand / RoCE ports from the agent's rdma collector — state,
 * throughput, errors and congestion (CNP, ECN, retransmits, transmit wait). The node detail
 * dashboard reuses the panels for one node.
 */
import { RowBuilder, type Dashboard } from '@grafana/grafana-foundation-sdk/dashboard';
import { RATE_WINDOW, aggregateBy, increase, isEqual, rate, sumBy } from '../core/promql.js';
import { nodeSeries, nodeVariable, numberPanels, steadfastDashboard } from './frame.js';
import { mergedTablePanel, statPanel, thresholdsRedFrom, timeseriesPanel, unit, type Query } from './panels.js';

export const NETWORK_UID = 'steadfast-network';
export const NETWORK_TITLE = 'steadfast / Network';

/** Labels that name one port on one node. */
const PORT = ['node', 'device', 'port'] as const;
const PORT_LEGEND = '{{node}} {{device}}/{{port}}';

function portRate(metric: string): string {
  return sumBy(PORT, rate(nodeSeries(metric)));
}

/** One query per counter, as a per-port rate, legend `<node> <device>/<port> <label>`. */
function portRates(counters: readonly (readonly [metric: string, label: string])[]): Query[] {
  return counters.map(([metric, label]) => ({ expr: portRate(metric), legend: `${PORT_LEGEND} ${label}` }));
}

export function portsDownStat() {
  return statPanel({
    title: 'Ports down',
    description: 'RDMA ports not ACTIVE/LinkUp now. A down port on a training node stalls its collectives; the rules drain after repeated flaps.',
    unit: unit.count,
    queries: [{ expr: `sum(${isEqual(nodeSeries('steadfast_rdma_port_up'), 0)}) or vector(0)`, instant: true }],
    width: 6,
  }).thresholds(thresholdsRedFrom(1));
}

export function linkDownsStat() {
  return statPanel({
    title: 'Link downs (1 h)',
    description: 'Times a port failed to recover from an error and went down in the last hour, all selected ports.',
    unit: unit.count,
    queries: [{ expr: `sum(${increase(nodeSeries('steadfast_rdma_port_link_downed_total'), '1h')}) or vector(0)`, instant: true }],
    width: 6,
  }).thresholds(thresholdsRedFrom(1));
}

export function portStateTable() {
  return mergedTablePanel({
    title: 'Ports',
    description: 'Each port now: up (1) or not, its state and physical state codes (4 = ACTIVE, 5 = LinkUp), its rate, and link downs in the last hour.',
    unit: unit.count,
    columns: [
      { name: 'Up', expr: aggregateBy('max', PORT, nodeSeries('steadfast_rdma_port_up')), redBelow: 1 },
      { name: 'State', expr: aggregateBy('max', PORT, nodeSeries('steadfast_rdma_port_state')) },
      { name: 'Physical state', expr: aggregateBy('max', PORT, nodeSeries('steadfast_rdma_port_physical_state')) },
      { name: 'Rate (bytes/s)', expr: aggregateBy('max', PORT, nodeSeries('steadfast_rdma_port_rate_bytes_per_second')) },
      { name: 'Link downs (1 h)', expr: sumBy(PORT, increase(nodeSeries('steadfast_rdma_port_link_downed_total'), '1h')), redFrom: 1 },
    ],
    width: 12,
  });
}

export function portThroughputPanel() {
  return timeseriesPanel({
    title: 'Port throughput',
    description: 'Data bytes per second received and transmitted on each port (transmit drawn below the axis).',
    unit: unit.bytesPerSecond,
    queries: [
      { expr: portRate('steadfast_rdma_port_data_received_bytes_total'), legend: `${PORT_LEGEND} rx` },
      { expr: `-${portRate('steadfast_rdma_port_data_transmitted_bytes_total')}`, legend: `${PORT_LEGEND} tx` },
    ],
  });
}

export function portUtilizationPanel() {
  const capacity = aggregateBy('max', PORT, nodeSeries('steadfast_rdma_port_rate_bytes_per_second'));
  return timeseriesPanel({
    title: 'Port utilisation',
    description: 'Transmitted bytes per second over the port rate: a port pinned near 1 while its peers idle is a hot spot.',
    unit: unit.ratio,
    queries: [{ expr: `${portRate('steadfast_rdma_port_data_transmitted_bytes_total')} / ${capacity}`, legend: PORT_LEGEND }],
  }).min(0);
}

export function portErrorsPanel() {
  return timeseriesPanel({
    title: 'Port errors',
    description: 'Link and packet error counters per second on each port; any steady rate means a bad cable, transceiver or port.',
    unit: unit.perSecond,
    queries: portRates([
      ['steadfast_rdma_port_symbol_errors_total', 'symbol errors'],
      ['steadfast_rdma_port_receive_errors_total', 'receive errors'],
      ['steadfast_rdma_port_receive_remote_physical_errors_total', 'remote physical errors'],
      ['steadfast_rdma_port_link_error_recovery_total', 'link error recoveries'],
      ['steadfast_rdma_port_link_downed_total', 'link downs'],
      ['steadfast_rdma_port_local_link_integrity_errors_total', 'link integrity errors'],
      ['steadfast_rdma_port_excessive_buffer_overrun_errors_total', 'buffer overruns'],
      ['steadfast_rdma_port_transmit_discards_total', 'transmit discards'],
    ]),
  });
}

export function congestionNotificationsPanel() {
  return timeseriesPanel({
    title: 'Congestion notifications (CNP, ECN)',
    description: 'Per second on each port: CNPs sent as notification point, CNPs handled (sending slowed) as reaction point, and ECN-marked packets received.',
    unit: unit.perSecond,
    queries: portRates([
      ['steadfast_rdma_port_cnp_sent_total', 'CNP sent'],
      ['steadfast_rdma_port_cnp_handled_total', 'CNP handled'],
      ['steadfast_rdma_port_ecn_marked_packets_total', 'ECN marked'],
    ]),
  });
}

export function retransmitsPanel() {
  return timeseriesPanel({
    title: 'Retransmits and timeouts',
    description: 'Per second on each port: adaptive retransmissions, ack timeouts, out-of-sequence and sequence-error packets, receive-buffer drops.',
    unit: unit.perSecond,
    queries: portRates([
      ['steadfast_rdma_port_retransmits_total', 'retransmits'],
      ['steadfast_rdma_port_ack_timeouts_total', 'ack timeouts'],
      ['steadfast_rdma_port_out_of_sequence_total', 'out of sequence'],
      ['steadfast_rdma_port_packet_sequence_errors_total', 'sequence errors'],
      ['steadfast_rdma_port_out_of_buffer_total', 'out of buffer'],
    ]),
  });
}

export function transmitWaitPanel() {
  return timeseriesPanel({
    title: 'Transmit wait',
    description: `Ticks per second each port had data to send but no credits to send it (port_xmit_wait, device ticks): back-pressure from a congested link, over ${RATE_WINDOW}.`,
    unit: unit.perSecond,
    queries: [{ expr: portRate('steadfast_rdma_port_transmit_wait_total'), legend: PORT_LEGEND }],
  });
}

export function networkDashboard(): Dashboard {
  const builder = steadfastDashboard({
    uid: NETWORK_UID,
    title: NETWORK_TITLE,
    description: 'InfiniBand / RoCE ports on the selected nodes: state, throughput, errors and congestion.',
  })
    .withVariable(nodeVariable('steadfast_rdma_port_up'))
    .withRow(new RowBuilder('Ports'))
    .withPanel(portsDownStat())
    .withPanel(linkDownsStat())
    .withPanel(portStateTable())
    .withPanel(portThroughputPanel())
    .withPanel(portUtilizationPanel())
    .withRow(new RowBuilder('Congestion'))
    .withPanel(congestionNotificationsPanel())
    .withPanel(retransmitsPanel())
    .withPanel(transmitWaitPanel())
    .withPanel(portErrorsPanel());
  return numberPanels(builder.build());
}
