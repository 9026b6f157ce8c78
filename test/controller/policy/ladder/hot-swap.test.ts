import { describe, expect, it } from 'vitest';
import { ladderStateSchema, type LadderState } from '../../../../controller/policy/ladder/index.js';
import type { FaultClass, LadderEvent } from '../../../../core/ladder.js';
import { T0, SECOND, JOB, fault, run, running, shape } from './support.js';

// The hot-swap rung (DeadPool §V-C, §VI; ByteRobust §6.3): a spare takes a failed node's place
// while the job keeps running, and a swap that cannot finish falls back to stop and relaunch.

/** A fault on a hot-swap job, with its unused spares as the controller adds them. */
function onHotSwapJob(faultClass: FaultClass, at: number, nodes: string[], spares: string[] = ['s-1', 's-2'], detail = 'test fault'): LadderEvent {
  return { ...fault(faultClass, at, nodes, detail), hotSwap: { spares } } as LadderEvent;
}

function swapping(): LadderState {
  return run(running(), [onHotSwapJob('machine', T0, ['node-1'])]).state;
}

describe('ladder: hot swap', () => {
  it('swaps a spare in for a machine fault on a hot-swap job, without stopping it', () => {
    const { state, steps } = run(running(), [onHotSwapJob('machine', T0, ['node-1'], ['s-1', 's-2'], 'fatal Xid 79')]);
    expect(shape(steps)).toEqual([{ verb: 'hot_swap', nodes: ['node-1'] }]);
    expect(steps[0]?.spares).toEqual(['s-1']);
    expect(steps[0]?.job).toBe(JOB);
    expect(steps[0]?.citation).toContain('DeadPool §V-C, §VI');
    expect(steps[0]?.citation).toContain('ByteRobust §6.3');
    expect(state.phase).toBe('swapping');
    expect(state.swap).toEqual({ openedAt: T0, nodes: ['node-1'], spares: ['s-1'] });
    expect(state.incident).toMatchObject({ trigger: 'machine', rung: 'hot_swap', evictedNodes: ['node-1'] });
    // The failed node counts towards its exclusion history, as an eviction does.
    expect(state.exclusions).toEqual([{ node: 'node-1', times: [T0] }]);
  });

  it('swaps one spare per node for an over-eviction verdict naming several nodes', () => {
    const { steps } = run(running(), [onHotSwapJob('machine', T0, ['node-1', 'node-2'])]);
    expect(shape(steps)).toEqual([{ verb: 'hot_swap', nodes: ['node-1', 'node-2'] }]);
    expect(steps[0]?.spares).toEqual(['s-1', 's-2']);
  });

  it("takes today's road (stop, evict, restart) with fewer unused spares than failed nodes, and for a job without hot swap", () => {
    expect(shape(run(running(), [onHotSwapJob('machine', T0, ['node-1', 'node-2'], ['s-1'])]).steps).map((step) => step.verb)).toEqual([
      'stop',
      'evict',
      'restart',
    ]);
    expect(shape(run(running(), [onHotSwapJob('machine', T0, ['node-1'], [])]).steps).map((step) => step.verb)).toEqual(['stop', 'evict', 'restart']);
    expect(shape(run(running(), [fault('machine', T0, ['node-1'])]).steps).map((step) => step.verb)).toEqual(['stop', 'evict', 'restart']);
  });

  it('prefers the swap to a GPU reset, which would stop the job', () => {
    const event = { ...onHotSwapJob('machine', T0, ['node-1']), resetGpu: '0000:3a:00' } as LadderEvent;
    expect(shape(run(running(), [event]).steps).map((step) => step.verb)).toEqual(['hot_swap']);
  });

  it("keeps today's ladder for software crashes and bad code on a hot-swap job", () => {
    expect(shape(run(running(), [onHotSwapJob('crash', T0, ['node-1'])]).steps).map((step) => step.verb)).toEqual(['stop', 'run_diagnostics']);
    expect(shape(run(running(), [onHotSwapJob('user_code', T0, ['node-1'])]).steps).map((step) => step.verb)).toEqual(['stop', 'page_human']);
  });

  it('tolerates, while swapping, a crash or worker failure naming the swapped node or no node', () => {
    for (const [faultClass, nodes] of [
      ['crash', ['node-1']],
      ['crash', []],
      ['machine', ['node-1']],
      ['network', ['node-2']],
    ] as const) {
      const { state, steps } = run(swapping(), [onHotSwapJob(faultClass, T0 + SECOND, [...nodes], ['s-2'], 'srun: error: node-1: task 0: Killed')]);
      expect(shape(steps)).toEqual([{ verb: 'tolerate', ...(nodes.length > 0 ? { nodes: [...nodes] } : {}) }]);
      expect(steps[0]?.reason).toContain('part of the hot swap of node-1');
      expect(state.phase).toBe('swapping');
    }
  });

  it('falls back to stop, evict of the spare and relaunch when a fault names a spare of the swap', () => {
    const { state, steps } = run(swapping(), [onHotSwapJob('crash', T0 + SECOND, ['s-1'], ['s-2'], 'srun: error: s-1: task 0: Killed')]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'evict', nodes: ['s-1'] }, { verb: 'restart' }]);
    expect(steps[0]?.reason).toMatch(
      /^hot swap of node-1 failed \(crash fault: srun: error: s-1: task 0: Killed: on s-1, a spare of the swap\); falling back to stop and relaunch$/,
    );
    expect(state.phase).toBe('stopped');
    expect(state.swap).toBeNull();
  });

  it('falls back to stop and relaunch when the swap fails, evicting the nodes it did not take out', () => {
    const failed = run(swapping(), [{ type: 'hot_swap_failed', time: T0 + 70 * SECOND, detail: 'not done within its bound of 60 s' }]);
    expect(shape(failed.steps)).toEqual([{ verb: 'stop' }, { verb: 'restart' }]);
    expect(failed.steps[0]?.reason).toBe('hot swap of node-1 failed (not done within its bound of 60 s); falling back to stop and relaunch');
    expect(failed.state.phase).toBe('stopped');
    const unstarted = run(swapping(), [{ type: 'hot_swap_failed', time: T0 + SECOND, detail: 'it could not start: s-1 is out of service', evict: ['node-1'] }]);
    expect(shape(unstarted.steps)).toEqual([{ verb: 'stop' }, { verb: 'evict', nodes: ['node-1'] }, { verb: 'restart' }]);
    // The relaunch's outcome then moves the ladder as after any eviction.
    expect(run(failed.state, [{ type: 'restart_succeeded', time: T0 + 90 * SECOND }]).state).toMatchObject({ phase: 'running', incident: null, swap: null });
  });

  it('returns to running and closes the incident when the swap is done, with the figures on record', () => {
    const { state, steps } = run(swapping(), [
      { type: 'hot_swap_done', time: T0 + 2 * SECOND, epoch: 3, summary: 'epoch 3, s-1 in place of node-1, first step 41 in 1.2 s' },
    ]);
    expect(shape(steps)).toEqual([{ verb: 'notify' }]);
    expect(steps[0]?.reason).toBe('hot swap done: epoch 3, s-1 in place of node-1, first step 41 in 1.2 s');
    expect(state).toMatchObject({ phase: 'running', incident: null, swap: null });
    // A later report of the same swap changes nothing.
    expect(shape(run(state, [{ type: 'hot_swap_done', time: T0 + 3 * SECOND, epoch: 3, summary: 'again' }]).steps)).toEqual([{ verb: 'tolerate' }]);
  });

  it('opens an epoch with no node change for the tolerated network flap on a hot-swap job', () => {
    const { state, steps } = run(running(), [onHotSwapJob('network', T0, ['node-2'])]);
    expect(shape(steps)).toEqual([{ verb: 'hot_swap' }]);
    expect(steps[0]?.spares).toBeUndefined();
    expect(state.phase).toBe('swapping');
    expect(state.swap).toEqual({ openedAt: T0, nodes: [], spares: [] });
    expect(run(state, [{ type: 'hot_swap_done', time: T0 + SECOND, epoch: 1, summary: 'epoch 1, same shards, first step 9 in 0.4 s' }]).state.phase).toBe(
      'running',
    );
    // A job without hot swap only tolerates it, as before.
    expect(shape(run(running(), [fault('network', T0, ['node-2'])]).steps)).toEqual([{ verb: 'tolerate', nodes: ['node-2'] }]);
  });

  it('is put back as it was when the processor refuses the swap (pause, recovery off, the budget)', () => {
    const refused = run(swapping(), [{ type: 'recovery_refused', time: T0 + SECOND, transitionId: 't-1', detail: 'actions are paused' }]);
    expect(refused.state).toMatchObject({ phase: 'running', incident: null, swap: null });
  });

  it('reads a state stored before hot swaps, without its swap or rung count', () => {
    const stored = JSON.parse(JSON.stringify(running())) as Record<string, unknown>;
    delete stored.swap;
    const parsed = ladderStateSchema.parse({
      ...stored,
      incident: {
        openedAt: T0,
        trigger: 'machine',
        signalIds: [],
        rung: 'evict',
        tried: { evict: 1, diagnose: 0, reattempt: 0, rollback: 0, replay: 0, update: 0, human: 0 },
        evictedNodes: [],
        rolledBackFrom: null,
        retry: { attempts: 1, nextBackoffMs: 0 },
      },
    });
    expect(parsed.swap).toBeNull();
    expect(parsed.incident?.tried.hot_swap).toBe(0);
  });
});
