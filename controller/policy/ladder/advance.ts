import type { Signal } from '../../../core/signal.js';
import type { FaultEvent, LadderEvent } from '../../../core/ladder.js';
import type { FaultVerdict } from '../fault-class.js';
import { failureKind } from '../fault-signature.js';
import { DEFAULT_LADDER_CONFIG, type LadderConfig } from './config.js';
import { prune, unique, type Ctx } from './context.js';
import { failureSignature, onStandbyActivated, pruneReplacements } from './evidence.js';
import { onHotSwapDone, onHotSwapFailed } from './hot-swap.js';
import {
  onCodeUpdate,
  onDiagnosticsResult,
  onFault,
  onRecoveryRefused,
  onReplayResult,
  onRestartFailed,
  onRestartSucceeded,
  onStandbyMissing,
  onTick,
} from './transitions.js';
import type { LadderState, LadderTransition } from './state.js';

/** The ladder's two entry points: a signal becomes an event, an event moves the state. */

/** The ladder event for a classified signal. */
export function faultEventFromSignal(signal: Signal, verdict: FaultVerdict, resetGpu?: string): FaultEvent {
  return {
    type: 'fault',
    time: Date.parse(signal.time),
    signalId: signal.id,
    faultClass: verdict.faultClass,
    nodes: verdict.node === undefined ? [] : [verdict.node],
    detail: verdict.reason,
    signature: failureKind(signal),
    ...(resetGpu !== undefined && verdict.faultClass === 'machine' ? { resetGpu } : {}),
  };
}

/** One transition. Never mutates `state`; never throws on a well-typed event. */
export function advance(state: LadderState, event: LadderEvent, config: LadderConfig = DEFAULT_LADDER_CONFIG): LadderTransition {
  const facts = event.type === 'fault' ? { signature: failureSignature(event), ...(event.hotSwap !== undefined ? { hotSwap: event.hotSwap } : {}) } : {};
  const ctx: Ctx = { s: structuredClone(state), time: event.time, config, steps: [], ...facts };
  prune(ctx);
  pruneReplacements(ctx);
  switch (event.type) {
    case 'fault':
      onFault(ctx, event);
      break;
    case 'restart_succeeded':
      onRestartSucceeded(ctx);
      break;
    case 'restart_failed':
      onRestartFailed(ctx, event.detail ?? 'the relaunched job failed');
      break;
    case 'diagnostics_result':
      onDiagnosticsResult(ctx, unique(event.suspects), event.unrun);
      break;
    case 'replay_result':
      onReplayResult(ctx, unique(event.culprits), event.unrun);
      break;
    case 'code_update':
      onCodeUpdate(ctx, event.version, event.urgent);
      break;
    case 'tick':
      onTick(ctx);
      break;
    case 'standby_activated':
      onStandbyActivated(ctx, event.replaced, event.by);
      break;
    case 'standby_missing':
      onStandbyMissing(ctx, unique(event.nodes));
      break;
    case 'recovery_refused':
      onRecoveryRefused(ctx, event.detail);
      break;
    case 'hot_swap_done':
      onHotSwapDone(ctx, event.epoch, event.summary);
      break;
    case 'hot_swap_failed':
      onHotSwapFailed(ctx, event.detail, unique(event.evict ?? []));
      break;
  }
  return { state: ctx.s, steps: ctx.steps };
}
