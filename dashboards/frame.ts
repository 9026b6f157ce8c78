/**
 * What every steadfast dashboard shares around its panels: the tag, the datasource, the template
 * variables and the series they select, the actions annotation and the dashboard frame. The
 * PromQL itself is composed with core/promql.ts; panels are built with
 * dashboards/panels.ts.
 */
import type { Builder, Dataquery } from '@grafana/grafana-foundation-sdk/cog';
import type { DataSourceRef } from '@grafana/grafana-foundation-sdk/common';
import {
  AnnotationQueryBuilder,
  DashboardBuilder,
  DashboardCursorSync,
  DashboardLinkBuilder,
  DashboardLinkType,
  DatasourceVariableBuilder,
  QueryVariableBuilder,
  VariableRefresh,
  VariableSort,
  type Dashboard,
} from '@grafana/grafana-foundation-sdk/dashboard';
import { ACTION_ANNOTATION_TAG } from '../core/steps.js';
import { matches, series } from '../core/promql.js';
import { CLUSTER_LABEL, TRAINING_JOB_LABEL } from '../core/scrape.js';

export const STEADFAST_TAG = 'steadfast';

export const DATASOURCE_VARIABLE = 'datasource';
export const CLUSTER_VARIABLE = 'cluster';
export const NODE_VARIABLE = 'node';
export const JOB_VARIABLE = 'job';

/** Every panel and query reads from whichever Prometheus the `datasource` variable selects. */
export const datasource: DataSourceRef = { type: 'prometheus', uid: `\${${DATASOURCE_VARIABLE}}` };

// ---- Selections by the variables -----------------------------------------------------------

/**
 * Every query's first matcher: the clusters picked in the `cluster` variable. Its "All" is `.*`,
 * which also matches series without the label, so a Prometheus without one loses nothing.
 */
export const clusterMatcher = matches(CLUSTER_LABEL, `$${CLUSTER_VARIABLE}`);

/** The agent-side matcher: series of the nodes picked in the `node` variable. */
export const nodeMatcher = matches(NODE_VARIABLE, `$${NODE_VARIABLE}`);

/** Training series of the jobs picked in the `job` variable. */
export const jobMatcher = matches(TRAINING_JOB_LABEL, `$${JOB_VARIABLE}`);

/** A series of the selected clusters (the controller's, ALERTS, up). */
export function clusterSeries(metric: string, ...matchers: string[]): string {
  return series(metric, clusterMatcher, ...matchers);
}

/** A series from the agents on the selected nodes. */
export function nodeSeries(metric: string, ...matchers: string[]): string {
  return clusterSeries(metric, nodeMatcher, ...matchers);
}

/** A training series (or a recording rule over them) of the selected jobs. */
export function jobSeries(metric: string, ...matchers: string[]): string {
  return clusterSeries(metric, jobMatcher, ...matchers);
}

// ---- Variables -----------------------------------------------------------------------------

export function datasourceVariable(): DatasourceVariableBuilder {
  return new DatasourceVariableBuilder(DATASOURCE_VARIABLE).label('Prometheus').type('prometheus');
}

interface LabelVariable {
  name: string;
  label: string;
  /** The Prometheus label whose values the variable offers. */
  sourceLabel: string;
  sourceMetric: string;
  /** Several values and "All" (default), or exactly one. */
  multi?: boolean;
}

function labelValuesVariable(variable: LabelVariable): QueryVariableBuilder {
  // Every variable but the cluster's offers only the values of the selected clusters.
  const source = variable.name === CLUSTER_VARIABLE ? variable.sourceMetric : clusterSeries(variable.sourceMetric);
  const query = `label_values(${source}, ${variable.sourceLabel})`;
  const builder = new QueryVariableBuilder(variable.name)
    .label(variable.label)
    .datasource(datasource)
    .query(query)
    .definition(query)
    .refresh(VariableRefresh.OnTimeRangeChanged)
    .sort(VariableSort.NaturalAsc);
  if (variable.multi ?? true) builder.multi(true).includeAll(true).allValue('.*');
  return builder;
}

/** `cluster` variable listing the clusters Prometheus scrapes; "All" where there is no such label. */
export function clusterVariable(): QueryVariableBuilder {
  return labelValuesVariable({ name: CLUSTER_VARIABLE, label: 'Cluster', sourceLabel: CLUSTER_LABEL, sourceMetric: 'up' });
}

/** `node` variable listing every node whose agent reports `sourceMetric`; multi-value unless `multi` is false. */
export function nodeVariable(sourceMetric: string, options: { multi?: boolean } = {}): QueryVariableBuilder {
  return labelValuesVariable({ name: NODE_VARIABLE, label: 'Node', sourceLabel: NODE_VARIABLE, sourceMetric, ...options });
}

/** `job` variable listing every training job that reports `sourceMetric`. */
export function jobVariable(sourceMetric: string): QueryVariableBuilder {
  return labelValuesVariable({ name: JOB_VARIABLE, label: 'Training job', sourceLabel: TRAINING_JOB_LABEL, sourceMetric });
}

// ---- Annotations and the dashboard frame ---------------------------------------------------

/** Grafana's own annotation store, where the controller posts its actions. */
export const GRAFANA_ANNOTATIONS: DataSourceRef = { type: 'grafana', uid: '-- Grafana --' };

/**
 * The target of an annotation query on Grafana's own store, filtered by tags. The SDK types an
 * annotation target as a data query; this is the shape Grafana reads for a tag filter.
 */
class TagsAnnotationTarget implements Builder<Dataquery> {
  constructor(private readonly tags: readonly string[]) {}

  build(): Dataquery {
    return {
      type: 'tags',
      tags: [...this.tags],
      matchAny: false,
      limit: 500,
      _implementsDataqueryVariant: () => undefined,
    } as Dataquery;
  }
}

/** Every action the controller finished (done, refused, failed), as Grafana annotations tagged `steadfast`. */
export function actionsAnnotation(): AnnotationQueryBuilder {
  return new AnnotationQueryBuilder()
    .name('steadfast actions')
    .datasource(GRAFANA_ANNOTATIONS)
    .enable(true)
    .iconColor('orange')
    .target(new TagsAnnotationTarget([ACTION_ANNOTATION_TAG]));
}

export interface DashboardFrame {
  uid: string;
  title: string;
  description: string;
}

/**
 * What every steadfast dashboard shares: uid, the tag, the datasource variable, the actions
 * annotation, links to its sibling dashboards, refresh and time defaults. Callers add their
 * own variables, then rows and panels.
 */
export function steadfastDashboard(frame: DashboardFrame): DashboardBuilder {
  return new DashboardBuilder(frame.title)
    .uid(frame.uid)
    .tags([STEADFAST_TAG])
    .description(frame.description)
    .editable()
    .tooltip(DashboardCursorSync.Crosshair)
    .refresh('30s')
    .time({ from: 'now-6h', to: 'now' })
    .timezone('browser')
    .link(new DashboardLinkBuilder('steadfast').type(DashboardLinkType.Dashboards).tags([STEADFAST_TAG]).asDropdown(true).includeVars(true).keepTime(true))
    .annotation(actionsAnnotation())
    .withVariable(datasourceVariable())
    .withVariable(clusterVariable());
}

/** Numbers the panels 1..n in layout order; Grafana needs unique ids for links and repeats. */
export function numberPanels(dashboard: Dashboard): Dashboard {
  (dashboard.panels ?? []).forEach((panel, index) => {
    panel.id = index + 1;
  });
  return dashboard;
}
