import { pino, type Logger } from 'pino';

export type { Logger };

/** One logger per process, made in the composition root and passed down. */
export function createLogger(name: string, level = process.env.STEADFAST_LOG_LEVEL ?? 'info'): Logger {
  return pino({ name, level, base: { pid: process.pid } });
}

/** A logger that drops everything, for tests and one-shot CLI output. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
