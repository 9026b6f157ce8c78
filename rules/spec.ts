import type { FaultClass } from '../core/ladder.js';
import type { SignalKind } from '../core/signal.js';

/**
 * Rules as code, monitoring-mixin style: each domain module (rules/domains/<domain>.ts) builds
 * its rule groups from the one thresholds module (rules/thresholds.ts), and rules/build.ts renders
 * them to the Prometheus rule files rules/<domain>.yml that Prometheus loads and promtool tests.
 * Each alert carries its meaning (fault class, signal kind, citation, route), which the controller
 * and the Alertmanager config read through rules/catalogue.ts.
 */

export const DOMAINS = ['gpu', 'xid', 'network', 'storage', 'training', 'steadfast', 'compat'] as const;
export type Domain = (typeof DOMAINS)[number];

export type AlertSeverity = 'critical' | 'warning' | 'info';

/**
 * Where Alertmanager delivers an alert (rules/alertmanager.yml): every alert of ours reaches the
 * controller's webhook; `humans` pages people as well, for what steadfast cannot fix itself. The
 * renderer writes it as the `notify="humans"` label the people's route matches on.
 */
export type AlertRoute = 'controller' | 'humans';

/** The label, and its value, that sends an alert to people (the `humans` receiver). */
export const PAGE_HUMANS_LABEL = { name: 'notify', value: 'humans' } as const;

/**
 * The signal kind the controller turns a firing alert into (core/signal.ts): `xid` and
 * `gpu_lost` carry a GPU fault the agent's fast path reports too; everything else is an `alert`.
 * An `xid` alert must carry its Xid in an `xid` label, or the controller refuses it.
 */
export type AlertSignalKind = Extract<SignalKind, 'alert' | 'xid' | 'gpu_lost'>;

/** A fault of a training job or a node, of one class whatever it carries. */
export interface FaultMeaning {
  readonly role: 'fault';
  readonly faultClass: FaultClass;
  readonly signal: AlertSignalKind;
  /** The paper and section (or other source) the class follows; the verdict carries it. */
  readonly citation: string;
  readonly route: AlertRoute;
  /**
   * For an alert that names broken hardware: what is broken, in the words a drained node's
   * reason carries (the node ladder).
   */
  readonly drainReason?: string;
}

/**
 * A fault whose class the Xid it carries decides (core/xid.ts), as for the agent's own Xid
 * signals: `always` fatal (a machine fault), or `by-code`, fatal only when the Xid's class is.
 */
export interface XidFaultMeaning {
  readonly role: 'xid-fault';
  readonly fatal: 'always' | 'by-code';
  readonly signal: AlertSignalKind;
  readonly route: AlertRoute;
}

/** steadfast watching itself: the controller records the alert and moves no job or node for it. */
export interface SelfMonitoringMeaning {
  readonly role: 'self-monitoring';
  readonly signal: 'alert';
  readonly route: AlertRoute;
}

/** What an alert means to the controller and to Alertmanager; rules/catalogue.ts collects them. */
export type AlertMeaning = FaultMeaning | XidFaultMeaning | SelfMonitoringMeaning;

export interface AlertRule {
  readonly kind: 'alert';
  /** CamelCase, starting with `Steadfast`. */
  readonly alert: string;
  readonly expr: string;
  /** Prometheus duration; `0s` fires at the first evaluation that matches. */
  readonly for: string;
  readonly severity: AlertSeverity;
  /** Short and static. */
  readonly summary: string;
  /** Templated: names the node / GPU / port / mount / job from the labels. */
  readonly description: string;
  /** File name under docs/runbooks/, e.g. `steadfast-xid-fatal.md`. */
  readonly runbook: string;
  /**
   * The `domain` label, which Alertmanager routes and inhibits on; the module's own domain when
   * left out. The xid module's alerts are GPU faults to the controller, so they set `gpu`.
   */
  readonly domain?: Domain;
  /**
   * Extra static labels. `severity`, `domain` and `notify` come from the fields above and from
   * the meaning's route, and may not be set here.
   */
  readonly labels?: Readonly<Record<string, string>>;
  /** What the alert means: its fault class (or that it is steadfast's own), signal kind and route. */
  readonly meaning: AlertMeaning;
}

export interface RecordingRule {
  readonly kind: 'record';
  /** `level:metric:operations`, e.g. `node:steadfast_rdma_receive_bytes:rate1m`. */
  readonly record: string;
  readonly expr: string;
  readonly labels?: Readonly<Record<string, string>>;
}

export type Rule = AlertRule | RecordingRule;

export interface RuleGroup {
  readonly name: string;
  readonly rules: readonly Rule[];
}

/** What every domain module exports. */
export interface DomainRules {
  readonly domain: Domain;
  groups(thresholds: import('./thresholds.js').Thresholds): RuleGroup[];
}

export function alert(spec: Omit<AlertRule, 'kind'>): AlertRule {
  return { kind: 'alert', ...spec };
}

export function record(spec: Omit<RecordingRule, 'kind'>): RecordingRule {
  return { kind: 'record', ...spec };
}

/** `5m` → `5 minutes`, `1h` → `1 hour`, for descriptions; a compound duration stays as written. */
export function humanDuration(duration: string): string {
  const match = /^(\d+)(s|m|h|d)$/.exec(duration);
  if (!match) return duration;
  const [, amount = '', unit = ''] = match;
  const word = ({ s: 'second', m: 'minute', h: 'hour', d: 'day' } as Record<string, string>)[unit] ?? unit;
  return `${amount} ${word}${amount === '1' ? '' : 's'}`;
}
