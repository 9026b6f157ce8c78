import { FAULT_CITATIONS } from '../../core/ladder.js';
import { agentSelector, indent, newEvents, selector, type LabelMatcher } from '../../core/promql.js';
import { xidCodesWithRemedy, type XidRemedy } from '../../core/xid.js';
import { alert, humanDuration, record, type DomainRules } from '../spec.js';

/**
 * Xid errors from the NVIDIA driver, counted per GPU and code by the agent's xid collector
 * (steadfast_xid_errors_total{pci_bus_id, xid, severity}, severity from core/xid.ts). Which
 * codes need a GPU reset, a node reboot, or are usually the application's own fault also comes
 * from core/xid.ts, so these rules and the agent read the one catalogue.
 *
 * The agent rebuilds its counts from the kernel log when it starts, so a count that comes back
 * unchanged, drops or vanishes is no new Xid; a rise, or a series with a count above zero that
 * did not exist a window ago, is (see newEvents and rules/README.md).
 *
 * Every alert here is a GPU fault to the controller and to Alertmanager: domain `gpu`.
 */

/**
 * The new-Xid expression, with the Xid class moved from `severity` to `xid_severity`: alerts
 * use `severity` for their own urgency.
 */
function newXidsByClass(series: string, window: string): string {
  return [
    'label_replace(',
    '  label_replace(',
    indent(newEvents(series, window), 4) + ',',
    '    "xid_severity", "$1", "severity", "(.+)"',
    '  ),',
    '  "severity", "", "", ""',
    ')',
  ].join('\n');
}

/** The catalogued Xid codes with this remedy, as an `xid` matcher. */
function xidMatcher(remedy: XidRemedy): LabelMatcher {
  return { oneOf: xidCodesWithRemedy(remedy).map(String) };
}

function xidsWithRemedy(remedy: XidRemedy): string {
  return selector({ xid: xidMatcher(remedy) });
}

export const rules: DomainRules = {
  domain: 'xid',
  groups: (t) => {
    const window = t.xid.window;
    const fatalRecord = `steadfast:xid_errors_fatal:increase${window}`;
    const allRecord = `steadfast:xid_errors:increase${window}`;
    return [
      {
        // No `interval:`: the group follows Prometheus' global evaluation_interval, which should
        // be as short as the scrape interval (1-5 s) so a fatal Xid reaches the controller in seconds.
        name: 'steadfast-xid',
        rules: [
          record({
            record: fatalRecord,
            expr: newXidsByClass(`steadfast_xid_errors_total${agentSelector({ severity: 'fatal' }, t.selectors.agentJob)}`, window),
          }),
          record({ record: allRecord, expr: newXidsByClass(`steadfast_xid_errors_total${agentSelector({}, t.selectors.agentJob)}`, window) }),
          // A fatal Xid is an explicit hardware signal: ByteRobust §4 evicts such a machine
          // without further diagnosis, so this fires at once and the controller drains the node.
          alert({
            alert: 'SteadfastXidFatal',
            expr: `${fatalRecord} > 0`,
            for: '0s',
            severity: 'critical',
            domain: 'gpu',
            summary: 'A GPU reported a fatal Xid error.',
            description: `GPU {{ $labels.pci_bus_id }} on node {{ $labels.node }} logged fatal Xid {{ $labels.xid }} ({{ printf "%.0f" $value }} new in the last ${humanDuration(window)}). steadfast drains the node.`,
            runbook: 'steadfast-xid-fatal.md',
            meaning: { role: 'xid-fault', fatal: 'always', signal: 'xid', route: 'controller' },
          }),
          // What the repair is, whatever the Xid's class: a reset-class Xid leaves the GPU
          // untrusted until it is reset, a reboot-class one until the node is rebooted.
          alert({
            alert: 'SteadfastXidGpuResetRequired',
            expr: `${allRecord}${xidsWithRemedy('reset_gpu')} > 0`,
            for: '0s',
            severity: 'warning',
            domain: 'gpu',
            labels: { remedy: 'reset_gpu' },
            summary: 'A GPU logged an Xid that needs a GPU reset.',
            description:
              'GPU {{ $labels.pci_bus_id }} on node {{ $labels.node }} logged Xid {{ $labels.xid }} (class {{ $labels.xid_severity }}); the GPU must be reset before it is trusted with work again.',
            runbook: 'steadfast-xid-gpu-reset-required.md',
            // Fatal codes need the node out; the warning ones (38, 63) wait for the next reset.
            meaning: { role: 'xid-fault', fatal: 'by-code', signal: 'alert', route: 'controller' },
          }),
          alert({
            alert: 'SteadfastXidNodeRebootRequired',
            expr: `${allRecord}${xidsWithRemedy('reboot_node')} > 0`,
            for: '0s',
            severity: 'warning',
            domain: 'gpu',
            labels: { remedy: 'reboot_node' },
            summary: 'A GPU logged an Xid that needs a node reboot.',
            description:
              'GPU {{ $labels.pci_bus_id }} on node {{ $labels.node }} logged Xid {{ $labels.xid }} (class {{ $labels.xid_severity }}); the node must be rebooted before the GPU is trusted with work again.',
            runbook: 'steadfast-xid-node-reboot-required.md',
            meaning: { role: 'fault', faultClass: 'machine', signal: 'alert', citation: FAULT_CITATIONS.machine, route: 'controller' },
          }),
          // One application-class Xid is the job's business; several on the same GPU within
          // the window, across job restarts, point at the GPU.
          alert({
            alert: 'SteadfastXidApplicationRepeated',
            expr: [
              'sum without (xid, severity) (',
              indent(newEvents(`steadfast_xid_errors_total${agentSelector({ xid: xidMatcher('restart_app') }, t.selectors.agentJob)}`, t.xid.repeatWindow)),
              `) >= ${t.xid.repeatCount}`,
            ].join('\n'),
            for: '0s',
            severity: 'warning',
            domain: 'gpu',
            summary: 'A GPU keeps logging application-class Xid errors.',
            description: `GPU {{ $labels.pci_bus_id }} on node {{ $labels.node }} logged {{ printf "%.0f" $value }} application-class Xids in the last ${humanDuration(t.xid.repeatWindow)}; repeated on one GPU they point at the GPU rather than the job.`,
            runbook: 'steadfast-xid-application-repeated.md',
            // Application-class Xids repeating on one GPU: the code or the GPU. Not traceable to a code module, so no
            // direct rollback; stop-time checks test the GPU and the ladder reaches rollback after.
            meaning: { role: 'fault', faultClass: 'crash', signal: 'alert', citation: FAULT_CITATIONS.crash, route: 'controller' },
          }),
        ],
      },
    ];
  },
};
