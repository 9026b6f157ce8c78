import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Queue } from 'bullmq';
import { registerBuildInfo } from '../core/build-info.js';
import { HANDED_OFF_REASON } from '../core/remedy.js';
import type { JobStore } from './job-store.js';

/** The controller's own metrics, on a registry made by the composition root. */
export class ControllerMetrics {
  readonly registry = new Registry();
  readonly signalsAccepted: Counter<'source' | 'kind'>;
  readonly requestsRejected: Counter<'endpoint' | 'reason'>;
  readonly actions: Counter<'verb' | 'state' | 'backend'>;
  readonly signalToAction: Histogram<'verb'>;
  readonly grafanaAnnotationsFailed: Counter<'reason'>;
  readonly humanPages: Counter<'training_job'>;
  readonly alertsRefused: Counter;
  readonly alertsTruncated: Counter;
  readonly remediations: Counter<'node' | 'action' | 'outcome'>;

  /** `heldNodes` lists the node holds in force (SafetyGates.holds), for the handed-off gauge. */
  constructor(queues: readonly Queue[], jobs?: JobStore, heldNodes?: () => Promise<ReadonlyMap<string, { readonly reason: string }>>) {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry, prefix: 'steadfast_controller_' });
    registerBuildInfo(this.registry);
    this.signalsAccepted = new Counter({
      name: 'steadfast_signals_accepted_total',
      help: 'Signals stored durably in Redis, by source and kind.',
      labelNames: ['source', 'kind'],
      registers,
    });
    this.requestsRejected = new Counter({
      name: 'steadfast_requests_rejected_total',
      help: 'Requests answered with an error, by endpoint and reason.',
      labelNames: ['endpoint', 'reason'],
      registers,
    });
    this.alertsRefused = new Counter({
      name: 'steadfast_alerts_refused_total',
      help: 'Alerts of accepted webhooks left out because they were invalid (a bad node, xid or time); the answer lists each with its reason.',
      registers,
    });
    this.alertsTruncated = new Counter({
      name: 'steadfast_alerts_truncated_total',
      help: "Alerts Alertmanager reported leaving out of its webhooks (truncatedAlerts, past the receiver's max_alerts).",
      registers,
    });
    this.actions = new Counter({
      name: 'steadfast_actions_total',
      help: 'Actions that reached a final state, by verb, state and backend.',
      labelNames: ['verb', 'state', 'backend'],
      registers,
    });
    this.remediations = new Counter({
      name: 'steadfast_remediations_total',
      help: "Remediations of nodes outside a job's ladder, by node, action (reset_gpu, drain, reboot, hand_off) and outcome (done, refused, failed, fell_back).",
      labelNames: ['node', 'action', 'outcome'],
      registers,
    });
    new Gauge({
      name: 'steadfast_node_handed_off',
      help: 'Nodes handed off to people (held with reason "handed off"): 1 per node until it is released.',
      labelNames: ['node'],
      registers,
      async collect() {
        if (!heldNodes) return;
        try {
          const holds = await heldNodes();
          this.reset();
          for (const [node, hold] of holds) if (hold.reason.startsWith(HANDED_OFF_REASON)) this.set({ node }, 1);
        } catch {
          // Redis down: keep the last values, so the alert does not resolve during an outage; /healthz reports it.
        }
      },
    });
    this.humanPages = new Counter({
      name: 'steadfast_human_pages_total',
      help: "Times a job's recovery needed a person: the ladder ran out, an action was refused, no standby was left.",
      labelNames: ['training_job'],
      registers,
    });
    this.signalToAction = new Histogram({
      name: 'steadfast_signal_to_action_seconds',
      help: 'Time from the fault (signal time) to the action reaching a final state.',
      labelNames: ['verb'],
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60],
      registers,
    });
    this.grafanaAnnotationsFailed = new Counter({
      name: 'steadfast_grafana_annotations_failed_total',
      help: 'Action annotations that could not be posted to Grafana, by reason (timeout, unreachable, status); the action itself is unaffected.',
      labelNames: ['reason'],
      registers,
    });
    new Gauge({
      name: 'steadfast_queue_jobs',
      help: 'Jobs in each steadfast queue, by state.',
      labelNames: ['queue', 'state'],
      registers,
      async collect() {
        for (const queue of queues) {
          try {
            const counts = await queue.getJobCounts('waiting', 'active', 'delayed', 'failed');
            for (const [state, count] of Object.entries(counts)) this.set({ queue: queue.name, state }, count);
          } catch {
            // Redis down: the series keep their last values; /healthz reports the outage.
          }
        }
      },
    });
    new Gauge({
      name: 'steadfast_queue_oldest_waiting_seconds',
      help: 'Age of the oldest job still waiting in each steadfast queue (0 when none waits): how far decisions and the audit lag behind intake.',
      labelNames: ['queue'],
      registers,
      async collect() {
        for (const queue of queues) {
          try {
            const [oldest] = await queue.getJobs(['waiting', 'prioritized'], 0, 0, true);
            this.set({ queue: queue.name }, oldest ? Math.max(0, (Date.now() - oldest.timestamp) / 1000) : 0);
          } catch {
            // Redis down: keep the last value; /healthz reports the outage.
          }
        }
      },
    });
    new Gauge({
      name: 'steadfast_job_ettr_ratio',
      help: 'Effective training time ratio of each registered job: productive time over wall time (ByteRobust §8.1.3), since registration and over the last hour.',
      labelNames: ['training_job', 'window'],
      registers,
      async collect() {
        if (!jobs) return;
        try {
          this.reset();
          for (const record of await jobs.list()) {
            const ettr = await jobs.ettr(record.spec.name);
            this.set({ training_job: record.spec.name, window: 'cumulative' }, ettr.cumulative);
            this.set({ training_job: record.spec.name, window: '1h' }, ettr.window1h);
          }
        } catch {
          // Redis down: no values rather than stale ones; /healthz reports the outage.
        }
      },
    });
  }
}
