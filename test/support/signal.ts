import type { Signal } from '../../core/signal.js';

/** A signal from node-7's agent, with `overrides` on top: the classification tests' starting point. */
export function signal(overrides: Partial<Signal> & Pick<Signal, 'kind'>): Signal {
  return {
    id: 's-test',
    node: 'node-7',
    severity: 'critical',
    time: '2026-03-02T08:00:00.000Z',
    receivedAt: '2026-03-02T08:00:01.000Z',
    fingerprint: 'fp',
    source: 'agent',
    evidence: {},
    ...overrides,
  };
}
