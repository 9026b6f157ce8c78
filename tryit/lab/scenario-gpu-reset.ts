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
  waitForNewRun,
  waitForRunning,
  type ScenarioReport,
} from './scenario-support.js';

/** The lab the scenario needs: GPU resets on, each agent on a simulated nvidia-smi. */
export const GPU_RESET_LAB: ProtectedLabOptions = { gpuReset: true };

/** The GPU the injected Xid names; the simulated nvidia-smi lists it as GPU 2. */
const GPU = '0000:3a:00';
const GPU_INDEX = 2;

/**
 * A fatal Xid whose cure is a GPU reset (Xid 48, an uncorrectable ECC error) on one node of the
 * training job: the ladder stops the job, the reset_gpu step asks that node's agent to reset
 * GPU 0000:3a:00 (its gpu-reset endpoint, on the simulated nvidia-smi), and the job relaunches
 * with sbatch on the same nodes — no drain, no standby — resuming from the newest checkpoint.
 */
export async function runGpuReset(lab: ProtectedLab): Promise<ScenarioReport> {
  const problems: string[] = [];
  const job = lab.job;
  const { before, known, startRecord, victim, standbys } = await beforeNodeFault(lab);
  const gpus = lab.gpus.get(victim);
  if (gpus === undefined) throw new Error(`the lab has no simulated GPUs for ${victim}: start it with GPU_RESET_LAB`);
  gpus.needsReset(GPU_INDEX, 48, 'An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.');
  const t0 = lab.injectXid(victim, 48, 'An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.', GPU);
  const deadline = recoveryDeadline(t0);

  const relaunched = await waitForNewRun(lab, known, deadline);
  if (relaunched === undefined) problems.push(`no run trained after the Xid within ${RECOVERY_TIMEOUT_MS / 1000} s of the fault`);
  const runningAt = await waitForRunning(lab, (record) => record.nodes.join(',') === startRecord.nodes.join(','), deadline);
  if (runningAt === undefined) problems.push(`the ladder did not see training progress again on ${startRecord.nodes.join(', ')}`);

  const entries = entriesSince(await lab.audit(), t0, job);
  const signal = entries.find((entry) => entry.type === 'signal' && entry.node === victim && /xid/i.test(entry.summary));
  const decision = entries.find((entry) => entry.type === 'decision' && entry.summary.startsWith(`${job}: reset_gpu`));
  const reset = entries.find(
    (entry) => entry.type === 'action' && entry.summary.startsWith(`${job}: reset_gpu ${victim}: done`) && /reset through its agent/.test(entry.summary),
  );
  const restarted = entries.find((entry) => entry.type === 'action' && entry.summary.startsWith(`${job}: restart: done`));
  const evicted = entries.find((entry) => entry.type === 'action' && entry.summary.startsWith(`${job}: evict`));
  const sinfo = await lab.sinfo(victim);
  const record = await lab.jobRecord();

  if (!signal) problems.push(`no Xid signal from ${victim} in the audit`);
  if (!decision) problems.push('no reset_gpu decision');
  if (!reset) {
    const other = entries.filter((entry) => entry.type === 'action' && entry.summary.startsWith(`${job}: reset_gpu`)).map((entry) => entry.summary);
    problems.push(`no GPU reset done through ${victim}'s agent in the audit${other.length > 0 ? `; the reset step: ${other.join(' | ')}` : ''}`);
  }
  if (!gpus.resets().includes(GPU_INDEX))
    problems.push(`the simulated nvidia-smi of ${victim} saw no reset of GPU ${GPU_INDEX} (resets: ${gpus.resets().join(', ') || 'none'})`);
  if (evicted) problems.push(`the node was evicted: ${evicted.summary}`);
  if (/^drain/.test(sinfo.state)) problems.push(`${victim} is ${sinfo.state} "${sinfo.reason}" in sinfo: a reset in place drains nothing`);
  if (record.nodes.join(',') !== startRecord.nodes.join(',')) problems.push(`the job moved from ${startRecord.nodes.join(', ')} to ${record.nodes.join(', ')}`);
  if ((await lab.controller.backend.standbys()).join(',') !== standbys.join(','))
    problems.push(`a standby was used: ${standbys.join(', ')} before, ${(await lab.controller.backend.standbys()).join(', ')} after`);
  const resumption = relaunched === undefined ? undefined : judgeResumption(lab, [before], relaunched);
  const timeline = [
    step(`fatal Xid 48 appended to ${victim}'s kernel log`, t0, t0, `NVRM: Xid (PCI:${GPU}): 48, An uncorrectable double bit error (DBE)`),
    step('detected: the agent on the node posted it, the controller stored the signal', receivedAt(signal), t0, signal?.summary ?? ''),
    step('decided: stop, reset the GPU in place, restart', at(decision), t0, decision?.summary ?? ''),
    step(`GPU ${GPU} reset through ${victim}'s agent`, at(reset), t0, reset?.summary ?? ''),
    step(`relaunched with sbatch on the same nodes: run ${relaunched ?? '?'}`, at(restarted), t0, restarted?.summary ?? ''),
    firstStep(resumption, relaunched, t0),
    step('the ladder saw training progress: running', runningAt, t0, `nodes ${record.nodes.join(', ')}`),
  ];
  return report(lab, 'gpu-reset', t0, resumption, [before, ...(relaunched === undefined ? [] : [relaunched])], timeline, problems);
}
