import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AUDIT_PAGE_MAX } from '../../core/audit.js';
import { ReadLimit } from '../../controller/intake/read-limit.js';
import type { Controller } from '../../controller/service.js';
import { READ_ONLY_TOKEN, TEST_TOKEN, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';

/**
 * What one read of the controller may cost: a page of at most AUDIT_PAGE_MAX entries, a filter
 * that walks the stream in chunks (and finds what it filters on however deep it lies), and a few
 * costly reads at a time per credential, so that 16 parallel big reads with the read-only token
 * neither starve another credential nor the health check.
 */

const ENTRIES = 3000;

describe('costly reads of the controller', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;

  const get = async (
    path: string,
    token: string | undefined = READ_ONLY_TOKEN,
  ): Promise<{ status: number; retryAfter: string | null; body: { entries?: { ref: string }[]; error?: string } }> => {
    const response = await fetch(`${url}${path}`, { headers: token ? { authorization: `Bearer ${token}` } : {} });
    return {
      status: response.status,
      retryAfter: response.headers.get('retry-after'),
      body: (await response.json()) as { entries?: { ref: string }[]; error?: string },
    };
  };

  beforeAll(async () => {
    ({ controller, url } = await startController(testConfig(store.url, store.prefix), { workers: false }));
    await controller.audit.append({ type: 'action', ref: 'deep-entry', summary: 'the oldest entry, written first', data: {} });
    for (let index = 0; index < ENTRIES; index += 1) {
      await controller.audit.append({
        type: 'signal',
        ref: `filler-${index}`,
        node: `n${index % 50}`,
        summary: `filler ${index} ${'x'.repeat(200)}`,
        data: {},
      });
    }
  }, 60_000);

  afterAll(async () => {
    await controller?.close();
    await store.cleanup();
  });

  it('finds an entry by ref, type or node however deep in the stream it lies', async () => {
    expect((await get('/api/v1/audit?ref=deep-entry&limit=1')).body.entries?.map((entry) => entry.ref)).toEqual(['deep-entry']);
    expect((await get('/api/v1/audit?type=action&limit=5')).body.entries?.map((entry) => entry.ref)).toEqual(['deep-entry']);
    // The newest 10 of n7's entries, oldest first, out of 60 spread over the whole stream.
    const n7 = (await get('/api/v1/audit?node=n7&limit=10')).body.entries ?? [];
    expect(n7.map((entry) => entry.ref)).toEqual(Array.from({ length: 10 }, (_, index) => `filler-${2507 + index * 50}`));
    // Paging forward from an id.
    const first = (await get('/api/v1/audit?limit=2&after=0-0')).body.entries ?? [];
    expect(first.map((entry) => entry.ref)).toEqual(['deep-entry', 'filler-0']);
  });

  it(`answers 400 to a page larger than ${AUDIT_PAGE_MAX}, naming the limit`, async () => {
    const answer = await get(`/api/v1/audit?limit=${AUDIT_PAGE_MAX + 1}`);
    expect(answer.status).toBe(400);
    expect(answer.body.error).toMatch(/limit/);
  });

  it('holds each credential to a few costly reads at a time and all of them to a few more, releasing each once', () => {
    const limit = new ReadLimit(2, 3);
    const readOnly = { role: 'read-only' as const };
    const operator = { role: 'operator' as const };
    const agent = { role: 'agent' as const, node: 'n1' };
    const first = limit.take(readOnly);
    const second = limit.take(readOnly);
    expect(first && second).toBeTruthy();
    expect(limit.take(readOnly)).toBeUndefined();
    const third = limit.take(operator);
    expect(third).toBeDefined();
    // Three in all: another credential waits too.
    expect(limit.take(agent)).toBeUndefined();
    first?.();
    first?.();
    expect(limit.take(agent)).toBeDefined();
    expect(limit.take(readOnly)).toBeUndefined();
    second?.();
    third?.();
    expect(limit.take(readOnly)).toBeDefined();
  });

  it('answers a flood of big reads from one credential with pages or 429s, and keeps serving other credentials and the health check', async () => {
    const flood = Array.from({ length: 16 }, () => get(`/api/v1/audit?limit=${AUDIT_PAGE_MAX}`));
    const [operator, health] = await Promise.all([get(`/api/v1/audit?limit=${AUDIT_PAGE_MAX}`, TEST_TOKEN), fetch(`${url}/healthz`)]);
    const answers = await Promise.all(flood);
    expect(health.status).toBe(200);
    expect(operator.status).toBe(200);
    expect(operator.body.entries).toHaveLength(AUDIT_PAGE_MAX);
    // How many overlap depends on timing; every one is either a full page or a 429 to retry.
    for (const answer of answers) expect([200, 429]).toContain(answer.status);
    for (const served of answers.filter((answer) => answer.status === 200)) expect(served.body.entries).toHaveLength(AUDIT_PAGE_MAX);
    for (const refused of answers.filter((answer) => answer.status === 429)) {
      expect(refused.retryAfter).toBe('1');
      expect(refused.body.error).toMatch(/too many audit reads at once for this credential/);
    }
    // Once the flood is over, the credential reads again.
    expect((await get('/api/v1/audit?limit=10')).status).toBe(200);
  });
});
