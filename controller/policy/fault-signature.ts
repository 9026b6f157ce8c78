import type { Signal } from '../../core/signal.js';

/**
 * What kind of failure a signal reports, without where: the Xid, the exception type (with the
 * CUDA or NCCL error under a RuntimeError), the NCCL error kind, the alert's name. The ladder
 * pairs it with the fault class as the failure's signature and compares it with what the last
 * eviction acted on (controller/policy/ladder/evidence.ts): the same failure again within the window
 * means the eviction did not help (ByteRobust §4.2 step ⑦); another failure is a new incident.
 * A pure function of the signal.
 */

/** A Python exception type as a traceback's last line prints it (`torch.OutOfMemoryError: …`). */
const EXCEPTION = /(?:^|[\s.:;(])([A-Z][A-Za-z0-9_]*(?:Error|Exception|Interrupt))(?::|\s*$)/gm;
/** `CUDA error: an illegal memory access was encountered` (PyTorch's RuntimeError text). */
const CUDA_ERROR = /CUDA error:\s*([^\n.;]+)/i;
/** NCCL's result codes as PyTorch and NCCL print them. */
const NCCL_ERROR = /\b(nccl(?:SystemError|InternalError|RemoteError|InvalidUsage|InvalidArgument|UnhandledCudaError|InProgress))\b/;
const EXIT_CODE = /\bexit ?code:? ?(-?\d+)\b/i;

function text(value: string | number | boolean | undefined): string {
  return typeof value === 'string' ? value : '';
}

/** Lower case, without addresses and long numbers (pids, offsets), which differ between nodes. */
function slug(value: string): string {
  return value
    .toLowerCase()
    .replace(/0x[0-9a-f]+/g, '#')
    .replace(/\d{4,}/g, '#')
    .replace(/\s+/g, ' ')
    .trim()
    .slice(0, 80);
}

/** The last exception type named in the text: Python prints the one that ended the process last. */
function lastException(message: string): string | undefined {
  let found: string | undefined;
  for (const match of message.matchAll(EXCEPTION)) found = match[1];
  return found;
}

function causeOf(message: string): string | undefined {
  const nccl = NCCL_ERROR.exec(message)?.[1];
  if (nccl !== undefined) return `nccl:${nccl}`;
  const cuda = CUDA_ERROR.exec(message)?.[1];
  return cuda === undefined ? undefined : `cuda:${slug(cuda)}`;
}

export function failureKind(signal: Signal): string {
  const message = text(signal.evidence.message);
  switch (signal.kind) {
    case 'xid':
      return `xid:${typeof signal.evidence.xid === 'number' ? signal.evidence.xid : 'unknown'}`;
    case 'gpu_lost':
      return 'gpu-lost';
    case 'nccl_timeout':
      return `nccl:${NCCL_ERROR.exec(message)?.[1] ?? 'timeout'}`;
    case 'worker_failed': {
      const exception = lastException(message);
      const cause = causeOf(message);
      if (exception !== undefined) return `exception:${exception}${cause === undefined ? '' : `/${cause}`}`;
      if (cause !== undefined) return cause;
      const exitCode = typeof signal.evidence.exitCode === 'number' ? String(signal.evidence.exitCode) : EXIT_CODE.exec(message)?.[1];
      return exitCode === undefined ? 'worker-failed' : `exit:${exitCode}`;
    }
    case 'alert': {
      const alertname = text(signal.evidence.alertname) || 'unnamed';
      const xid = signal.evidence['label.xid'] ?? signal.evidence.xid;
      return xid === undefined ? `alert:${alertname}` : `xid:${String(xid)}`;
    }
    case 'suspect_node':
      return 'suspect-node';
    case 'sxid':
      return `sxid:${typeof signal.evidence.sxid === 'number' ? signal.evidence.sxid : 'unknown'}`;
    case 'preflight_failed':
      return 'preflight';
  }
}
