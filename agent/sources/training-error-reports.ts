/**
 * The error reports the training-log parser (training-log-failures.ts) makes, and how a
 * torchrun or srun failure summary is put into words.
 */

export interface NcclTimeoutReport {
  readonly kind: 'nccl_timeout';
  /** Global rank that timed out (`[Rank 7]` or the `[rank7]:` prefix). */
  readonly rank?: number;
  readonly seqNum?: number;
  readonly opType?: string;
  readonly timeoutMs?: number;
  readonly ranForMs?: number;
  readonly message: string;
}

export interface ChildFailure {
  readonly rank?: number;
  readonly localRank?: number;
  readonly exitCode?: number;
  readonly pid?: number;
  readonly host?: string;
  readonly errorFile?: string;
  readonly traceback?: string;
}

/**
 * A worker failure: one torchrun `ChildFailedError` summary, one torchrun agent `failed
 * (exitcode: …)` line, or srun's task failure lines for one step (a task is a rank when srun
 * starts the ranks itself).
 */
export interface ChildFailedReport {
  readonly kind: 'child_failed';
  /** Global rank of the root cause (first observed failure), else of the first failure listed. */
  readonly rank?: number;
  readonly exitCode?: number;
  /** Every failed global rank named, root cause first. */
  readonly ranks: readonly number[];
  readonly failures: readonly ChildFailure[];
  readonly message: string;
}

export interface CudaErrorReport {
  readonly kind: 'cuda_error';
  readonly message: string;
}

export interface NcclErrorReport {
  readonly kind: 'nccl_error';
  readonly message: string;
}

export type TrainingErrorReport = NcclTimeoutReport | ChildFailedReport | CudaErrorReport | NcclErrorReport;
export type TrainingErrorKind = TrainingErrorReport['kind'];
export const TRAINING_ERROR_KINDS: readonly TrainingErrorKind[] = ['nccl_timeout', 'nccl_error', 'cuda_error', 'child_failed'];

function describeFailure(failure: ChildFailure): string {
  const who = failure.rank !== undefined ? `rank ${failure.rank}` : `local_rank ${failure.localRank ?? '?'}`;
  const local = failure.rank !== undefined && failure.localRank !== undefined ? ` (local_rank ${failure.localRank})` : '';
  const code = failure.exitCode !== undefined ? ` exitcode ${failure.exitCode}` : '';
  const host = failure.host !== undefined ? ` on ${failure.host}` : '';
  return `${who}${local}${code}${host}`;
}

export function childFailedReport(
  failures: readonly ChildFailure[],
  rootCause: ChildFailure | undefined,
  headline: string,
  detail?: string,
): ChildFailedReport {
  const ordered = rootCause ? [rootCause, ...failures] : [...failures];
  const ranks = [...new Set(ordered.flatMap((failure) => (failure.rank === undefined ? [] : [failure.rank])))];
  const first = ordered[0];
  const parts = [headline];
  if (rootCause) parts.push(`root cause ${describeFailure(rootCause)}`);
  if (failures.length > 0) parts.push(`${rootCause ? 'also failed' : 'failed'}: ${failures.map(describeFailure).join(', ')}`);
  const why = detail ?? first?.traceback;
  if (why !== undefined) parts.push(why);
  const rank = first?.rank;
  const exitCode = first?.exitCode;
  return {
    kind: 'child_failed',
    ...(rank === undefined ? {} : { rank }),
    ...(exitCode === undefined ? {} : { exitCode }),
    ranks,
    failures: ordered,
    message: parts.join('; '),
  };
}
