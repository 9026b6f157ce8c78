import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { controllerExit } from '../support/controller-exit.js';
import { testRedis } from '../support/redis.js';

/** A controller that cannot run says why and exits non-zero, rather than staying up without listening. */
describe('a controller that cannot start', () => {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-start-'));
  const store = testRedis();
  afterAll(async () => {
    rmSync(root, { recursive: true, force: true });
    await store.cleanup();
  });
  const redis = (): string => `redis:\n  url: ${store.url}\n  prefix: ${store.prefix}\n`;

  it.each([
    [
      'no credential at all',
      (): string => `${redis()}controller:\n  port: 0\n`,
      2,
      /controller\.auth: no credential configured .*refusing to run unauthenticated/,
    ],
    [
      'an unreadable token file',
      (): string => `${redis()}controller:\n  port: 0\n  auth:\n    operatorTokenFile: ${join(root, 'missing-token')}\n`,
      2,
      /controller\.auth\.operatorTokenFile: cannot read .*missing-token/,
    ],
    [
      'an invalid Redis URL',
      (): string => `redis:\n  url: redis://127.0.0.1:notaport\ncontroller:\n  port: 0\n  auth:\n    operatorToken: operator-token-0123456789\n`,
      2,
      /redis\.url: is not a valid URL/,
    ],
    // The backend fails after the Redis connections are open: those must not keep the process up.
    [
      'a backend that cannot be made',
      (): string =>
        `${redis()}controller:\n  port: 0\n  auth:\n    operatorToken: operator-token-0123456789\nbackend:\n  kind: kubernetes\n  kubernetes:\n    connection: kubeconfig\n    kubeconfig: ${join(root, 'missing-kubeconfig')}\n`,
      1,
      /missing-kubeconfig/,
    ],
  ] as const)(
    'exits non-zero given %s, with a clear message',
    async (_what, text, code, message) => {
      const config = join(root, `config-${code}-${Math.random().toString(36).slice(2)}.yaml`);
      writeFileSync(config, text());
      const exit = await controllerExit(config);
      expect(exit.code, exit.stderr).toBe(code);
      expect(exit.stderr).toMatch(message);
    },
    40_000,
  );
});
