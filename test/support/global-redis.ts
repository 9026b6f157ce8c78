import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestProject } from 'vitest/node';
import { startRedis } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';

declare module 'vitest' {
  export interface ProvidedContext {
    redisUrl: string;
  }
}

/** One real Redis for the whole run; each test file uses its own key prefix. */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-test-redis-'));
  const group = new ProcessGroup();
  const redis = await startRedis(group, root);
  project.provide('redisUrl', redis.url);
  return async () => {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  };
}
