import { pino } from 'pino';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { startIntervalTask } from '../../controller/interval-task.js';

/** A logger whose lines the test reads back. */
function capturingLogger(): { logger: pino.Logger; messages: () => { msg: string; runningMs?: number; err?: { message: string } }[] } {
  const lines: string[] = [];
  const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push(line) });
  return { logger, messages: () => lines.map((line) => JSON.parse(line) as { msg: string; runningMs?: number; err?: { message: string } }) };
}

describe('a controller task on a clock', () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('runs once per interval while each run finishes in time', async () => {
    const { logger } = capturingLogger();
    let runs = 0;
    const task = startIntervalTask('tick', 1000, async () => void (runs += 1), logger);
    await vi.advanceTimersByTimeAsync(5500);
    task.stop();
    await vi.advanceTimersByTimeAsync(5000);
    expect(runs).toBe(5);
  });

  it('skips the intervals a run is still going through, then runs again once it is done', async () => {
    const { logger, messages } = capturingLogger();
    const finish: (() => void)[] = [];
    let started = 0;
    const task = startIntervalTask('tick', 1000, () => new Promise<void>((resolve) => void ((started += 1), finish.push(resolve))), logger);
    await vi.advanceTimersByTimeAsync(4500);
    expect(started).toBe(1);
    finish.shift()?.();
    await vi.advanceTimersByTimeAsync(1000);
    expect(started).toBe(2);
    task.stop();
    expect(messages()).toEqual([]);
  });

  it('reports a run stuck past the stale bound and starts the next one anyway', async () => {
    const { logger, messages } = capturingLogger();
    let started = 0;
    const task = startIntervalTask('recovery tick', 1000, () => new Promise<void>(() => void (started += 1)), logger, 3);
    await vi.advanceTimersByTimeAsync(3500);
    expect(started).toBe(1);
    await vi.advanceTimersByTimeAsync(1000);
    expect(started).toBe(2);
    task.stop();
    expect(messages()).toMatchObject([{ msg: 'recovery tick still running; starting the next one', runningMs: 3000 }]);
  });

  it('logs a run that fails and keeps the clock going', async () => {
    const { logger, messages } = capturingLogger();
    let runs = 0;
    const task = startIntervalTask(
      'fail-slow check',
      1000,
      async () => {
        runs += 1;
        throw new Error('Prometheus answered 503');
      },
      logger,
    );
    await vi.advanceTimersByTimeAsync(2500);
    task.stop();
    expect(runs).toBe(2);
    expect(messages()).toMatchObject([
      { msg: 'fail-slow check failed', err: { message: 'Prometheus answered 503' } },
      { msg: 'fail-slow check failed', err: { message: 'Prometheus answered 503' } },
    ]);
  });
});
