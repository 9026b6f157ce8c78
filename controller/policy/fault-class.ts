import type { Signal } from '../../core/signal.js';
import { classifyXid, type XidRemedy } from '../../core/xid.js';
import { FAULT_CITATIONS, type FaultClass } from '../../core/ladder.js';
import { catalogueEntry } from '../../rules/catalogue.js';
import type { XidAction, XidKind } from '../../core/xid-policy.js';

/**
 * Which kind of fault a Signal reports, so the recovery ladder (controller/policy/ladder/) knows which
 * rung to start on. A pure function of the signal.
 *
 * The classes follow DeadPool's error classification (003, Table II and §VI-B: transient faults
 * are recovered locally, device / host / persistent network faults replace the node, software
 * bugs and unknown failures go to an external fallback) refined by ByteRobust's real-time checks
 * (000, §4.1: high-confidence machine events are evicted at once, network alerts are tolerated a
 * while, user-space errors roll the code back, crashes and NaN losses without a culprit go to
 * stop-time checks, performance anomalies to stack aggregation).
 */

/**
 * A signal the ladder acts on. `node` is the node the signal names: the culprit for `machine` and
 * `network`, only a hint (the node that saw it) for every other class.
 */
export interface FaultVerdict {
  readonly verdict: 'fault';
  readonly faultClass: FaultClass;
  readonly node?: string;
  readonly reason: string;
  readonly citation: string;
  /**
   * The cure the Xid catalogue (core/xid.ts) names for a machine fault, where it names one short
   * of replacing the node: a GPU reset, or a node reboot (a GPU lost from the bus). The ladders
   * take it when the operator turned that remedy on (docs/remedies.md).
   */
  readonly remedy?: 'reset_gpu' | 'reboot_node';
  /** The Xid the signal reports (an Xid signal, or an alert counting one), as the catalogue names it. */
  readonly xid?: { readonly code: number; readonly meaning: string };
  /** Set where a configured Xid policy, not the catalogue, decided this fault (xid-rule.ts). */
  readonly policy?: XidPolicyChoice;
}

/** The configured rule that made a signal a fault: which code, what to do, and the layer that said so. */
export interface XidPolicyChoice {
  readonly kind: XidKind;
  readonly code: number;
  readonly meaning: string;
  readonly action: Exclude<XidAction, 'ignore' | 'observe'>;
  readonly source: string;
}

/** A signal that is not a training job's fault: a resolved alert, steadfast watching itself. */
export interface IgnoreVerdict {
  readonly verdict: 'ignore';
  readonly reason: string;
}

export type Classification = FaultVerdict | IgnoreVerdict;

export interface ClassifyOptions {
  /** Exit codes the job declares as its own errors (a training script's `sys.exit(3)` on bad config). */
  readonly userErrorExitCodes?: readonly number[];
}

const CITE_MACHINE = FAULT_CITATIONS.machine;
const CITE_NETWORK = FAULT_CITATIONS.network;
const CITE_USER = FAULT_CITATIONS.user_code;
const CITE_CRASH = FAULT_CITATIONS.crash;
const CITE_PERFORMANCE = FAULT_CITATIONS.performance;
const CITE_TRANSIENT = FAULT_CITATIONS.transient;
const CITE_PREFLIGHT = `ByteRobust §6.2 (machines checked before a job runs on them, bad ones replaced by warm standbys); ${CITE_MACHINE}`;

/**
 * Python exception types that point at the job's own code. Deliberately not RuntimeError or
 * OSError: PyTorch raises those for CUDA, NCCL and storage failures too.
 */
const USER_EXCEPTIONS = [
  'TypeError',
  'IndexError',
  'KeyError',
  'AttributeError',
  'ValueError',
  'AssertionError',
  'ImportError',
  'ModuleNotFoundError',
  'SyntaxError',
  'IndentationError',
  'NameError',
  'UnboundLocalError',
  'ZeroDivisionError',
  'NotImplementedError',
  'RecursionError',
] as const;

// Python prints `TypeError: message` (or a bare `TypeError` at the end of a line); a dotted prefix
// (`torch._dynamo.exc.TypeError`) still names the type.
const USER_EXCEPTION_PATTERN = new RegExp(`(?:^|[\\s.:;(])(${USER_EXCEPTIONS.join('|')})(?::|\\s*$)`, 'm');

/** An RDMA device name as NCCL and the kernel print it (`mlx5_3`, `mlx5_3:1`, `bnxt_re0`). */
const RDMA_PORT_PATTERN = /\b((?:mlx[45]|bnxt_re|hfi1|irdma|efa|qedr|rocep\d+s\d+f)_?\d+(?::\d+)?)\b/;

const EXIT_CODE_PATTERN = /\bexit ?code:? ?(-?\d+)\b/i;

/**
 * What an alert of steadfast's rules means is stated with its rule (rules/domains/, collected in
 * rules/catalogue.ts): the class of fault it reports, for a job's ladder and the node ladder alike
 * (a `machine` fault takes a node outside any job out of service), whether its Xid decides the
 * class instead, or whether it is steadfast watching itself.
 */

/** What broken hardware an alert names, where its rule says (the node ladder's drain reason). */
export function alertMeaning(alertname: string): string | undefined {
  const meaning = catalogueEntry(alertname)?.meaning;
  return meaning?.role === 'fault' ? meaning.drainReason : undefined;
}

function text(value: string | number | boolean | undefined): string {
  return typeof value === 'string' ? value : '';
}

function fault(faultClass: FaultClass, node: string | undefined, reason: string, citation: string): FaultVerdict {
  return node === undefined ? { verdict: 'fault', faultClass, reason, citation } : { verdict: 'fault', faultClass, node, reason, citation };
}

/** A machine verdict with the catalogue's remedy (none for a crash: there is no culprit to cure). */
function withRemedy(verdict: FaultVerdict, remedy: FaultVerdict['remedy']): FaultVerdict {
  return remedy === undefined || verdict.faultClass !== 'machine' ? verdict : { ...verdict, remedy };
}

/** Machine and network verdicts must name their culprit; without one the fault is a crash to diagnose. */
export function culpritOrCrash(faultClass: 'machine' | 'network', node: string | undefined, reason: string, citation: string): FaultVerdict {
  if (node !== undefined) return fault(faultClass, node, reason, citation);
  return fault('crash', undefined, `${reason}, but the signal names no node`, CITE_CRASH);
}

export function classifySignal(signal: Signal, options: ClassifyOptions = {}): Classification {
  if (signal.evidence.status === 'resolved') return { verdict: 'ignore', reason: 'the alert resolved' };
  switch (signal.kind) {
    case 'xid':
      return classifyXidSignal(signal);
    case 'gpu_lost':
      return withRemedy(culpritOrCrash('machine', signal.node, `GPU ${signal.gpu ?? 'unknown'} fell off the bus`, CITE_MACHINE), 'reboot_node');
    case 'nccl_timeout':
      return classifyNcclTimeout(signal);
    case 'worker_failed':
      return classifyWorkerFailure(signal, options);
    case 'alert':
      return classifyAlert(signal);
    case 'sxid':
      return classifySxidSignal(signal);
    case 'suspect_node':
      // A precursor, not a failure: the job keeps training while its stacks are looked at.
      return fault(
        'performance',
        signal.node,
        `multi-signal detection: ${signal.node ?? 'a node'} unlike its peers (score ${String(signal.evidence.score)})`,
        CITE_PERFORMANCE,
      );
    case 'preflight_failed':
      return culpritOrCrash('machine', signal.node, preflightReason(signal), CITE_PREFLIGHT);
  }
}

/**
 * A node the job's preflight named (clients/python/steadfast_preflight.py): every pair test it
 * was in failed while its partners passed with others, so its link is the culprit. It is taken
 * out before the job's first iteration, as a machine fault is (ByteRobust §6.2: a machine found
 * bad before the job runs on it is replaced by a warm standby).
 */
function preflightReason(signal: Signal): string {
  const seconds = typeof signal.evidence.seconds === 'number' ? ` in ${signal.evidence.seconds} s` : '';
  return `preflight: the all-reduce across job ${signal.job ?? '?'} named ${signal.node ?? 'no node'}${seconds}`;
}

/**
 * An Xid's class in a Signal's terms: the controller's one reading of the catalogue (core/xid.ts).
 * The catalogue's `fatal` is a signal's `critical`.
 */
export function xidSignalClass(code: number, message: string): { readonly severity: Signal['severity']; readonly meaning: string; readonly remedy: XidRemedy } {
  const xidClass = classifyXid(code, message);
  return { severity: xidClass.severity === 'fatal' ? 'critical' : xidClass.severity, meaning: xidClass.meaning, remedy: xidClass.remedy };
}

/** The Xid a signal reports: an xid signal's code, or the `xid` label of an alert that counts Xids. */
function xidCodeOf(signal: Signal): number | undefined {
  const code = signal.evidence.xid ?? signal.evidence['label.xid'];
  const parsed = typeof code === 'number' ? code : typeof code === 'string' && /^\d+$/.test(code) ? Number(code) : undefined;
  return parsed;
}

function classifyXidSignal(signal: Signal): FaultVerdict {
  const code = xidCodeOf(signal);
  const message = text(signal.evidence.message);
  const xidClass = code === undefined ? undefined : xidSignalClass(code, message);
  // The agent classifies NVLink5 and Xid 154 from the message, which an alert does not carry;
  // its verdict reaches us as the signal's severity (or the alert's xid_severity label).
  const fatal = xidClass?.severity === 'critical' || signal.severity === 'critical' || signal.evidence['label.xid_severity'] === 'fatal';
  const what = `Xid ${code ?? '?'} (${xidClass?.meaning ?? 'unclassified'})`;
  const xid = code === undefined ? {} : { xid: { code, meaning: xidClass?.meaning ?? 'unclassified' } };
  if (fatal) {
    const remedy = xidClass?.remedy === 'reset_gpu' || xidClass?.remedy === 'reboot_node' ? xidClass.remedy : undefined;
    return { ...withRemedy(culpritOrCrash('machine', signal.node, `fatal ${what}`, CITE_MACHINE), remedy), ...xid };
  }
  return { ...fault('transient', signal.node, `non-fatal ${what}`, CITE_TRANSIENT), ...xid };
}

/** Whether an SXid's kernel line calls it fatal (`SXid (PCI:…): 20034, Fatal, …`; `Non-fatal` otherwise). */
export function sxidIsFatal(message: string): boolean {
  return /:\s*\d+,\s*Fatal\b/.test(message);
}

/**
 * An NVSwitch error an agent sent on its fast path (only for codes a configured policy names,
 * core/xid-policy.ts). Without a rule for it (the configuration changed since the agent asked),
 * as the alert on the SXid counter reads it: fatal takes the node out, non-fatal is only observed.
 */
function classifySxidSignal(signal: Signal): Classification {
  const what = `SXid ${String(signal.evidence.sxid ?? '?')} on NVSwitch ${text(signal.evidence.nvswitch) || 'unknown'}`;
  if (signal.severity === 'critical') return culpritOrCrash('machine', signal.node, `fatal ${what}`, CITE_MACHINE);
  return { verdict: 'ignore', reason: `non-fatal ${what}: observed only` };
}

function classifyNcclTimeout(signal: Signal): FaultVerdict {
  const port = text(signal.evidence['label.device']) || RDMA_PORT_PATTERN.exec(text(signal.evidence.message))?.[1];
  if (port) return culpritOrCrash('network', signal.node, `NCCL timeout naming RDMA port ${port}`, CITE_NETWORK);
  // Every rank waiting on the faulty one times out: the reporting node is a witness, not the culprit.
  return fault('crash', signal.node, 'NCCL collective timed out without naming a port', CITE_CRASH);
}

function exitCodeOf(signal: Signal): number | undefined {
  const direct = signal.evidence.exitCode;
  if (typeof direct === 'number') return direct;
  const found = EXIT_CODE_PATTERN.exec(text(signal.evidence.message))?.[1];
  return found === undefined ? undefined : Number(found);
}

function classifyWorkerFailure(signal: Signal, options: ClassifyOptions): FaultVerdict {
  const exception = USER_EXCEPTION_PATTERN.exec(text(signal.evidence.message))?.[1];
  if (exception !== undefined) return fault('user_code', signal.node, `worker raised ${exception}`, CITE_USER);
  const exitCode = exitCodeOf(signal);
  if (exitCode !== undefined && (options.userErrorExitCodes ?? []).includes(exitCode)) {
    return fault('user_code', signal.node, `worker exited with ${exitCode}, which the job declares a user error`, CITE_USER);
  }
  const how = exitCode === undefined ? '' : ` with exit code ${exitCode}`;
  return fault('crash', signal.node, `worker failed${how} without a user-code exception`, CITE_CRASH);
}

function classifyAlert(signal: Signal): Classification {
  const alertname = text(signal.evidence.alertname);
  const entry = catalogueEntry(alertname)?.meaning;
  if (entry?.role === 'self-monitoring') return { verdict: 'ignore', reason: `${alertname} concerns steadfast itself, not a training job` };
  // Classed by its Xid as the agent's Xid signals are: an alert the intake maps to an xid signal
  // comes here only when its kind was lost on the way (a renamed route), one that stays an alert always.
  if (entry?.role === 'xid-fault') return classifyXidSignal({ ...signal, severity: entry.fatal === 'always' ? 'critical' : 'warning' });
  if (entry === undefined) return { verdict: 'ignore', reason: `no recovery rule for alert ${alertname || '(unnamed)'}` };
  const reason = `${alertname}${signal.node === undefined ? '' : ` on ${signal.node}`}`;
  const verdict =
    entry.faultClass === 'machine' || entry.faultClass === 'network'
      ? culpritOrCrash(entry.faultClass, signal.node, reason, entry.citation)
      : fault(entry.faultClass, signal.node, reason, entry.citation);
  // An alert that counts Xids (SteadfastXidNodeRebootRequired) names the one it counted.
  const code = xidCodeOf(signal);
  return code === undefined ? verdict : { ...verdict, xid: { code, meaning: xidSignalClass(code, '').meaning } };
}
