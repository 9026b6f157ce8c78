import { pino, type Logger } from 'pino';

export type { Logger };

/**
 * One logger per process, made in the composition root and passed down. Logs go to stderr so
 * stdout stays clean for command output (`agent --once`, `audit --json`, the demo's timeline).
 */
export function createLogger(name: string, level = process.env.STEADFAST_LOG_LEVEL ?? 'info'): Logger {
  return pino({ name, level, base: { pid: process.pid } }, pino.destination({ fd: 2, sync: true }));
}

/** A logger that drops everything, for tests and one-shot CLI output. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
