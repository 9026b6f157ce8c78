import { FAULT_CITATIONS } from '../../core/ladder.js';
import { agentSelector, indent, taggedRate } from '../../core/promql.js';
import { alert, humanDuration, record, type DomainRules, type RuleGroup } from '../spec.js';
import type { Thresholds } from '../thresholds.js';

/**
 * RDMA fabric health, from the agent's rdma collector (/sys/class/infiniband/<device>/ports/<port>):
 * every series carries `device` and `port`, and the scrape adds `node`.
 */

/** The window of the per-node throughput recordings; part of their names, so fixed here. */
const THROUGHPUT_WINDOW = '1m';

export const RDMA_RECEIVE_RATE = `node:steadfast_rdma_receive_bytes:rate${THROUGHPUT_WINDOW}`;
export const RDMA_TRANSMIT_RATE = `node:steadfast_rdma_transmit_bytes:rate${THROUGHPUT_WINDOW}`;

/** The port counters that rise on a degrading cable, transceiver or port, named in the alert's `counter` label. */
const ERROR_COUNTERS = ['symbol_errors', 'local_link_integrity_errors', 'receive_errors'] as const;

/** `node` / `device` / `port` as a description names them. */
const PORT = '{{ $labels.device }}/{{ $labels.port }} on node {{ $labels.node }}';

function groups(t: Thresholds): RuleGroup[] {
  const ports = agentSelector({}, t.selectors.agentJob);
  const network = t.network;

  // One rate per counter, tagged with the counter's name so the three stay apart.
  const errorRates = ERROR_COUNTERS.map((counter) =>
    taggedRate(`steadfast_rdma_port_${counter}_total${ports}`, network.errorRateWindow, 'counter', counter),
  ).join('\nor\n');

  return [
    {
      name: 'steadfast-network',
      rules: [
        // Data bytes per node over all its ports (the agent already turns the 4-byte-word counters into bytes).
        record({
          record: RDMA_RECEIVE_RATE,
          expr: `sum by (node) (rate(steadfast_rdma_port_data_received_bytes_total${ports}[${THROUGHPUT_WINDOW}]))`,
        }),
        record({
          record: RDMA_TRANSMIT_RATE,
          expr: `sum by (node) (rate(steadfast_rdma_port_data_transmitted_bytes_total${ports}[${THROUGHPUT_WINDOW}]))`,
        }),

        alert({
          alert: 'SteadfastRdmaPortDown',
          expr: `steadfast_rdma_port_up${ports} == 0`,
          for: network.portDownFor,
          severity: 'critical',
          summary: 'An RDMA port is down.',
          description: `RDMA port ${PORT} has not been ACTIVE and LinkUp for ${humanDuration(network.portDownFor)}. Collectives over this rail stall or fall back to slower paths.`,
          runbook: 'steadfast-rdma-port-down.md',
          meaning: { role: 'fault', faultClass: 'network', signal: 'alert', citation: FAULT_CITATIONS.network, route: 'controller' },
        }),

        // ByteRobust (000, §4.1): a machine is evicted for the network only after two network
        // alerts within 5 minutes, because single flaps often heal on their own. Two link-down
        // events in the window are that second alert, so this fires at once.
        alert({
          alert: 'SteadfastRdmaPortFlapping',
          expr: `increase(steadfast_rdma_port_link_downed_total${ports}[${network.flapWindow}]) >= ${network.flapCount}`,
          for: '0s',
          severity: 'critical',
          summary: 'An RDMA port keeps losing its link.',
          description: `RDMA port ${PORT} went down {{ printf "%.0f" $value }} times within ${humanDuration(network.flapWindow)}. A link that keeps dropping is a machine to evict, not one to wait for.`,
          runbook: 'steadfast-rdma-port-flapping.md',
          meaning: { role: 'fault', faultClass: 'network', signal: 'alert', citation: FAULT_CITATIONS.network, route: 'controller' },
        }),

        alert({
          alert: 'SteadfastRdmaPortErrors',
          expr: `(\n${indent(errorRates)}\n) > ${network.errorRatePerSecond}`,
          for: network.errorFor,
          severity: 'warning',
          summary: 'An RDMA port is counting link errors.',
          description: `RDMA port ${PORT} counts {{ $labels.counter }} at {{ printf "%.2f" $value }} per second (threshold ${network.errorRatePerSecond}) for ${humanDuration(network.errorFor)}: a degrading cable, transceiver or port.`,
          runbook: 'steadfast-rdma-port-errors.md',
          meaning: { role: 'fault', faultClass: 'network', signal: 'alert', citation: FAULT_CITATIONS.network, route: 'controller' },
        }),

        // ByteRobust (000, §4.1): a job whose node moves no RDMA bytes at all for 10 minutes is
        // hung, even when no process has died. "No bytes" is the sum over every port and both
        // directions; "a job runs" is a rank process on the node (process collector).
        alert({
          alert: 'SteadfastRdmaZeroTraffic',
          expr: [
            `(${RDMA_RECEIVE_RATE} + ${RDMA_TRANSMIT_RATE}) == 0`,
            `and on (node)`,
            `sum by (node) (steadfast_training_processes${agentSelector({ role: 'rank' }, t.selectors.agentJob)}) > 0`,
          ].join('\n'),
          for: network.zeroTrafficFor,
          severity: 'critical',
          summary: 'A node running training ranks moves no RDMA traffic.',
          description: `Node {{ $labels.node }} runs training ranks but has sent and received no RDMA data on any port for ${humanDuration(network.zeroTrafficFor)}: the job is probably hung.`,
          runbook: 'steadfast-rdma-zero-traffic.md',
          meaning: { role: 'fault', faultClass: 'performance', signal: 'alert', citation: FAULT_CITATIONS.performance, route: 'controller' },
        }),
      ],
    },
  ];
}

export const rules: DomainRules = { domain: 'network', groups };
