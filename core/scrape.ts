/**
 * How Prometheus scrapes steadfast, named once for the rules, the dashboards, the controller's
 * watches, the simulation's prometheus.yml and the benches: the scrape jobs, and the labels the
 * agents' training series carry.
 */

/** Prometheus' scrape job for the node agents (rules/README.md's scrape config, the demo's prometheus.yml). */
export const AGENT_SCRAPE_JOB = 'steadfast-agent';
/** Prometheus' scrape job for the controller replicas. */
export const CONTROLLER_SCRAPE_JOB = 'steadfast-controller';

/**
 * The label that names the training job on the agent's training series. It is not `job`: that is
 * the scrape job Prometheus sets, so the agent scrape needs no `honor_labels: true` and a pushed
 * step cannot pass itself off as another scrape job's series.
 */
export const TRAINING_JOB_LABEL = 'training_job';

/**
 * The label that tells clusters apart where one Prometheus (or Thanos, Mimir) holds several: a
 * target label or an external label the operator sets. The dashboards filter every query by it
 * and the training recording rules keep it; where no series has it, nothing changes.
 */
export const CLUSTER_LABEL = 'cluster';

/** The training rank on the agent's training series. */
export const RANK_LABEL = 'rank';
