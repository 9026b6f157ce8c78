import { setTimeout as sleep } from 'node:timers/promises';
import { Locks } from '../../core/locks.js';
import { OwnDrains } from '../own-drains.js';
import type { StepVerb } from '../../core/steps.js';
import { handToAnalysis, withoutAnalysis, type AnalysisVerb } from './analysis.js';
import { pager, remedyLog, standbysOf, type StepActuator, type StepBase, type StepProcessorDeps } from './context.js';
import { drain } from './drain.js';
import { evict, type EvictDeps } from './evict.js';
import { handOff, type HandOffDeps } from './hand-off.js';
import { hotSwap, type HotSwapDeps } from './hot-swap.js';
import { pageHuman } from './page-human.js';
import { quarantine } from './quarantine.js';
import { reboot } from './reboot.js';
import { recordOnly } from './record.js';
import { cannotReset, resetGpu } from './reset-gpu.js';
import { restart, type RestartDeps } from './restart.js';
import { stop } from './stop.js';
import { setCodeVersion } from './update.js';
import { awaitValidationAfterReboot } from '../validation-upkeep.js';

/** A transition's mode, decided by the step processor: dry-run (record, launch nothing, take no standby) or not. */
export interface ActuatorMode {
  readonly dryRun: boolean;
}

/** What the steps share once built: recording, the gates, the node claims, paging and the remediation history. */
export function stepBase(deps: StepProcessorDeps): StepBase {
  const recording = { audit: deps.audit, backend: deps.backend, onFinished: deps.onFinished ?? (() => undefined), profile: deps.profile };
  return {
    ...recording,
    gates: deps.gates,
    locks: new Locks(deps.redis, deps.keys),
    ownDrains: new OwnDrains(deps.redis, deps.keys),
    pager: pager(deps.onPage, { ...recording, gates: deps.gates }),
    remedyLog: remedyLog(deps.history, deps.onRemediation),
  };
}

/**
 * The actuator of every verb of core/steps.ts, in one list, each built with what it uses: the
 * step processor looks a step's verb up here. A verb without an actuator does not compile. What
 * the controller was not given is decided here, once: no GPU resetter makes reset_gpu an eviction
 * (in a job) or a failure; no worlds make hot_swap fall back to stop and relaunch; no analysis
 * worker makes diagnostics and replays find nothing; no progress watch makes a launcher's
 * acceptance the verdict on a restart; no webhook leaves a hand-off to the alert.
 */
export function buildStepActuators(deps: StepProcessorDeps, mode: ActuatorMode): Readonly<Record<StepVerb, StepActuator>> {
  const base = stepBase(deps);
  const { dryRun } = mode;
  const { redis, keys, jobs, feedback, logger, remedies } = deps;
  const evicting: EvictDeps = {
    ...base,
    redis,
    keys,
    jobs,
    feedback,
    logger,
    quarantine: deps.quarantine,
    maxJobEvictionPercent: deps.maxJobEvictionPercent ?? 100,
    standbys: standbysOf(deps.pool, deps.backend),
    dryRun,
  };
  const world = deps.world;
  const swapping: HotSwapDeps = { ...evicting, swaps: dryRun ? { kind: 'dry-run' } : world ? { kind: 'world', world } : { kind: 'none' } };
  const notifier = deps.handOff;
  const handingOff: HandOffDeps = {
    ...base,
    remedies,
    awaitValidation: deps.validator ? (node, decision) => awaitValidationAfterReboot(redis, keys, node, decision, Date.now()) : undefined,
    tellHandOff: notifier
      ? async (notice) => {
          const result = await notifier.notify({ ...notice, history: await base.remedyLog.read(notice.node, 20) });
          return result.delivered ? result.detail : `webhook failed (${result.detail}); the steadfast_node_handed_off alert still tells people`;
        }
      : async () => 'no webhook configured; the steadfast_node_handed_off alert tells people',
  };
  const progress = deps.progress;
  const restarting: RestartDeps = {
    ...base,
    jobs,
    launchers: deps.launchers,
    relaunched: dryRun || !world ? async () => undefined : async (job) => void (await world.relaunched(job)),
    dryRun,
    feedback,
    judgeLaunch: progress
      ? (job, ref, since) => progress.watch(job, ref, since)
      : async (job, ref) => void (await feedback({ job, event: { type: 'restart_succeeded', time: Date.now() }, eventId: `${ref}:restart_succeeded` })),
  };
  const resetter = deps.resetter;
  const resetting = resetter ? { ...evicting, resetter, remedies, pause: deps.pause ?? ((ms: number) => sleep(ms)), validator: deps.validator } : undefined;
  const analyze = deps.analyze;
  const analysis = (verb: AnalysisVerb): StepActuator => (analyze ? handToAnalysis(verb, { ...base, analyze }) : withoutAnalysis(verb, { ...base, feedback }));
  const versions = (at: Parameters<StepActuator>[0]) => setCodeVersion({ ...base, jobs }, at);
  const restarts = (at: Parameters<StepActuator>[0]) => restart(restarting, at);
  const recorded = (at: Parameters<StepActuator>[0]) => recordOnly(base, at);
  return {
    stop: (at) => stop(restarting, at),
    evict: (at) => evict(evicting, at),
    hot_swap: (at) => hotSwap(swapping, at),
    drain: (at) => drain(base, at),
    reset_gpu: resetting ? (at) => resetGpu(resetting, at) : (at) => cannotReset(evicting, at, 'no GPU reset configured on this controller'),
    reboot: (at) => reboot(handingOff, at),
    hand_off: (at) => handOff(handingOff, at),
    restart: restarts,
    reattempt: restarts,
    rollback: versions,
    apply_update: versions,
    run_diagnostics: analysis('run_diagnostics'),
    run_replay: analysis('run_replay'),
    analyze_stacks: analysis('analyze_stacks'),
    quarantine: (at) => quarantine({ ...base, redis, keys, dryRun }, at),
    page_human: (at) => pageHuman(base, at),
    notify: recorded,
    tolerate: recorded,
  };
}
