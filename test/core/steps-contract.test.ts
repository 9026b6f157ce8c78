import { describe, expect, it } from 'vitest';
import { ZodError } from 'zod';
import { STEPS_JOB_VERSION, parseStepsJob } from '../../core/queues.js';

/**
 * The steps queue's contract across releases: a controller reads what this release queues and
 * what an earlier one left on its `actions` and `recovery` queues, under the same transition id.
 */
describe('the steps contract', () => {
  const now = '2026-11-28T10:00:00.000Z';

  it('reads this release\'s transitions as they are', () => {
    const job = { v: STEPS_JOB_VERSION, transitionId: 't-1', job: 'llama', steps: [{ verb: 'evict', job: 'llama', nodes: ['n01'], reason: 'fatal Xid 79', citation: '§4.1' }] };
    expect(parseStepsJob(job)).toEqual(job);
    const node = { v: STEPS_JOB_VERSION, transitionId: 'd-1', node: 'n02', steps: [{ verb: 'drain', nodes: ['n02'], reason: 'fatal Xid 79', citation: '§4.1' }], fault: { signalId: 's-1', fingerprint: 'xid/n02/0000:3a:00/79', time: now } };
    expect(parseStepsJob(node)).toEqual(node);
  });

  it('rewrites an earlier release\'s node decision into a one-step node transition under the decision id', () => {
    const decision = { id: 'd-old', verb: 'reset_gpu', node: 'n03', gpu: '0000:3a:00', idempotencyKey: 'reset-gpu-n03-d-old', reason: 'fatal Xid 48', signalId: 's-old', fingerprint: 'xid/n03/0000:3a:00/48', faultTime: now, time: now, origin: { role: 'agent', node: 'n03' } };
    expect(parseStepsJob({ decision })).toEqual({
      v: STEPS_JOB_VERSION,
      transitionId: 'd-old',
      node: 'n03',
      steps: [{ verb: 'reset_gpu', nodes: ['n03'], gpu: '0000:3a:00', reason: 'fatal Xid 48', citation: expect.any(String) }],
      origin: { role: 'agent', node: 'n03' },
      fault: { signalId: 's-old', fingerprint: 'xid/n03/0000:3a:00/48', time: now },
    });
  });

  it('reads an earlier release\'s ladder transition under its own id', () => {
    const transition = { transitionId: 't-old', job: 'llama', steps: [{ verb: 'restart', job: 'llama', reason: 'relaunch', citation: '§6.2' }] };
    expect(parseStepsJob(transition)).toEqual({ v: STEPS_JOB_VERSION, ...transition });
  });

  it('refuses a payload of neither release, or a transition naming both a job and a node, naming what is wrong', () => {
    expect(() => parseStepsJob({ transitionId: 't-x', steps: [] })).toThrow(ZodError);
    expect(() => parseStepsJob({ v: STEPS_JOB_VERSION, transitionId: 't-x', job: 'llama', node: 'n01', steps: [] })).toThrow('a transition names either a job or a node');
    expect(() => parseStepsJob({ v: 3, transitionId: 't-x', job: 'llama', steps: [] })).toThrow(ZodError);
    expect(() => parseStepsJob({ v: STEPS_JOB_VERSION, transitionId: 't-x', job: 'llama', steps: [{ verb: 'format_disk', reason: 'x', citation: 'x' }] })).toThrow(/verb/);
  });
});
