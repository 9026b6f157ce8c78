/**
 * "steadfast / steadfast itself": the controller's own health — intake, queues, how fast a fault
 * becomes an action, what it refused or failed to do — and the agents' fast path to it.
 * One exported function per panel; the fleet overview reuses some of them.
 */
import { RowBuilder, type Dashboard } from '@grafana/grafana-foundation-sdk/dashboard';
import { RATE_WINDOW, equals, histogramQuantile, increase, matches, rate, sumBy } from '../core/promql.js';
import { CONTROLLER_SCRAPE_JOB } from '../core/scrape.js';
import { clusterMatcher, clusterSeries, nodeSeries, nodeVariable, numberPanels, steadfastDashboard } from './frame.js';
import { statPanel, tablePanel, thresholdsRedFrom, timeseriesPanel, unit } from './panels.js';

export const SELF_UID = 'steadfast-self';
export const SELF_TITLE = 'steadfast / steadfast itself';

const SIGNAL_TO_ACTION = 'steadfast_signal_to_action_seconds';
/** Process metrics of the controller (prom-client defaults under this prefix). */
const CONTROLLER_PROCESS = 'steadfast_controller_';

// ---- Intake --------------------------------------------------------------------------------

export function signalsAcceptedPanel() {
  return timeseriesPanel({
    title: 'Signals accepted',
    description: 'Signals the controller stored durably, per second, by source and kind.',
    unit: unit.perSecond,
    queries: [{ expr: sumBy(['source', 'kind'], rate(clusterSeries('steadfast_signals_accepted_total'))), legend: '{{source}} {{kind}}' }],
  });
}

export function requestsRejectedPanel() {
  return timeseriesPanel({
    title: 'Requests rejected',
    description: 'Requests the controller answered with an error, per second, by endpoint and reason (bad token, invalid body, Redis down, …).',
    unit: unit.perSecond,
    queries: [{ expr: sumBy(['endpoint', 'reason'], rate(clusterSeries('steadfast_requests_rejected_total'))), legend: '{{endpoint}} {{reason}}' }],
  });
}

export function fastPathPanel() {
  return timeseriesPanel({
    title: 'Agent fast path',
    description: `Fatal events the agents sent straight to the controller, and sends that failed (by reason), over ${RATE_WINDOW}.`,
    unit: unit.count,
    queries: [
      { expr: sumBy(['node'], increase(nodeSeries('steadfast_agent_fast_path_sent_total'))), legend: '{{node}} sent' },
      { expr: sumBy(['node', 'reason'], increase(nodeSeries('steadfast_agent_fast_path_failed_total'))), legend: '{{node}} failed: {{reason}}' },
    ],
  });
}

// ---- Queues --------------------------------------------------------------------------------

export function queueDepthPanel() {
  return timeseriesPanel({
    title: 'Queue depth',
    description: 'Jobs in each steadfast queue, by state.',
    unit: unit.count,
    queries: [{ expr: sumBy(['queue', 'state'], clusterSeries('steadfast_queue_jobs')), legend: '{{queue}} {{state}}' }],
  });
}

export function oldestWaitingPanel() {
  return timeseriesPanel({
    title: 'Oldest waiting job',
    description: 'Age of the oldest job still waiting in each queue: how far decisions and actions lag behind intake. 0 when nothing waits.',
    unit: unit.seconds,
    queries: [{ expr: sumBy(['queue'], clusterSeries('steadfast_queue_oldest_waiting_seconds')), legend: '{{queue}}' }],
  }).thresholds(thresholdsRedFrom(30));
}

// ---- Actions -------------------------------------------------------------------------------

export function signalToActionLatencyPanel() {
  return timeseriesPanel({
    title: 'Signal → action latency',
    description: 'Time from the fault to its action reaching a final state, by verb.',
    unit: unit.seconds,
    queries: [
      { expr: histogramQuantile(0.5, SIGNAL_TO_ACTION, ['verb'], clusterMatcher), legend: 'p50 {{verb}}' },
      { expr: histogramQuantile(0.95, SIGNAL_TO_ACTION, ['verb'], clusterMatcher), legend: 'p95 {{verb}}' },
      { expr: histogramQuantile(0.99, SIGNAL_TO_ACTION, ['verb'], clusterMatcher), legend: 'p99 {{verb}}' },
    ],
  });
}

export function actionsByStatePanel() {
  return timeseriesPanel({
    title: 'Actions by state',
    description: 'Actions that reached a final state in the last hour, by verb and state.',
    unit: unit.count,
    queries: [{ expr: sumBy(['verb', 'state'], increase(clusterSeries('steadfast_actions_total'), '1h')), legend: '{{verb}} {{state}}' }],
  });
}

export function remediationsPanel() {
  return timeseriesPanel({
    title: 'Remediations by node, action and outcome',
    description:
      "GPU resets, drains, reboots and hand-offs of nodes outside a job's ladder in the last 24 h; `steadfast remediations NODE` shows each with its decision.",
    unit: unit.count,
    queries: [
      { expr: sumBy(['node', 'action', 'outcome'], increase(clusterSeries('steadfast_remediations_total'), '24h')), legend: '{{node}} {{action}} {{outcome}}' },
    ],
  });
}

export function actionsNotDoneStat() {
  return statPanel({
    title: 'Actions refused or failed (1 h)',
    description: 'Actions in the last hour that a safety gate refused (pause, eviction budget) or the backend failed to carry out; the audit log says why.',
    unit: unit.count,
    queries: [{ expr: `sum(${increase(clusterSeries('steadfast_actions_total', matches('state', 'refused|failed')), '1h')}) or vector(0)`, instant: true }],
    width: 6,
  }).thresholds(thresholdsRedFrom(1));
}

export function actionsNotDoneTable() {
  return tablePanel({
    title: 'Refused and failed actions by verb, state and backend (1 h)',
    description: 'Where the actions that did not happen came from.',
    unit: unit.count,
    queries: [
      { expr: `${sumBy(['verb', 'state', 'backend'], increase(clusterSeries('steadfast_actions_total', matches('state', 'refused|failed')), '1h'))} > 0` },
    ],
    width: 12,
  });
}

export function grafanaAnnotationsFailedPanel() {
  return timeseriesPanel({
    title: 'Grafana annotations not posted',
    description: `Action annotations the controller could not post to Grafana over ${RATE_WINDOW} (the action itself is unaffected; the controller log says why).`,
    unit: unit.count,
    queries: [{ expr: `sum(${increase(clusterSeries('steadfast_grafana_annotations_failed_total'))})`, legend: 'failed' }],
  }).thresholds(thresholdsRedFrom(1));
}

// ---- The controller process ----------------------------------------------------------------

export function controllerMemoryPanel() {
  return timeseriesPanel({
    title: 'Controller memory',
    description: 'Resident memory of each controller process.',
    unit: unit.bytes,
    queries: [{ expr: clusterSeries(`${CONTROLLER_PROCESS}process_resident_memory_bytes`), legend: '{{instance}}' }],
  });
}

export function controllerEventLoopPanel() {
  return timeseriesPanel({
    title: 'Controller event-loop lag (p99)',
    description: 'How long ready work waited for the event loop: high values delay intake answers and every worker.',
    unit: unit.seconds,
    queries: [{ expr: clusterSeries(`${CONTROLLER_PROCESS}nodejs_eventloop_lag_p99_seconds`), legend: '{{instance}}' }],
  });
}

export function controllerUpPanel() {
  return statPanel({
    title: 'Controllers up',
    description: 'Controller replicas Prometheus scrapes successfully.',
    unit: unit.count,
    queries: [{ expr: `sum(${clusterSeries('up', equals('job', CONTROLLER_SCRAPE_JOB))})`, instant: true }],
    width: 6,
  });
}

export function selfDashboard(): Dashboard {
  const builder = steadfastDashboard({
    uid: SELF_UID,
    title: SELF_TITLE,
    description: 'The steadfast controller: intake, queues, signal → action latency, refused and failed actions.',
  })
    .withVariable(nodeVariable('steadfast_collector_success'))
    .withRow(new RowBuilder('Actions'))
    .withPanel(controllerUpPanel())
    .withPanel(actionsNotDoneStat())
    .withPanel(actionsNotDoneTable())
    .withPanel(signalToActionLatencyPanel())
    .withPanel(actionsByStatePanel())
    .withRow(new RowBuilder('Intake and queues'))
    .withPanel(signalsAcceptedPanel())
    .withPanel(requestsRejectedPanel())
    .withPanel(queueDepthPanel())
    .withPanel(oldestWaitingPanel())
    .withPanel(fastPathPanel())
    .withPanel(grafanaAnnotationsFailedPanel())
    .withRow(new RowBuilder('Controller process'))
    .withPanel(controllerMemoryPanel())
    .withPanel(controllerEventLoopPanel());
  return numberPanels(builder.build());
}
