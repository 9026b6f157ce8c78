import type { Logger } from '../core/log.js';

/**
 * A task the controller runs on a clock (the recovery tick, the fail-slow checks): one run at a
 * time, since runs side by side would only fight over the same state. A run still going when the
 * next is due makes that one skip; one going for `staleAfter` intervals is reported and no longer
 * waited for, so a run stuck for good cannot stop the clock. A run that throws is logged.
 */
export interface IntervalTask {
  stop(): void;
}

export function startIntervalTask(name: string, intervalMs: number, task: () => Promise<void>, logger: Logger, staleAfter = 12): IntervalTask {
  let runningSince: number | null = null;
  const timer = setInterval(() => {
    const now = Date.now();
    if (runningSince !== null && now - runningSince < intervalMs * staleAfter) return;
    if (runningSince !== null) logger.warn({ task: name, runningMs: now - runningSince }, `${name} still running; starting the next one`);
    runningSince = now;
    void task()
      .catch((error: unknown) => logger.warn({ task: name, err: error }, `${name} failed`))
      .finally(() => {
        if (runningSince === now) runningSince = null;
      });
  }, intervalMs);
  timer.unref();
  return { stop: () => clearInterval(timer) };
}
