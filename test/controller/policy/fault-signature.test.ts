import { describe, expect, it } from 'vitest';
import type { Signal } from '../../../core/signal.js';
import { signal } from '../../support/signal.js';
import { failureKind } from '../../../controller/policy/fault-signature.js';

const worker = (message: string, extra: Signal['evidence'] = {}): Signal => signal({ kind: 'worker_failed', evidence: { message, ...extra } });

describe('failureKind: what kind of failure, without where', () => {
  it('names the Xid, a lost GPU, and an alert by its name (or its Xid label)', () => {
    expect(failureKind(signal({ kind: 'xid', evidence: { xid: 79, message: 'GPU has fallen off the bus.' } }))).toBe('xid:79');
    expect(failureKind(signal({ kind: 'gpu_lost', gpu: '0000:3b:00' }))).toBe('gpu-lost');
    expect(failureKind(signal({ kind: 'alert', evidence: { alertname: 'SteadfastTrainingWorkerFailed' } }))).toBe('alert:SteadfastTrainingWorkerFailed');
    expect(failureKind(signal({ kind: 'alert', evidence: { alertname: 'SteadfastXidApplicationRepeated', xid: 13 } }))).toBe('xid:13');
  });

  it('names the NCCL error kind of a timeout, or the timeout itself', () => {
    expect(
      failureKind(
        signal({
          kind: 'nccl_timeout',
          evidence: { message: '[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE)' },
        }),
      ),
    ).toBe('nccl:timeout');
    expect(
      failureKind(
        signal({
          kind: 'nccl_timeout',
          evidence: {
            message: 'NCCL error in: ProcessGroupNCCL.cpp:1275, remote process exited or there was a network error, NCCL version 2.18.1 ncclRemoteError',
          },
        }),
      ),
    ).toBe('nccl:ncclRemoteError');
  });

  it('names the exception that ended a worker, with the CUDA or NCCL error under a RuntimeError', () => {
    const illegal =
      'Traceback (most recent call last):\n  File "train.py", line 88\nRuntimeError: CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported';
    expect(failureKind(worker(illegal))).toBe('exception:RuntimeError/cuda:an illegal memory access was encountered');
    expect(
      failureKind(worker('torch.distributed.DistBackendError: NCCL error in: ../ProcessGroupNCCL.cpp:1970, unhandled system error, ncclSystemError')),
    ).toBe('exception:DistBackendError/nccl:ncclSystemError');
    expect(failureKind(worker('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'))).toBe('exception:OutOfMemoryError');
    // The same failure on two nodes, at two addresses, is one kind.
    expect(failureKind(worker('RuntimeError: CUDA error: misaligned address at 0x7f3a10'))).toBe('exception:RuntimeError/cuda:misaligned address at #');
    expect(failureKind({ ...worker('RuntimeError: CUDA error: misaligned address at 0x55e0'), node: 'node-9' })).toBe(
      'exception:RuntimeError/cuda:misaligned address at #',
    );
  });

  it('falls back to the exit code, then to a plain worker failure', () => {
    expect(failureKind(worker('worker exited', { exitCode: 137 }))).toBe('exit:137');
    expect(failureKind(worker('torchrun: exit code: -11'))).toBe('exit:-11');
    expect(failureKind(worker(''))).toBe('worker-failed');
  });

  it('names a multi-signal suspect as such', () => {
    expect(failureKind(signal({ kind: 'suspect_node', evidence: { score: 4.2 } }))).toBe('suspect-node');
  });
});
