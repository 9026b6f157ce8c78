import { DoNotRetryError } from '../../core/errors.js';
import { evictionShareSize, type JobSpec } from '../../core/job.js';
import { drainNode } from '../drain-node.js';
import { recordStep, refuseStep, stepJob, stepRef, type Halt, type StepAt, type StepWorld } from './context.js';
import { noteExclusion, type EvictDeps } from './evict.js';

/** Where a swap's epoch opens: the controller's worlds, nowhere under dry-run (described only), or none kept. */
export type Swaps = { readonly kind: 'world'; readonly world: StepWorld } | { readonly kind: 'dry-run' } | { readonly kind: 'none' };

/** What a hot swap works with: what an eviction does, and the worlds. */
export interface HotSwapDeps extends EvictDeps {
  readonly swaps: Swaps;
}

/**
 * The hot_swap step (DeadPool §V-C, §VI; ByteRobust §6.3): the job keeps running while spares
 * take the failed nodes' shards. It passes the gates an eviction passes (pause and the job's
 * recovery policy in the step processor; holds, the job's share and the cluster budget here),
 * then, in this order: opens the recovery epoch (the failed nodes' shards move to the spares,
 * the world `swapping`, its deadline the swap's bound), drains the failed nodes as evict does,
 * and puts each spare in its failed node's place in the job record; a free warm standby then
 * becomes a spare in place of each used one (it joins the allocation at the job's next launch).
 * Each part recognises itself done on a redelivery: the epoch is opened once per step, a drained
 * node is not drained again, a spare is put in place once, a used spare is replaced once.
 *
 * A step without nodes opens an epoch with the same shards (a communication fault). A swap that
 * cannot start (the spare is gone, out of service, no world) tells the ladder `hot_swap_failed`,
 * which falls back to stop, evict and relaunch. Dry-run opens no epoch and changes no record:
 * it describes the swap, and the ladder hears it done.
 */
export async function hotSwap(deps: HotSwapDeps, at: StepAt): Promise<Halt> {
  const job = stepJob(at);
  const ref = stepRef(at);
  const failed = at.step.nodes ?? [];
  const spares = at.step.spares ?? [];
  const { spec } = await deps.jobs.get(job);
  // Already put in place by an earlier delivery of this step.
  const swapped = new Set(failed.filter((node, index) => !spec.nodes.includes(node) && spec.nodes.includes(spares[index] ?? '')));
  const problem = await cannotStart(deps, spec, failed, spares, swapped);
  if (problem !== undefined)
    return fallBack(
      deps,
      at,
      problem,
      failed.filter((node) => !swapped.has(node)),
    );
  if (failed.length > 0) {
    const share = await deps.gates.admitJobShare(job, ref, failed, evictionShareSize(spec), deps.maxJobEvictionPercent);
    const admitted = share.ok ? await deps.gates.admit(ref) : share;
    if (share.ok && !admitted.ok) await deps.gates.releaseJobShare(job, ref, failed);
    if (!admitted.ok) return refuseStep(deps, at, admitted, { what: 'hot swap', node: failed[0] });
  }
  const replaced = Object.fromEntries(failed.map((node, index) => [node, spares[index] as string]));
  const pairs = failed.length > 0 ? failed.map((node) => `${replaced[node] ?? ''} in place of ${node}`).join(', ') : 'the same shards';
  if (deps.swaps.kind !== 'world') {
    for (const node of failed) await drain(deps, at, node);
    await recordStep(deps, at, 'done', `dry-run: would open a recovery epoch with ${pairs}; no epoch opened, the job record unchanged`);
    await deps.feedback({
      job,
      event: { type: 'hot_swap_done', time: Date.now(), epoch: -1, summary: `dry-run, ${pairs}: nothing changed` },
      eventId: `${ref}:dry-run-done`,
    });
    return undefined;
  }
  const epoch = await deps.swaps.world.open(spec, ref, replaced);
  await recordStep(deps, at, 'done', `${epoch.opened ? 'opened' : 'found open'} recovery epoch ${epoch.epoch} with ${pairs} (bound ${epoch.boundSeconds} s)`, {
    data: { epoch: epoch.epoch, replaced },
  });
  for (const node of failed) {
    if (swapped.has(node)) continue;
    await drain(deps, at, node);
    await noteExclusion(deps, at, node);
    await deps.jobs.useSpare(job, node, replaced[node] as string);
    await recordStep(deps, at, 'done', `spare ${replaced[node] ?? ''} in place of ${node} in epoch ${epoch.epoch}`, { node: replaced[node] });
  }
  for (const used of spares) await replaceUsedSpare(deps, at, used);
  return undefined;
}

/** Why the swap cannot start, or undefined. */
async function cannotStart(
  deps: HotSwapDeps,
  spec: JobSpec,
  failed: readonly string[],
  spares: readonly string[],
  swapped: ReadonlySet<string>,
): Promise<string | undefined> {
  if (spec.hotSwap === undefined) return `job ${spec.name} has no hot swap`;
  if (deps.swaps.kind === 'none') return 'this controller keeps no world for hot swaps';
  if (spares.length !== failed.length) return `the step names ${failed.length} failed nodes but ${spares.length} spares`;
  for (const [index, node] of failed.entries()) {
    if (swapped.has(node)) continue;
    const spare = spares[index] as string;
    if (!spec.nodes.includes(node)) return `${node} is no longer a node of job ${spec.name}`;
    if (!spec.hotSwap.spares.includes(spare)) return `${spare} is no longer an unused spare of job ${spec.name}`;
    const state = await deps.backend.nodeState(spare);
    if (!state.exists || state.drained) return `spare ${spare} is out of service (${state.raw})`;
  }
  return undefined;
}

/** The swap does not start: recorded, and the ladder falls back (evicting the nodes it did not take out). */
async function fallBack(deps: HotSwapDeps, at: StepAt, why: string, notSwapped: string[]): Promise<Halt> {
  const job = stepJob(at);
  await recordStep(deps, at, 'failed', `the hot swap cannot start: ${why}; falling back to stop and relaunch`);
  await deps.feedback({
    job,
    event: { type: 'hot_swap_failed', time: Date.now(), detail: `it could not start: ${why}`, evict: notSwapped },
    eventId: `${stepRef(at)}:cannot-start`,
  });
  return undefined;
}

/** Drains a failed node as evict does; a node the scheduler does not know is recorded and paged, the swap goes on. */
async function drain(deps: HotSwapDeps, at: StepAt, node: string): Promise<void> {
  try {
    const { already, state } = await drainNode(deps.backend, deps.gates, { node, holder: stepRef(at), reason: at.step.reason, auditId: at.transitionId });
    await recordStep(deps, at, 'done', already ? `already out of service (${state.raw})` : `drained through ${deps.backend.name}`, { node });
  } catch (error) {
    if (!(error instanceof DoNotRetryError)) throw error;
    await recordStep(deps, at, 'failed', error.message, { node });
    deps.pager.page(at.job, error.message);
  }
}

/** How long the marker of a used spare's replacement is kept: as long as a step's marker. */
const REPLENISHED_TTL_SECONDS = 7 * 24 * 3600;

/**
 * A free warm standby becomes a spare in place of the one the swap used, unless it is the last
 * one (an eviction, the fallback's included, needs it), once per used spare of the step (the marker is taken first: a crash between it and the take leaves the spare
 * unreplaced rather than take two standbys). In Slurm a running allocation cannot grow: the new
 * spare joins at the job's next launch.
 */
async function replaceUsedSpare(deps: HotSwapDeps, at: StepAt, used: string): Promise<void> {
  const job = stepJob(at);
  const marker = `${deps.keys.recoveryStep(at.transitionId, at.index)}:replenished:${used}`;
  if ((await deps.redis.set(marker, 'taking', 'EX', REPLENISHED_TTL_SECONDS, 'NX')) !== 'OK') return;
  const unusable = new Set(await deps.redis.smembers(deps.keys.quarantine));
  for (const node of (await deps.gates.holds()).keys()) unusable.add(node);
  // The last free standby stays in the pool: a swap that fails falls back to an eviction, which needs it.
  const free = await deps.standbys.free(unusable);
  const standby = free < 2 ? undefined : await deps.standbys.take(job, unusable);
  if (standby === undefined) {
    const why = free === 1 ? 'the last free warm standby stays for evictions' : 'no warm standby free';
    await recordStep(deps, at, 'done', `${why}: used spare ${used} is not replaced; the job has one spare fewer`, { node: used, part: 'replacement' });
    return;
  }
  await deps.jobs.addSpare(job, standby);
  await recordStep(
    deps,
    at,
    'done',
    `standby ${standby} becomes a spare of ${job} in place of used spare ${used}; it joins the allocation at the job's next launch`,
    { node: standby },
  );
}
