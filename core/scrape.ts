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
 * The label that names the training job on the agent's training series. The agent exports it as
 * `job`; Prometheus keeps that name only when the agent scrape sets `honor_labels: true` (as the
 * README's scrape config does), and otherwise renames it `exported_job` and puts the scrape job in
 * `job`. Switch it here and every training query follows.
 */
export const TRAINING_JOB_LABEL = 'job';

/** The training rank on the agent's training series. */
export const RANK_LABEL = 'rank';
