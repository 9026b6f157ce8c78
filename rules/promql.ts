import type { Thresholds } from './thresholds.js';

/**
 * PromQL building blocks for the domain modules, so a selector is written once (from
 * thresholds.selectors) and never pasted into an expression by hand.
 */

/** An exact value, or any of several values (rendered as an anchored `=~"a|b"`). */
export type LabelMatcher = string | { readonly oneOf: readonly string[] };

/** A PromQL string literal; JSON's escaping (backslash, quote, control characters) is valid PromQL. */
function quote(value: string): string {
  return JSON.stringify(value);
}

/** Escapes a literal value for use inside a PromQL (RE2) regular expression. */
function escapeRegex(value: string): string {
  return value.replace(/[\\^$.*+?()[\]{}|]/g, '\\$&');
}

/** `{name="value",other=~"a|b"}` from matchers, in the order given. */
export function selector(matchers: Readonly<Record<string, LabelMatcher>>): string {
  const parts = Object.entries(matchers).map(([name, matcher]) =>
    typeof matcher === 'string' ? `${name}=${quote(matcher)}` : `${name}=~${quote(matcher.oneOf.map(escapeRegex).join('|'))}`,
  );
  return `{${parts.join(',')}}`;
}

/**
 * Series the agents expose under their own scrape job. Not the training series: with
 * `honor_labels: true` on the agent scrape job (rules/README.md) their `job` label is the
 * training job's name.
 */
export function agentSelector(thresholds: Thresholds, matchers: Readonly<Record<string, LabelMatcher>> = {}): string {
  return selector({ job: thresholds.selectors.agentJob, ...matchers });
}

/** Series the steadfast controller exposes under its scrape job. */
export function controllerSelector(thresholds: Thresholds, matchers: Readonly<Record<string, LabelMatcher>> = {}): string {
  return selector({ job: thresholds.selectors.controllerJob, ...matchers });
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

/** `5m` → `5 minutes`, `1h` → `1 hour`, for descriptions; a compound duration stays as written. */
export function humanDuration(duration: string): string {
  const match = /^(\d+)(s|m|h|d)$/.exec(duration);
  if (!match) return duration;
  const [, amount = '', unit = ''] = match;
  const word = ({ s: 'second', m: 'minute', h: 'hour', d: 'day' } as Record<string, string>)[unit] ?? unit;
  return `${amount} ${word}${amount === '1' ? '' : 's'}`;
}
