import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { AuditEntry } from '../core/audit.js';
import type { SimEnvironment } from './environment.js';
import { slurmNode } from './parts.js';

/**
 * The spine's scenario: a GPU falls off the bus on one node, and steadfast must drain that node
 * exactly once, from whichever report arrives first, recognising the others as the same fault.
 */

export interface TimelineStep {
  readonly label: string;
  /** Milliseconds after the injection; undefined when the step did not happen in time. */
  readonly afterMs: number | undefined;
  readonly detail: string;
}

export interface ScenarioResult {
  readonly node: string;
  readonly gpu: string;
  /** When the Xid was written (ms since the epoch); the timeline counts from here. */
  readonly injectedAt: number;
  /** The node's audit entries from the injection on, as last read. */
  readonly audit: readonly AuditEntry[];
  readonly timeline: TimelineStep[];
  /** Times slurmctld recorded a drain reason for the node (from its own log). */
  readonly slurmDrains: number;
  /** Times steadfast asked the backend to drain the node. */
  readonly backendDrains: number;
  readonly slurmState: string;
  readonly slurmReason: string;
  readonly ok: boolean;
  readonly problems: string[];
}

function streamMs(entry: AuditEntry): number {
  return Number(entry.id.split('-')[0]);
}

function signalOf(entry: AuditEntry): { source?: string; kind?: string } {
  const signal = entry.data.signal;
  return typeof signal === 'object' && signal !== null ? (signal as { source?: string; kind?: string }) : {};
}

export function countSlurmDrains(env: SimEnvironment, node: string): number {
  const log = readFileSync(join(env.root, 'slurm', 'slurmctld.log'), 'utf8');
  return log.split('\n').filter((line) => line.includes(`update_node: node ${node} reason set to`)).length;
}

/**
 * Injects Xid 79 on `node` GPU `gpuIndex` and waits until steadfast has drained the node and
 * the Prometheus alert for the same fault has arrived (or `timeoutMs` passes).
 */
export async function runFallenOffBus(
  env: SimEnvironment,
  options: { node: string; gpuIndex: number; timeoutMs?: number; waitForAlert?: boolean; via?: 'both' | 'nvml' },
): Promise<ScenarioResult> {
  const simNode = env.node(options.node);
  const gpu = simNode.gpu(options.gpuIndex).pciBusId;
  const timeoutMs = options.timeoutMs ?? 30_000;
  const waitForAlert = options.waitForAlert ?? true;
  const injectedAt = Date.now();
  simNode.injectXid(options.gpuIndex, 79, 'GPU has fallen off the bus.', { via: options.via });

  let drainedAt: number | undefined;
  let slurm = { state: '', reason: '' };
  let entries: AuditEntry[] = [];
  const deadline = injectedAt + timeoutMs;
  const alertArrived = (): boolean =>
    entries.some((entry) => entry.type === 'signal' && signalOf(entry).source === 'alertmanager' && signalOf(entry).kind === 'xid');
  while (Date.now() < deadline) {
    entries = (await env.audit(options.node)).filter((entry) => streamMs(entry) >= injectedAt - 5);
    if (drainedAt === undefined) {
      slurm = await slurmNode(env.slurm, options.node);
      if (/^drain/.test(slurm.state)) drainedAt = Date.now();
    }
    const actionSettled = entries.some((entry) => entry.type === 'action' && ['done', 'refused', 'failed'].includes(String(entry.data.state)));
    if (drainedAt !== undefined && actionSettled && (!waitForAlert || alertArrived())) break;
    await sleep(25);
  }

  const first = (predicate: (entry: AuditEntry) => boolean): AuditEntry | undefined => entries.find(predicate);
  const at = (entry: AuditEntry | undefined): number | undefined => (entry ? streamMs(entry) - injectedAt : undefined);
  const fastPath = first((entry) => entry.type === 'signal' && signalOf(entry).source === 'agent' && signalOf(entry).kind === 'xid');
  const decision = first((entry) => entry.type === 'decision');
  const done = first((entry) => entry.type === 'action' && entry.data.state === 'done');
  const alert = first((entry) => entry.type === 'signal' && signalOf(entry).source === 'alertmanager' && signalOf(entry).kind === 'xid');
  const backendDrains = entries.filter((entry) => entry.type === 'action' && entry.data.state === 'running').length;
  const slurmDrains = countSlurmDrains(env, options.node);

  const timeline: TimelineStep[] = [
    {
      label: `injected Xid 79 on ${options.node} GPU ${gpu}`,
      afterMs: 0,
      detail:
        options.via === 'nvml'
          ? 'an NVML Xid event, nothing in the kernel log'
          : simNode.nvml
            ? 'NVRM: Xid line in the kernel log and an NVML Xid event'
            : "NVRM: Xid line written to the node's kernel log",
    },
    { label: 'signal from the agent fast path', afterMs: at(fastPath), detail: fastPath?.summary ?? 'not seen' },
    { label: 'decision', afterMs: at(decision), detail: decision?.summary ?? 'not seen' },
    { label: 'action done', afterMs: at(done), detail: done?.summary ?? 'not seen' },
    { label: 'Slurm shows the node drained', afterMs: drainedAt === undefined ? undefined : drainedAt - injectedAt, detail: `${slurm.state}: ${slurm.reason}` },
    { label: 'Prometheus alert arrives', afterMs: at(alert), detail: alert?.summary ?? 'not seen' },
  ];
  const problems: string[] = [];
  if (drainedAt === undefined) problems.push(`${options.node} was not drained within ${timeoutMs} ms`);
  if (!slurm.reason.includes('Xid 79')) problems.push(`drain reason does not name Xid 79: "${slurm.reason}"`);
  if (slurmDrains !== 1) problems.push(`Slurm recorded ${slurmDrains} drains of ${options.node}, expected exactly 1`);
  if (backendDrains !== 1) problems.push(`steadfast asked the backend to drain ${backendDrains} times, expected exactly 1`);
  if (waitForAlert && !alert) problems.push('the Prometheus alert did not arrive');
  if (fastPath && alert && alert.data.sameFault !== true) {
    problems.push('the Prometheus alert was not recognised as the fault already handled');
  }
  return {
    node: options.node,
    gpu,
    injectedAt,
    audit: entries,
    timeline,
    slurmDrains,
    backendDrains,
    slurmState: slurm.state,
    slurmReason: slurm.reason,
    ok: problems.length === 0,
    problems,
  };
}
