import { FAULT_CITATIONS } from '../../core/ladder.js';
import { agentSelector } from '../../core/promql.js';
import { alert, humanDuration, record, type DomainRules, type RuleGroup } from '../spec.js';
import type { Thresholds } from '../thresholds.js';

/**
 * NFS client health, from the agent's nfs collector (/proc/self/mountstats). Series carry the
 * `mount` (the device, `server:/export`); the mount point is only on steadfast_nfs_mount_info,
 * so each alert joins it in to name the directory a person would look at.
 */

/** The window of the per-mount latency recording; part of its name, so fixed here. */
const LATENCY_WINDOW = '5m';

export const NFS_RTT_MEAN = `mount:steadfast_nfs_rtt_seconds:mean${LATENCY_WINDOW}`;

const percent = (ratio: number) => `${Math.round(ratio * 100)}%`;

/** The source the RPC-slot alerts' class follows. */
const NFS_SLOTS_CITATION = '504-GPU report (NFS RPC slot saturation is a shared-storage bottleneck)';

const MOUNT = '{{ $labels.mountpoint }} ({{ $labels.mount }}) on node {{ $labels.node }}';

function groups(t: Thresholds): RuleGroup[] {
  const agent = agentSelector({}, t.selectors.agentJob);
  const storage = t.storage;
  /** Adds the mount point to a per-mount vector (the info series' value is 1, so values pass through). */
  const withMountpoint = (expr: string) => `(\n  ${expr}\n)\n* on (instance, mount) group_left (mountpoint)\nsteadfast_nfs_mount_info${agent}`;

  return [
    {
      name: 'steadfast-storage',
      rules: [
        // Mean round trip per RPC, over every operation of the mount; a mount without RPCs in
        // the window has no sample rather than 0/0.
        record({
          record: NFS_RTT_MEAN,
          expr: [
            `sum by (node, mount) (rate(steadfast_nfs_rtt_seconds_total${agent}[${LATENCY_WINDOW}]))`,
            `/`,
            `(sum by (node, mount) (rate(steadfast_nfs_operations_total${agent}[${LATENCY_WINDOW}])) > 0)`,
          ].join('\n'),
        }),

        // 504-GPU report (002): checkpoint writes stalled because every RPC slot of the mount
        // (128 by default) was in use; the writers queue in the client, not on the server.
        alert({
          alert: 'SteadfastNfsRpcSlotsSaturated',
          expr: withMountpoint(`steadfast_nfs_rpc_slot_utilization_ratio${agent} > ${storage.rpcSlotUtilization}`),
          for: storage.rpcSlotFor,
          severity: 'warning',
          summary: 'An NFS mount has used up its RPC slots.',
          description: `NFS mount ${MOUNT} keeps {{ $value | humanizePercentage }} of its RPC slots busy (threshold ${percent(storage.rpcSlotUtilization)}) for ${humanDuration(storage.rpcSlotFor)}: reads and checkpoint writes wait in the client.`,
          runbook: 'steadfast-nfs-rpc-slots-saturated.md',
          // Shared-storage pressure slows checkpoints (504-GPU report, NFS RPC slots) but is no node's fault.
          meaning: { role: 'fault', faultClass: 'transient', signal: 'alert', citation: NFS_SLOTS_CITATION, route: 'controller' },
        }),

        alert({
          alert: 'SteadfastNfsRpcBacklog',
          expr: withMountpoint(`steadfast_nfs_rpc_backlog_average${agent} > ${storage.rpcBacklog}`),
          for: storage.rpcBacklogFor,
          severity: 'warning',
          summary: 'NFS requests are queueing for an RPC slot.',
          description: `NFS mount ${MOUNT} has {{ printf "%.1f" $value }} requests waiting for a free RPC slot on average (threshold ${storage.rpcBacklog}) for ${humanDuration(storage.rpcBacklogFor)}.`,
          runbook: 'steadfast-nfs-rpc-backlog.md',
          // Shared-storage pressure slows checkpoints (504-GPU report, NFS RPC slots) but is no node's fault.
          meaning: { role: 'fault', faultClass: 'transient', signal: 'alert', citation: NFS_SLOTS_CITATION, route: 'controller' },
        }),

        alert({
          alert: 'SteadfastNfsMajorTimeouts',
          expr: withMountpoint(`sum without (operation) (increase(steadfast_nfs_major_timeouts_total${agent}[${storage.majorTimeoutWindow}])) > 0`),
          for: '0s',
          severity: 'warning',
          summary: 'An NFS server stopped answering RPCs in time.',
          description: `NFS mount ${MOUNT} had RPC major timeouts ({{ printf "%.0f" $value }} in the last ${humanDuration(storage.majorTimeoutWindow)}): the server did not answer within timeo × retrans.`,
          runbook: 'steadfast-nfs-major-timeouts.md',
          meaning: { role: 'fault', faultClass: 'transient', signal: 'alert', citation: FAULT_CITATIONS.transient, route: 'controller' },
        }),
      ],
    },
  ];
}

export const rules: DomainRules = { domain: 'storage', groups };
