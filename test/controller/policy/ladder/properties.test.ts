import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { FAULT_CLASSES, type LadderEvent } from '../../../../core/ladder.js';
import { advance, DEFAULT_LADDER_CONFIG, initialLadderState, ladderStateSchema, type LadderConfig } from '../../../../controller/policy/ladder/index.js';
import { T0, MINUTE, DAY, JOB, NO_BACKOFF } from './support.js';

// Properties

const NODES = ['node-1', 'node-2', 'node-3', 'node-4'];
const nodeList = fc.subarray(NODES);
const eventBody = fc.oneof(
  fc.record({
    type: fc.constant('fault' as const),
    signalId: fc.constantFrom('a', 'b', 'c', 'd', 'e', 'f', 'g', 'h').chain((prefix) => fc.nat(40).map((n) => `${prefix}${n}`)),
    faultClass: fc.constantFrom(...FAULT_CLASSES),
    nodes: nodeList,
    detail: fc.string({ maxLength: 20 }),
    signature: fc.option(fc.constantFrom('xid:79', 'nccl:timeout', 'exit:1'), { nil: undefined }),
  }),
  fc.record({ type: fc.constant('restart_succeeded' as const) }),
  fc.record({ type: fc.constant('restart_failed' as const) }),
  fc.record({ type: fc.constant('diagnostics_result' as const), suspects: nodeList }),
  fc.record({ type: fc.constant('replay_result' as const), culprits: nodeList }),
  fc.record({ type: fc.constant('code_update' as const), version: fc.constantFrom('v1', 'v2', 'v3', 'v4'), urgent: fc.boolean() }),
  fc.record({ type: fc.constant('tick' as const) }),
  fc.record({ type: fc.constant('standby_activated' as const), replaced: fc.constantFrom(...NODES), by: fc.constantFrom('spare-1', 'spare-2', ...NODES) }),
  fc.record({ type: fc.constant('recovery_refused' as const), transitionId: fc.constantFrom('t-1', 't-2'), detail: fc.string({ maxLength: 20 }) }),
);
// Mostly forward in time, sometimes far (windows expire), sometimes backwards (late delivery).
const delay = fc.oneof(fc.integer({ min: 0, max: 10 * MINUTE }), fc.integer({ min: 0, max: 3 * DAY }), fc.integer({ min: -5 * MINUTE, max: 0 }));
const timedEvents = fc.array(fc.tuple(delay, eventBody), { maxLength: 60 });
const configs = fc.constantFrom<LadderConfig>(DEFAULT_LADDER_CONFIG, NO_BACKOFF, { ...NO_BACKOFF, retryLimit: 2, quarantineAfterEvictions: 2 });

describe('ladder: properties', () => {
  it('never throws, never evicts an empty or quarantined node list, keeps its invariants, and stays JSON-serialisable', () => {
    fc.assert(
      fc.property(timedEvents, configs, fc.boolean(), (events, config, withVersion) => {
        let state = initialLadderState(JOB, withVersion ? { time: T0, version: 'v1' } : { time: T0 });
        let now = T0;
        for (const [wait, body] of events) {
          now += wait;
          const event = { ...body, time: now } as LadderEvent;
          const before = structuredClone(state);
          const { state: next, steps } = advance(state, event, config);
          expect(state).toEqual(before);
          for (const step of steps) {
            expect(step.job).toBe(JOB);
            expect(step.reason.length).toBeGreaterThan(0);
            expect(step.citation.length).toBeGreaterThan(0);
            if (step.verb === 'evict') {
              expect(step.nodes?.length ?? 0).toBeGreaterThan(0);
              for (const node of step.nodes ?? []) expect(before.quarantined).not.toContain(node);
            }
          }
          expect(next.phase === 'running').toBe(next.incident === null);
          expect(JSON.parse(JSON.stringify(next))).toStrictEqual(next);
          expect(ladderStateSchema.parse(next)).toEqual(next);
          state = next;
        }
      }),
      { numRuns: 400 },
    );
  });
});
