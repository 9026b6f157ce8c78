import { agentSelector, controllerSelector, indent, newEvents } from '../../core/promql.js';
import { QUEUE_NAMES } from '../../core/queues.js';
import { alert, humanDuration, type DomainRules, type SelfMonitoringMeaning } from '../spec.js';

/**
 * steadfast watching itself: the agents and the controller being scraped, the controller
 * keeping up with its intake, and actions it decided but could not carry out. None of these is
 * something steadfast can repair on its own, so every alert here is routed to people as well as
 * to the controller (the `notify="humans"` label, rules/alertmanager.yml), and the controller
 * records it without moving any job or node.
 */

const SELF_MONITORING: SelfMonitoringMeaning = { role: 'self-monitoring', signal: 'alert', route: 'humans' };

export const rules: DomainRules = {
  domain: 'steadfast',
  groups: (t) => {
    const s = t.steadfast;
    const controllerUp = `up${controllerSelector({}, t.selectors.controllerJob)}`;
    return [
      {
        name: 'steadfast-self',
        rules: [
          // A silent agent hides its node's GPUs, ports and training from every other rule; it
          // may also be the first sign of the node itself being down.
          alert({
            alert: 'SteadfastAgentDown',
            expr: `up${agentSelector({}, t.selectors.agentJob)} == 0`,
            for: s.agentDownFor,
            severity: 'critical',
            summary: 'A steadfast agent cannot be scraped.',
            description: `The steadfast agent on node {{ $labels.node }} ({{ $labels.instance }}) has not answered Prometheus for ${humanDuration(s.agentDownFor)}; faults on that node go unseen.`,
            runbook: 'steadfast-agent-down.md',
            meaning: SELF_MONITORING,
          }),
          // `absent` covers a controller that was never scraped or whose target vanished.
          alert({
            alert: 'SteadfastControllerDown',
            expr: `${controllerUp} == 0 or absent(${controllerUp})`,
            for: s.controllerDownFor,
            severity: 'critical',
            summary: 'The steadfast controller cannot be scraped.',
            description: `Prometheus has not reached the steadfast controller (job {{ $labels.job }}{{ with $labels.instance }}, instance {{ . }}{{ end }}) for ${humanDuration(s.controllerDownFor)}; alerts are not being acted on.`,
            runbook: 'steadfast-controller-down.md',
            meaning: SELF_MONITORING,
          }),
          alert({
            alert: 'SteadfastQueueBacklog',
            expr: `steadfast_queue_jobs${controllerSelector({ state: 'waiting' }, t.selectors.controllerJob)} > ${s.queueBacklogJobs}`,
            for: s.queueBacklogFor,
            severity: 'warning',
            summary: 'Jobs are piling up in a steadfast queue.',
            description: `The {{ $labels.queue }} queue of the steadfast controller ({{ $labels.instance }}) has held more than ${s.queueBacklogJobs} waiting jobs for ${humanDuration(s.queueBacklogFor)} (now {{ printf "%.0f" $value }}).`,
            runbook: 'steadfast-queue-backlog.md',
            meaning: SELF_MONITORING,
          }),
          // The age of the oldest unprocessed signal: decisions, and their audit records, are
          // this far behind the faults they answer.
          alert({
            alert: 'SteadfastDecisionLag',
            expr: `steadfast_queue_oldest_waiting_seconds${controllerSelector({ queue: QUEUE_NAMES.signals }, t.selectors.controllerJob)} > ${s.auditLagSeconds}`,
            for: '0s',
            severity: 'warning',
            summary: 'steadfast decides and audits late.',
            description: `The oldest signal waiting in the {{ $labels.queue }} queue of the steadfast controller ({{ $labels.instance }}) is {{ printf "%.0f" $value }} s old, more than ${s.auditLagSeconds} s; decisions and the audit lag behind the faults.`,
            runbook: 'steadfast-decision-lag.md',
            meaning: SELF_MONITORING,
          }),
          // A refusal (paused, dry-run, eviction budget spent) leaves a faulty node in service:
          // only a person can decide to drain it anyway or to raise the budget.
          alert({
            alert: 'SteadfastActionsRefused',
            expr: newEvents(`steadfast_actions_total${controllerSelector({ state: 'refused' }, t.selectors.controllerJob)}`, s.actionWindow),
            for: '0s',
            severity: 'critical',
            summary: 'steadfast refused to carry out an action it decided on.',
            description: `The steadfast controller ({{ $labels.instance }}) refused {{ printf "%.0f" $value }} {{ $labels.verb }} action(s) on the {{ $labels.backend }} backend in the last ${humanDuration(s.actionWindow)} (paused, dry-run or eviction budget spent); the nodes concerned are still in service.`,
            runbook: 'steadfast-actions-refused.md',
            meaning: SELF_MONITORING,
          }),
          // A drain is retried on its own; this many failed attempts mean retrying is not helping.
          alert({
            alert: 'SteadfastActionsFailing',
            expr: [
              '(',
              indent(newEvents(`steadfast_actions_total${controllerSelector({ state: 'failed' }, t.selectors.controllerJob)}`, s.actionWindow)),
              `) >= ${s.actionFailureCount}`,
            ].join('\n'),
            for: '0s',
            severity: 'critical',
            summary: 'steadfast actions keep failing.',
            description: `{{ printf "%.0f" $value }} {{ $labels.verb }} attempts failed on the {{ $labels.backend }} backend of the steadfast controller ({{ $labels.instance }}) in the last ${humanDuration(s.actionWindow)}; the cluster backend is not doing what steadfast asks.`,
            runbook: 'steadfast-actions-failing.md',
            meaning: SELF_MONITORING,
          }),
          // A node handed off is held: steadfast no longer resets, drains or reboots it, and nothing
          // returns it to service until a person releases it.
          alert({
            alert: 'SteadfastNodeHandedOff',
            expr: `steadfast_node_handed_off${controllerSelector({}, t.selectors.controllerJob)} == 1`,
            for: '0s',
            severity: 'warning',
            summary: 'A node was handed off to people.',
            description:
              'The steadfast controller ({{ $labels.instance }}) handed node {{ $labels.node }} off to people after repeated repairs did not hold; steadfast no longer touches it until a person runs steadfast release {{ $labels.node }}.',
            runbook: 'steadfast-node-handed-off.md',
            meaning: SELF_MONITORING,
          }),
        ],
      },
    ];
  },
};
