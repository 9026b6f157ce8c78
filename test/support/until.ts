import { setTimeout as sleep } from 'node:timers/promises';

/** Polls `read` until `ok` holds, failing with the last value seen after `timeoutMs`. */
export async function until<T>(what: string, read: () => Promise<T>, ok: (value: T) => boolean, timeoutMs = 15_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let value = await read();
  while (!ok(value)) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}; last value: ${JSON.stringify(value, null, 1).slice(0, 3000)}`);
    await sleep(50);
    value = await read();
  }
  return value;
}
