import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { Locks } from '../../core/locks.js';
import { testRedis } from '../support/redis.js';

const REPO = resolve(import.meta.dirname, '../..');

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sources(path);
    return name.endsWith('.ts') ? [relative(REPO, path)] : [];
  });
}

/** Every source file of the controller, the actuators and core, with its text. */
const TREE = ['core', 'actuators', 'controller', 'cli']
  .flatMap((folder) => sources(join(REPO, folder)))
  .map((file) => ({ file, text: readFileSync(join(REPO, file), 'utf8') }));

/**
 * The stores whose own Lua scripts keep their records consistent (a job's registration, a
 * world's epoch, a checkpoint's copies, a progress report, the kept signals, the audit's index):
 * none of them takes or lets go of a claim, a lease or a hold.
 */
const STORES = [
  'controller/checkpoint-store.ts',
  'controller/job-store.ts',
  'controller/progress.ts',
  'controller/signal-retention.ts',
  'controller/world-store.ts',
  'core/audit.ts',
  'core/audit-index.ts',
];

describe('claims, leases and holds', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  afterEach(async () => {
    for (const store of stores.splice(0)) await store.cleanup();
  });

  it('have their scripts in core/locks.ts alone: no other file of the controller or the actuators runs a script of its own', () => {
    const scripted = TREE.filter(({ text }) => /redis\.call\(|\.eval\(|defineCommand\(|luaScript\(/.test(text)).map(({ file }) => file);
    expect(scripted.filter((file) => !STORES.includes(file)).sort()).toEqual(['core/locks.ts', 'core/redis.ts']);
    // The policy worker and its dispatchers classify and decide; they take locks through core/locks.ts.
    expect(TREE.filter(({ file, text }) => file.startsWith('controller/policy/') && /redis\.call|\.eval\(|defineCommand|luaScript/.test(text))).toEqual([]);
  });

  it('write each script once', () => {
    const locks = TREE.find(({ file }) => file === 'core/locks.ts')?.text ?? '';
    const scripts = [...locks.matchAll(/^const [A-Z_]+ = (?:"([^"]+)"|`([^`]+)`);$/gms)].map((match) => (match[1] ?? match[2] ?? '').trim());
    expect(scripts.length).toBeGreaterThanOrEqual(5);
    expect(new Set(scripts).size).toBe(scripts.length);
    for (const script of scripts) {
      const firstLine = script.split('\n')[0] ?? '';
      expect(TREE.filter(({ text }) => text.includes(firstLine)).map(({ file }) => file)).toEqual(['core/locks.ts']);
    }
  });

  it('name the keys of claims, leases and job holds in core/locks.ts alone', () => {
    const users = TREE.filter(({ file, text }) => file !== 'core/redis.ts' && /\.(nodeDrainClaim|nodeLease|jobStepsHold|analysisLeader)\b/.test(text)).map(
      ({ file }) => file,
    );
    expect(users).toEqual(['core/locks.ts']);
  });

  it('take, renew and let go of a node claim, a lease, a job hold and the analysis lead only for their holder', async () => {
    const store = testRedis();
    stores.push(store);
    const locks = new Locks(store.redis, store.keys);
    expect(await locks.claimNode('n1', 'd-1', '{"a":1}', 60)).toBe('d-1');
    expect(await locks.claimNode('n1', 'd-1', '{"a":1}', 60)).toBe('d-1');
    expect(await locks.claimNode('n1', 'd-2', '{"a":2}', 60)).toBe('d-1');
    expect(await store.redis.get(store.keys.decision('d-1'))).toBe('{"a":1}');
    expect(await store.redis.get(store.keys.decision('d-2'))).toBeNull();
    await locks.releaseNodeClaim('n1', 'd-2');
    expect(await locks.nodeClaim('n1')).toBe('d-1');
    await locks.shortenNodeClaim('n1', 'd-1', 5);
    expect(await store.redis.ttl(store.keys.nodeDrainClaim('n1'))).toBeLessThanOrEqual(5);
    await locks.releaseNodeClaim('n1', 'd-1');
    expect(await locks.nodeClaim('n1')).toBeNull();
    expect(await locks.claimNode('n1', 'd-3', '{}', 60)).toBe('d-3');
    expect(await locks.closeNodeClaimOnResume('n1', 1000)).toBe('d-3');
    expect(await locks.closeNodeClaimOnResume('n1', 500)).toBeUndefined();
    expect(await store.redis.hget(store.keys.nodeResumes, 'n1')).toBe('1000');

    expect(await locks.takeLease('n1', 'a', 60_000)).toBeUndefined();
    expect(await locks.takeLease('n1', 'a', 60_000)).toBeUndefined();
    expect(await locks.takeLease('n1', 'b', 60_000)).toBe('a');
    await locks.releaseLease('n1', 'b');
    expect(await locks.takeLease('n1', 'b', 60_000)).toBe('a');
    await locks.releaseLease('n1', 'a');
    expect(await locks.takeLease('n1', 'b', 60_000)).toBeUndefined();

    expect(await locks.holdJob('llama', 'x', 60_000)).toBe(true);
    expect(await locks.holdJob('llama', 'y', 60_000)).toBe(false);
    await locks.renewJobHold('llama', 'y', 10);
    expect(await store.redis.pttl(store.keys.jobStepsHold('llama'))).toBeGreaterThan(1000);
    await locks.releaseJobHold('llama', 'y');
    expect(await locks.holdJob('llama', 'y', 60_000)).toBe(false);
    await locks.releaseJobHold('llama', 'x');
    expect(await locks.holdJob('llama', 'y', 60_000)).toBe(true);

    expect(await locks.takeBudgetSlot('d-1', 1000, 10_000, 1)).toBe(true);
    expect(await locks.takeBudgetSlot('d-1', 1001, 10_000, 1)).toBe(true);
    expect(await locks.takeBudgetSlot('d-2', 1002, 10_000, 1)).toBe(false);

    expect(await locks.leadAnalysis('replica-a', 60_000)).toBe(true);
    expect(await locks.leadAnalysis('replica-b', 60_000)).toBe(false);
    expect(await locks.leadAnalysis('replica-a', 60_000)).toBe(true);
  });
});
