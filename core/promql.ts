import { AGENT_SCRAPE_JOB, CONTROLLER_SCRAPE_JOB } from './scrape.js';

/**
 * PromQL building blocks for everything that writes a query: the rules, the dashboards, the
 * controller's watches and the multi-signal features. A selector is composed here, never pasted
 * into an expression by hand, so its quoting and escaping are right once for all of them.
 */

/** A PromQL string literal; JSON's escaping (backslash, quote, control characters) is valid PromQL. */
export function quote(value: string): string {
  return JSON.stringify(value);
}

/** Escapes a literal value for use inside a PromQL (RE2) regular expression. */
export function escapeRegex(value: string): string {
  return value.replace(/[\\^$.*+?()[\]{}|]/g, '\\$&');
}

// ---- Matchers and selectors ----------------------------------------------------------------

/** An exact value, or any of several values (rendered as an anchored `=~"a|b"`). */
export type LabelMatcher = string | { readonly oneOf: readonly string[] };

export type LabelMatchers = Readonly<Record<string, LabelMatcher>>;

/** `label="value"` */
export function equals(label: string, value: string): string {
  return `${label}=${quote(value)}`;
}

/** `label!="value"` */
export function notEquals(label: string, value: string): string {
  return `${label}!=${quote(value)}`;
}

/** `label=~"regex"` */
export function matches(label: string, regex: string): string {
  return `${label}=~${quote(regex)}`;
}

/** `{name="value",other=~"a|b"}` from matchers, in the order given. */
export function selector(matchers: LabelMatchers): string {
  const parts = Object.entries(matchers).map(([name, matcher]) =>
    typeof matcher === 'string' ? equals(name, matcher) : matches(name, matcher.oneOf.map(escapeRegex).join('|')),
  );
  return `{${parts.join(',')}}`;
}

/** `metric{m1,m2}` from rendered matchers, or the bare name without any. */
export function series(metric: string, ...matchers: string[]): string {
  return matchers.length === 0 ? metric : `${metric}{${matchers.join(',')}}`;
}

/**
 * Series the agents expose under their own scrape job, the training series included: those name
 * their training job in `training_job` (TRAINING_JOB_LABEL), never in `job`.
 */
export function agentSelector(matchers: LabelMatchers = {}, agentJob: string = AGENT_SCRAPE_JOB): string {
  return selector({ job: agentJob, ...matchers });
}

/** Series the steadfast controller exposes under its scrape job. */
export function controllerSelector(matchers: LabelMatchers = {}, controllerJob: string = CONTROLLER_SCRAPE_JOB): string {
  return selector({ job: controllerJob, ...matchers });
}

// ---- Functions and aggregations ------------------------------------------------------------

/** Window for rate()/increase() on agent and controller counters where no other is asked for. */
export const RATE_WINDOW = '5m';

export function rate(selector: string, window: string = RATE_WINDOW): string {
  return `rate(${selector}[${window}])`;
}

export function increase(selector: string, window: string = RATE_WINDOW): string {
  return `increase(${selector}[${window}])`;
}

/**
 * rate() of `series` with `label="value"` added: rate() drops the metric name, so the rates of
 * several counters joined with `or` would otherwise collide on the same labels.
 */
export function taggedRate(series: string, window: string, label: string, value: string): string {
  return `label_replace(${rate(series, window)}, ${quote(label)}, ${quote(value)}, "", "")`;
}

export function aggregateBy(op: 'sum' | 'min' | 'max' | 'avg' | 'count', labels: readonly string[], expr: string): string {
  return `${op} by (${labels.join(', ')}) (${expr})`;
}

export function sumBy(labels: readonly string[], expr: string): string {
  return aggregateBy('sum', labels, expr);
}

/** `sum by (labels) (rate(numerator)) / sum by (labels) (rate(denominator))`: e.g. seconds per operation. */
export function ratioOfRates(numerator: string, denominator: string, labels: readonly string[]): string {
  return `${sumBy(labels, rate(numerator))} / ${sumBy(labels, rate(denominator))}`;
}

/** 1 where `expr` equals `value`, else 0, keeping every series (a count of bad things that is 0, not absent). */
export function isEqual(expr: string, value: number): string {
  return `(${expr} == bool ${value})`;
}

/** Quantile of `histogram` (its name without `_bucket`) over RATE_WINDOW, per `labels`. */
export function histogramQuantile(quantile: number, histogram: string, labels: readonly string[], ...matchers: string[]): string {
  return `histogram_quantile(${quantile}, ${sumBy(['le', ...labels], rate(series(`${histogram}_bucket`, ...matchers)))})`;
}

/**
 * How many events a counter counted within `window`, a series' first appearance included:
 *  - a series that existed `window` ago: increase(), which sees every increment between two
 *    samples, also across a counter reset (a new event after a restart);
 *  - a series that did not exist `window` ago (a labelled counter is born at its first
 *    increment): its current value, because increase() needs two samples and would miss the
 *    events counted at birth — unless it shows exactly the highest count it had in the `memory`
 *    before: that is an exporter restart (a gap of missed scrapes) reading the same count back,
 *    not a new event. A count that comes back lower is a reset and counts.
 * A count that stays, drops or vanishes, or comes back unchanged, is no event.
 */
export function newEvents(series: string, window: string, memory = '1h'): string {
  const earlier = `${series} offset ${window}`;
  const highestBefore = `max_over_time(${series}[${memory}] offset ${window})`;
  return [
    `(increase(${series}[${window}]) > 0 unless (${series} unless ${earlier}))`,
    'or',
    `(${series} > 0 unless ${earlier} unless ${series} == ${highestBefore})`,
  ].join('\n');
}

/** Indents every line of a multi-line expression, for nesting it inside another. */
export function indent(expr: string, by = 2): string {
  return expr
    .split('\n')
    .map((line) => ' '.repeat(by) + line)
    .join('\n');
}
