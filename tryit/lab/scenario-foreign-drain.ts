import type { ProtectedLab } from './protected.js';
import type { ProtectedLabOptions } from './protected-options.js';
import {
  RECOVERY_TIMEOUT_MS,
  at,
  recoveryDeadline,
  beforeNodeFault,
  entriesSince,
  firstStep,
  judgeResumption,
  receivedAt,
  report,
  step,
  timeLeft,
  until,
  waitForNewRun,
  waitForRunning,
  type ScenarioReport,
} from './scenario-support.js';

/** The lab the scenario needs: GPU resets on, each agent on a simulated nvidia-smi. A lab of its own: it leaves nodes drained. */
export const FOREIGN_DRAIN_LAB: ProtectedLabOptions = { gpuReset: true };

/** The GPU the injected Xids name; the simulated nvidia-smi lists it as GPU 2. */
const GPU = '0000:3a:00';
const GPU_INDEX = 2;
const XID_48 = 'An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.';
const ADMIN_REASON = 'admin: fan replacement';
const SECOND_ADMIN_REASON = 'admin: PSU check';

/**
 * Others' drains are kept (NVIDIA/NVSentinel#1424, #1633). An administrator drains a node of the
 * training job by hand ("admin: fan replacement"); then a fatal Xid 48 (cure: a GPU reset) hits
 * it. The reset is done through the node's agent (a remedy is allowed), but the job is not
 * relaunched on a node someone else drained: the node is evicted, a standby takes its place, and
 * the node stays drained with the administrator's reason. Then, on a node outside the job that
 * another administrator drained, a reset that fails (the GPU does not come back): steadfast's
 * drain reason is appended after theirs, never over it.
 */
export async function runForeignDrain(lab: ProtectedLab): Promise<ScenarioReport> {
  const problems: string[] = [];
  const job = lab.job;
  const { before, known, startRecord, victim } = await beforeNodeFault(lab);
  const gpus = lab.gpus.get(victim);
  if (gpus === undefined) throw new Error(`the lab has no simulated GPUs for ${victim}: start it with FOREIGN_DRAIN_LAB`);

  const drainedAt = Date.now();
  await lab.adminDrain(victim, ADMIN_REASON);
  gpus.needsReset(GPU_INDEX, 48, XID_48);
  const t0 = lab.injectXid(victim, 48, XID_48, GPU);
  const deadline = recoveryDeadline(t0);

  const relaunched = await waitForNewRun(lab, known, deadline);
  if (relaunched === undefined) problems.push(`no run trained after the Xid within ${RECOVERY_TIMEOUT_MS / 1000} s of the fault`);
  const runningAt = await waitForRunning(lab, (record) => record.nodes.length === startRecord.nodes.length && !record.nodes.includes(victim), deadline);
  if (runningAt === undefined) problems.push(`the ladder did not see training progress again on nodes without ${victim}`);

  const entries = entriesSince(await lab.audit(), t0, job);
  const signal = entries.find((entry) => entry.type === 'signal' && entry.node === victim && /xid/i.test(entry.summary));
  const reset = entries.find(
    (entry) => entry.type === 'action' && entry.summary.startsWith(`${job}: reset_gpu ${victim}: done`) && /drained by someone else/.test(entry.summary),
  );
  const activated = entries.find((entry) => entry.type === 'action' && /standby \S+ activated in place of/.test(entry.summary));
  const restarted = entries.find((entry) => entry.type === 'action' && entry.summary.startsWith(`${job}: restart: done`));
  const record = await lab.jobRecord();
  const kept = await lab.sinfo(victim);
  if (!signal) problems.push(`no Xid signal from ${victim} in the audit`);
  if (!reset) {
    const other = entries.filter((entry) => entry.type === 'action' && entry.summary.startsWith(`${job}: reset_gpu`)).map((entry) => entry.summary);
    problems.push(
      `no GPU reset of ${victim} followed by its eviction (drained by someone else) in the audit${other.length > 0 ? `; the reset step: ${other.join(' | ')}` : ''}`,
    );
  }
  if (!gpus.resets().includes(GPU_INDEX)) problems.push(`the simulated nvidia-smi of ${victim} saw no reset of GPU ${GPU_INDEX}`);
  if (record.nodes.includes(victim)) problems.push(`the job still runs on ${victim}, which an administrator drained: ${record.nodes.join(', ')}`);
  if (!/^drain/.test(kept.state) || !kept.reason.startsWith(ADMIN_REASON))
    problems.push(`${victim} is ${kept.state} "${kept.reason}" in sinfo: the administrator's drain ("${ADMIN_REASON}") is not kept first`);

  // Case 2: outside the job, on a node another administrator drained, the reset fails.
  const { other, t1, appended } = await failedOnForeignDrain(lab, victim, problems);
  const second = (await lab.audit()).find(
    (entry) => t1 !== undefined && Date.parse(entry.time) >= t1 && entry.type === 'action' && entry.node === other && /kept first/.test(entry.summary),
  );
  if (other !== undefined && !second) {
    const seen = (await lab.audit()).filter((entry) => t1 !== undefined && Date.parse(entry.time) >= t1 && entry.node === other).map((entry) => entry.summary);
    problems.push(`no failed reset of ${other} audited with the administrator's drain kept first (audit about ${other}: ${seen.join(' | ') || 'nothing'})`);
  }

  const resumption = relaunched === undefined ? undefined : judgeResumption(lab, [before], relaunched);
  const timeline = [
    step(`administrator drained ${victim} by hand ("${ADMIN_REASON}")`, drainedAt, t0, `scontrol update NodeName=${victim} State=DRAIN`),
    step(`fatal Xid 48 appended to ${victim}'s kernel log`, t0, t0, `NVRM: Xid (PCI:${GPU}): 48, An uncorrectable double bit error (DBE)`),
    step('detected: the agent on the node posted it, the controller stored the signal', receivedAt(signal), t0, signal?.summary ?? ''),
    step(`GPU ${GPU} reset through ${victim}'s agent; ${victim} evicted, its drain kept`, at(reset), t0, reset?.summary ?? ''),
    step('a standby took its place', at(activated), t0, activated?.summary ?? ''),
    step(`relaunched with sbatch: run ${relaunched ?? '?'} on ${record.nodes.join(', ')}`, at(restarted), t0, restarted?.summary ?? ''),
    firstStep(resumption, relaunched, t0),
    step('the ladder saw training progress: running', runningAt, t0, `nodes ${record.nodes.join(', ')}; ${victim}: ${kept.state} "${kept.reason}"`),
    step(`${other ?? '?'} (drained by "${SECOND_ADMIN_REASON}"): failed reset, steadfast's reason appended`, appended, t0, second?.summary ?? ''),
  ];
  return report(lab, 'foreign-drain', t0, resumption, [before, ...(relaunched === undefined ? [] : [relaunched])], timeline, problems);
}

/**
 * A node outside the job (a standby left over, else the evicted node), drained by an
 * administrator, gets a fatal Xid 48 on a GPU whose reset fails: steadfast drains the node —
 * appending its reason after the administrator's.
 */
async function failedOnForeignDrain(
  lab: ProtectedLab,
  evicted: string,
  problems: string[],
): Promise<{ other: string | undefined; t1: number | undefined; appended: number | undefined }> {
  const record = await lab.jobRecord();
  const other = (await lab.controller.backend.standbys()).find((node) => !record.nodes.includes(node) && node !== evicted);
  const gpus = other === undefined ? undefined : lab.gpus.get(other);
  if (other === undefined || gpus === undefined) {
    problems.push('no node outside the job left for the failed reset');
    return { other, t1: undefined, appended: undefined };
  }
  await lab.adminDrain(other, SECOND_ADMIN_REASON);
  // A GPU that will not come back: nvidia-smi's reset fails (the simulated driver's `stuck`).
  gpus.needsReset(GPU_INDEX, 48, XID_48, { stuck: true });
  const t1 = lab.injectXid(other, 48, XID_48, GPU);
  const done = await until(
    () => lab.sinfo(other),
    (state) => state.reason.includes('steadfast:'),
    timeLeft(recoveryDeadline(t1)),
  );
  const appended = done === undefined ? undefined : Date.now();
  const final = await lab.sinfo(other);
  if (!/^drain/.test(final.state) || !final.reason.startsWith(`${SECOND_ADMIN_REASON}; steadfast:`) || !/GPU reset (refused|failed)/.test(final.reason))
    problems.push(`${other} is ${final.state} "${final.reason}" in sinfo: expected "${SECOND_ADMIN_REASON}; steadfast: … GPU reset failed …"`);
  return { other, t1, appended };
}
