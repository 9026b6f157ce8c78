import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { DryRunBackend } from '../../actuators/dry-run.js';
import { post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';

const run = promisify(execFile);
const BIN = join(import.meta.dirname, '..', '..', 'bin', 'steadfast.js');

describe('steadfast resume', () => {
  const store = testRedis();
  afterAll(() => store.cleanup());

  it('returns the node to service and lets the next fault on it drain it again', async () => {
    const { controller, url } = await startController(testConfig(store.url, store.prefix));
    const backend = new DryRunBackend(store.redis, store.keys);
    const drains = async (): Promise<number> =>
      (await controller.audit.read({ node: 'node-7', type: 'action' })).filter((entry) => entry.data.state === 'running').length;
    const waitForDrains = async (count: number): Promise<void> => {
      for (let i = 0; i < 200 && (await drains()) < count; i += 1) await sleep(50);
    };
    try {
      const fault = (time: string): Record<string, unknown> => ({ kind: 'xid', node: 'node-7', gpu: '0000:18:00', xid: 48, message: 'DBE', time });
      await post(`${url}/api/v1/signals`, fault('2026-11-21T10:00:00.000Z'));
      await waitForDrains(1);
      expect(Object.keys(await backend.recorded())).toEqual(['node-7']);

      const { stdout } = await run(process.execPath, [BIN, 'resume', 'node-7', '--reason', 'GPU replaced'], {
        env: { ...process.env, STEADFAST_REDIS__URL: store.url, STEADFAST_REDIS__PREFIX: store.prefix, STEADFAST_LOG_LEVEL: 'silent' },
      });
      expect(stdout).toMatch(/^node-7: resumed through dry-run \(was drained \(dry-run\)\); decision d-[0-9a-f]+ closed\n$/);
      expect(await backend.recorded()).toEqual({});
      const audit = await controller.audit.read({ node: 'node-7', type: 'action' });
      expect(audit.at(-1)?.summary).toBe('resume node-7: done (GPU replaced; was drained (dry-run))');

      await post(`${url}/api/v1/signals`, fault('2026-11-21T12:00:00.000Z'));
      await waitForDrains(2);
      expect(await drains()).toBe(2);
      expect(Object.keys(await backend.recorded())).toEqual(['node-7']);
    } finally {
      await controller.close();
    }
  });
});
