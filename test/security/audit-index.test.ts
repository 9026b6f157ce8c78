import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AuditEntry, AuditInput } from '../../core/audit.js';
import { Keys, workerConnection, type Redis } from '../../core/redis.js';
import type { Controller } from '../../controller/service.js';
import { startRedis } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';
import { READ_ONLY_TOKEN, startController, testConfig } from '../support/controller.js';

/**
 * A filtered audit read (type, node, ref) costs what it returns, not what the audit holds: on a
 * real controller over 15,000 entries, it answers exactly the entries a filter over the whole
 * stream finds, entries written before the index existed included, and Redis sends the controller
 * no more for it than for an unfiltered page of as many entries. Redis is this file's own, so
 * that its byte counters count this file's reads only.
 */

/** Written the way controllers before the index wrote them: no index, no indexed-from marker. */
const EARLIER = 3000;
const LATER = 12_000;
const NODES = 50;

const PREFIX = 'indexed';

function input(index: number): AuditInput {
  // Every 97th entry an action, every 10th about no node; refs repeat in pairs.
  return {
    type: index % 97 === 0 ? 'action' : 'signal',
    ref: `e-${Math.floor(index / 2)}`,
    node: index % 10 === 9 ? undefined : `n${index % NODES}`,
    summary: `entry ${index} ${'x'.repeat(150)}`,
    data: { index },
  };
}

/** Odd values next to each other: a NUL in one must not make it part of another's range. */
const ODD: readonly AuditInput[] = [
  { type: 'signal', ref: 'odd-1', node: 'odd', summary: 'plain', data: {} },
  { type: 'signal', ref: 'odd-2', node: 'odd\u0000n1', summary: 'with a NUL', data: {} },
  { type: 'decision', ref: 'odd-3', node: 'nœud-é', summary: 'not ASCII', data: {} },
  { type: 'signal', ref: 'odd-4', node: 'odd\u0000', summary: 'ends in a NUL', data: {} },
];

async function netOutputBytes(redis: Redis): Promise<number> {
  const stats = await redis.info('stats');
  return Number(/total_net_output_bytes:(\d+)/.exec(stats)?.[1]);
}

describe('filtered audit reads through the index', () => {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-audit-index-'));
  const processes = new ProcessGroup();
  let redis: Redis;
  let redisUrl: string;
  let controller: Controller;
  let url: string;
  let everything: AuditEntry[];

  const get = async (query: string): Promise<AuditEntry[]> => {
    const response = await fetch(`${url}/api/v1/audit?${query}`, { headers: { authorization: `Bearer ${READ_ONLY_TOKEN}` } });
    const body = (await response.json()) as { entries?: AuditEntry[]; error?: string };
    if (response.status !== 200) throw new Error(`GET /api/v1/audit?${query}: ${response.status} ${body.error}`);
    return body.entries ?? [];
  };

  /** The newest `limit` entries that `keep` accepts, oldest first: what a filter over the whole stream returns. */
  const scanned = (keep: (entry: AuditEntry) => boolean, limit: number): AuditEntry[] => everything.filter(keep).slice(-limit);

  beforeAll(async () => {
    const store = await startRedis(processes, root, 'redis', undefined, ['--appendonly', 'no']);
    redisUrl = store.url;
    redis = workerConnection(store.url);
    const keys = new Keys(PREFIX);
    // A controller from before the index: plain stream entries.
    for (let start = 0; start < EARLIER; start += 500) {
      const pipeline = redis.pipeline();
      for (let index = start; index < Math.min(EARLIER, start + 500); index += 1) {
        const entry = input(index);
        pipeline.xadd(
          keys.audit,
          '*',
          'type',
          entry.type,
          'ref',
          entry.ref,
          'node',
          entry.node ?? '',
          'summary',
          entry.summary,
          'data',
          JSON.stringify(entry.data),
          'time',
          new Date().toISOString(),
          'actor',
          '',
        );
      }
      await pipeline.exec();
    }
    ({ controller, url } = await startController(testConfig(store.url, PREFIX), { workers: false }));
    for (const entry of ODD) await controller.audit.append(entry);
    for (let start = EARLIER; start < EARLIER + LATER; start += 500) {
      await Promise.all(Array.from({ length: Math.min(500, EARLIER + LATER - start) }, (_, offset) => controller.audit.append(input(start + offset))));
    }
    everything = await controller.audit.read({ limit: 100_000 });
    expect(everything).toHaveLength(EARLIER + ODD.length + LATER);
  }, 120_000);

  afterAll(async () => {
    await controller?.close();
    redis?.disconnect();
    await processes.stopAll();
    rmSync(root, { recursive: true, force: true });
  });

  it('answers every filter with exactly the entries a filter over the whole stream finds, those from before the index included', async () => {
    const byNode = (node: string) => (entry: AuditEntry) => entry.node === node;
    expect(await get('node=n7&limit=1000')).toEqual(scanned(byNode('n7'), 1000));
    expect(await get('node=n7&limit=10')).toEqual(scanned(byNode('n7'), 10));
    expect(await get('type=action&limit=1000')).toEqual(scanned((entry) => entry.type === 'action', 1000));
    expect(await get('type=decision')).toEqual(scanned((entry) => entry.type === 'decision', 100));
    // The oldest entry there is, written before the index, by its ref; and a ref two entries share.
    expect((await get('ref=e-0')).map((entry) => entry.summary)).toEqual([input(0).summary, input(1).summary]);
    expect(await get('ref=e-7000')).toEqual(scanned((entry) => entry.ref === 'e-7000', 100));
    expect(await get('node=n3&type=action&limit=1000')).toEqual(scanned((entry) => entry.node === 'n3' && entry.type === 'action', 1000));
    expect(await get('ref=e-4000&node=n0')).toEqual(scanned((entry) => entry.ref === 'e-4000' && entry.node === 'n0', 100));
    expect(await get('ref=e-4000&node=n1')).toEqual(scanned((entry) => entry.ref === 'e-4000' && entry.node === 'n1', 100));
    expect(await get('node=nobody')).toEqual([]);
    for (const odd of ODD) {
      const node = odd.node as string;
      expect(
        (await get(`node=${encodeURIComponent(node)}`)).map((entry) => entry.ref),
        node,
      ).toEqual([odd.ref]);
    }
  });

  it("pages forward through one node's entries with after, as through the whole stream", async () => {
    const keep = (entry: AuditEntry): boolean => entry.node === 'n11';
    const paged: AuditEntry[] = [];
    let after = '0-0';
    for (let page = 0; page < 10; page += 1) {
      const entries = await get(`node=n11&limit=100&after=${after}`);
      paged.push(...entries);
      if (entries.length < 100) break;
      after = (entries.at(-1) as AuditEntry).id;
    }
    expect(paged).toEqual(everything.filter(keep));
    // From a cursor in the middle, among entries from before the index and after it.
    const middle = everything[EARLIER - 5] as AuditEntry;
    expect(await get(`node=n11&limit=50&after=${middle.id}`)).toEqual(
      everything.filter((entry) => keep(entry) && everything.indexOf(entry) > EARLIER - 5).slice(0, 50),
    );
  });

  it('has Redis send no more for a filtered read than for an unfiltered page of as many entries', async () => {
    const matching = everything.filter((entry) => entry.node === 'n23').length;
    expect(matching).toBeGreaterThan(200);
    const before = await netOutputBytes(redis);
    expect(await get(`limit=${matching}`)).toHaveLength(matching);
    const page = (await netOutputBytes(redis)) - before;
    const start = await netOutputBytes(redis);
    expect(await get('node=n23&limit=1000')).toHaveLength(matching);
    const filtered = (await netOutputBytes(redis)) - start;
    // A walk of the whole stream sends 50 times the page.
    expect(filtered, `bytes for ${matching} filtered entries against ${page} for the same number unfiltered`).toBeLessThan(page * 1.5 + 16 * 1024);
    // A node with a type reads the entries of both, not those of either: none, when none match.
    const none = await netOutputBytes(redis);
    expect(await get('node=n23&type=decision&limit=1000')).toEqual([]);
    expect((await netOutputBytes(redis)) - none).toBeLessThan(16 * 1024);
  });

  it("drops an entry's index members when the stream is trimmed, so the index holds what the stream holds", async () => {
    const prefix = 'trimmed';
    const keys = new Keys(prefix);
    const small = await startController(testConfig(redisUrl, prefix, { controller: { auditMaxLength: 100 } }), { workers: false });
    try {
      for (let index = 0; index < 350; index += 1) await small.controller.audit.append(input(index));
      const kept = await small.controller.audit.read({ limit: 1000 });
      expect(kept.map((entry) => entry.summary)).toEqual(Array.from({ length: 100 }, (_, offset) => input(250 + offset).summary));
      // type, ref, and node and node with type (when there is a node) for each kept entry, and nothing else.
      const members = kept.reduce((sum, entry) => sum + (entry.node ? 4 : 2), 0);
      expect(await redis.zcard(keys.auditIndex)).toBe(members);
      expect((await small.controller.audit.read({ node: 'n3', limit: 1000 })).map((entry) => entry.summary)).toEqual(
        kept.filter((entry) => entry.node === 'n3').map((entry) => entry.summary),
      );
    } finally {
      await small.controller.close();
    }
  });
});
