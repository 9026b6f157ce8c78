import { describe, expect, it } from 'vitest';
import { ZodError } from 'zod';
import { STEPS_JOB_VERSION, parseStepsJob } from '../../core/queues.js';

/** The steps queue's contract: a controller reads the transitions it queues, and refuses anything else. */
describe('the steps contract', () => {
  const now = '2026-11-28T10:00:00.000Z';

  it("reads a job's and a node's transitions as they are", () => {
    const job = {
      v: STEPS_JOB_VERSION,
      transitionId: 't-1',
      job: 'llama',
      steps: [{ verb: 'evict', job: 'llama', nodes: ['n01'], reason: 'fatal Xid 79', citation: '§4.1' }],
    };
    expect(parseStepsJob(job)).toEqual(job);
    const node = {
      v: STEPS_JOB_VERSION,
      transitionId: 'd-1',
      node: 'n02',
      steps: [{ verb: 'drain', nodes: ['n02'], reason: 'fatal Xid 79', citation: '§4.1' }],
      fault: { signalId: 's-1', fingerprint: 'xid/n02/0000:3a:00/79', time: now },
    };
    expect(parseStepsJob(node)).toEqual(node);
  });

  it('refuses an unversioned payload, or a transition naming both a job and a node, naming what is wrong', () => {
    expect(() => parseStepsJob({ transitionId: 't-x', steps: [] })).toThrow(ZodError);
    expect(() => parseStepsJob({ v: STEPS_JOB_VERSION, transitionId: 't-x', job: 'llama', node: 'n01', steps: [] })).toThrow(
      'a transition names either a job or a node',
    );
    expect(() => parseStepsJob({ v: 3, transitionId: 't-x', job: 'llama', steps: [] })).toThrow(ZodError);
    expect(() =>
      parseStepsJob({ v: STEPS_JOB_VERSION, transitionId: 't-x', job: 'llama', steps: [{ verb: 'format_disk', reason: 'x', citation: 'x' }] }),
    ).toThrow(/verb/);
  });
});
