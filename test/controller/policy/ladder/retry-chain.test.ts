import { describe, expect, it } from 'vitest';
import { type LadderEvent } from '../../../../core/ladder.js';
import { DEFAULT_LADDER_CONFIG, type LadderConfig } from '../../../../controller/policy/ladder/index.js';
import { T0, SECOND, MINUTE, HOUR, DAY, NO_BACKOFF, fault, run, shape, jobOnV2, running } from './support.js';

// Retry chains and exclusion history (504-GPU report)

describe('ladder: retry chain and exclusions', () => {
  it('holds the second restart of an incident back 30 s and releases it on a tick', () => {
    const reattempting = run(running(), [fault('machine', T0, ['node-3']), { type: 'restart_failed', time: T0 + MINUTE }], DEFAULT_LADDER_CONFIG);
    // No good version: the failed restart after the eviction goes to diagnostics, which find nothing.
    const held = run(reattempting.state, [{ type: 'diagnostics_result', time: T0 + 2 * MINUTE, suspects: [] }], DEFAULT_LADDER_CONFIG);
    expect(shape(held.steps)).toEqual([{ verb: 'tolerate' }]);
    expect(held.state.scheduled?.notBefore).toBe(T0 + 2 * MINUTE + 30 * SECOND);
    expect(held.state.incident?.retry).toEqual({ attempts: 2, nextBackoffMs: 60 * SECOND });
    expect(run(held.state, [{ type: 'tick', time: T0 + 2 * MINUTE + 29 * SECOND }], DEFAULT_LADDER_CONFIG).steps).toEqual([]);
    const released = run(held.state, [{ type: 'tick', time: T0 + 2 * MINUTE + 30 * SECOND }], DEFAULT_LADDER_CONFIG);
    expect(shape(released.steps)).toEqual([{ verb: 'reattempt' }]);
    expect(released.state.scheduled).toBeNull();
  });

  it('doubles the backoff for each further restart up to the cap', () => {
    const config: LadderConfig = { ...DEFAULT_LADDER_CONFIG, retryLimit: 20, retryMaxBackoffMs: 2 * MINUTE };
    let state = run(running(), [fault('machine', T0, ['node-0'])], config).state;
    const waits: number[] = [];
    for (let i = 1; i <= 4; i += 1) {
      const at = T0 + i * HOUR;
      const next = run(state, [fault('machine', at, [`node-${i}`])], config);
      waits.push((next.state.scheduled?.notBefore ?? at) - at);
      state = run(next.state, [{ type: 'tick', time: at + 10 * MINUTE }], config).state;
    }
    expect(waits).toEqual([30 * SECOND, 60 * SECOND, 2 * MINUTE, 2 * MINUTE]);
  });

  it('only records a restart failure while the next restart is still held back', () => {
    const held = run(running(), [fault('machine', T0, ['node-3']), fault('machine', T0 + SECOND, ['node-4'])], DEFAULT_LADDER_CONFIG).state;
    expect(held.scheduled).not.toBeNull();
    const { state, steps } = run(held, [{ type: 'restart_failed', time: T0 + 2 * SECOND }], DEFAULT_LADDER_CONFIG);
    expect(shape(steps)).toEqual([{ verb: 'tolerate' }]);
    expect(state.phase).toBe('stopped');
  });

  it('keeps a held rollback when an eviction replaces the held restart', () => {
    const config: LadderConfig = { ...DEFAULT_LADDER_CONFIG };
    const rolling = run(jobOnV2(), [fault('machine', T0 + 5 * MINUTE, ['node-3']), { type: 'restart_failed', time: T0 + 6 * MINUTE }], config).state;
    expect(rolling.scheduled?.steps.map((step) => step.verb)).toEqual(['rollback', 'restart']);
    const evicted = run(rolling, [fault('machine', T0 + 6 * MINUTE + SECOND, ['node-4'])], config);
    expect(shape(evicted.steps)).toEqual([{ verb: 'evict', nodes: ['node-4'] }, { verb: 'tolerate' }]);
    const released = run(evicted.state, [{ type: 'tick', time: T0 + HOUR }], config);
    expect(shape(released.steps)).toEqual([{ verb: 'rollback', version: 'v1' }, { verb: 'restart' }]);
    expect(released.state.runningVersion).toBe('v1');
  });

  it('pages a human instead of restarting once the incident has used its retry chain', () => {
    const config: LadderConfig = { ...NO_BACKOFF, retryLimit: 2 };
    const { state, steps } = run(
      running(),
      [fault('machine', T0, ['node-1']), fault('machine', T0 + SECOND, ['node-2']), fault('machine', T0 + 2 * SECOND, ['node-3'])],
      config,
    );
    expect(shape(steps)).toEqual([{ verb: 'evict', nodes: ['node-3'] }, { verb: 'page_human' }]);
    expect(state.phase).toBe('waiting_for_human');
    expect(state.scheduled).toBeNull();
  });

  it('starts a fresh retry chain with each incident', () => {
    const config: LadderConfig = { ...NO_BACKOFF, retryLimit: 1 };
    const { steps } = run(
      running(),
      [fault('machine', T0, ['node-1']), { type: 'restart_succeeded', time: T0 + MINUTE }, fault('machine', T0 + HOUR, ['node-2'])],
      config,
    );
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'evict', nodes: ['node-2'] }, { verb: 'restart' }]);
  });

  it('quarantines a node on its third eviction within 7 days and never evicts it again', () => {
    const events: LadderEvent[] = [];
    for (let i = 0; i < 3; i += 1) events.push(fault('machine', T0 + i * DAY, ['node-bad']), { type: 'restart_succeeded', time: T0 + i * DAY + MINUTE });
    const third = run(running(), events.slice(0, 4));
    expect(third.state.quarantined).toEqual([]);
    const { state, steps } = run(third.state, [events[4] as LadderEvent]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'evict', nodes: ['node-bad'] }, { verb: 'quarantine', nodes: ['node-bad'] }, { verb: 'restart' }]);
    expect(state.quarantined).toEqual(['node-bad']);
    const later = run(run(state, [{ type: 'restart_succeeded', time: T0 + 3 * DAY }]).state, [fault('machine', T0 + 4 * DAY, ['node-bad'])]);
    expect(shape(later.steps)).toEqual([{ verb: 'tolerate', nodes: ['node-bad'] }]);
    expect(later.state.phase).toBe('running');
  });

  it('forgets evictions older than 7 days when counting towards quarantine', () => {
    const events: LadderEvent[] = [];
    for (let i = 0; i < 3; i += 1)
      events.push(fault('machine', T0 + i * 4 * DAY, ['node-old']), { type: 'restart_succeeded', time: T0 + i * 4 * DAY + MINUTE });
    const { state } = run(running(), events);
    expect(state.quarantined).toEqual([]);
    expect(state.exclusions).toEqual([{ node: 'node-old', times: [T0 + 4 * DAY, T0 + 8 * DAY] }]);
  });
});
