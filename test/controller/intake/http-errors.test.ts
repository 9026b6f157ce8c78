import { describe, expect, it } from 'vitest';
import { InputError, RetryLaterError, StoreUnavailableError } from '../../../core/errors.js';
import { JobExistsError, JobNotFoundError, NodesBusyError } from '../../../controller/job-store.js';
import { errorStatus, failureAnswer } from '../../../controller/intake/http-errors.js';

describe('the one mapping from typed errors to HTTP', () => {
  it('gives each typed error its status, and none to an error of ours', () => {
    expect(errorStatus(new JobNotFoundError('j'))).toEqual({ status: 404, reason: 'not_found' });
    expect(errorStatus(new JobExistsError('j'))).toEqual({ status: 409, reason: 'conflict' });
    expect(errorStatus(new NodesBusyError('j', new Map([['n0', 'other']])))).toEqual({ status: 409, reason: 'conflict' });
    expect(errorStatus(new InputError('bad'))).toEqual({ status: 400, reason: 'invalid' });
    expect(errorStatus(new StoreUnavailableError('down'))).toEqual({ status: 503, reason: 'store_unavailable' });
    expect(errorStatus(new RetryLaterError('later'))).toEqual({ status: 503, reason: 'store_unavailable' });
    expect(errorStatus(new Error('bug'))).toBeUndefined();
    expect(errorStatus('thrown text')).toBeUndefined();
  });

  it('answers a failed request: a refusal with its message, a passing failure or Redis down as 503, anything else as 500', async () => {
    const up = async (): Promise<boolean> => true;
    const down = async (): Promise<boolean> => false;
    expect(await failureAnswer(new InputError('bad field'), down)).toEqual({ status: 400, reason: 'invalid', message: 'bad field' });
    const unavailable = { status: 503, reason: 'store_unavailable', message: 'the store (Redis) is unavailable; retry later' };
    expect(await failureAnswer(new RetryLaterError('backend late'), up)).toEqual(unavailable);
    expect(await failureAnswer(new Error('bug'), down)).toEqual(unavailable);
    expect(await failureAnswer(new Error('bug'), up)).toEqual({ status: 500, reason: 'internal', message: 'internal error; see the controller log' });
  });
});
