import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DoNotRetryError, RetryLaterError } from '../../core/errors.js';
import { expandHostlist } from '../../actuators/hostlist.js';
import { SlurmBackend } from '../../actuators/slurm.js';
import { SlurmRestClient } from '../../actuators/slurm-rest.js';
import { slurmNode, startSlurm, startSlurmRest, type SlurmPart, type SlurmRestPart } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';

describe('Slurm backend over a real slurmrestd (JWT auth)', () => {
  const group = new ProcessGroup();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-slurmrest-test-'));
  let slurm: SlurmPart;
  let rest: SlurmRestPart;
  let backend: SlurmBackend;

  beforeAll(async () => {
    slurm = await startSlurm(group, root, ['gpu-r01', 'gpu-r02', 'gpu-r03']);
    rest = await startSlurmRest(group, slurm);
    const client = new SlurmRestClient({ url: rest.url, user: rest.user, tokenFile: rest.tokenFile, timeoutMs: 10_000 });
    backend = new SlurmBackend({ scontrol: 'scontrol', sinfo: 'sinfo', env: slurm.env, timeoutMs: 10_000, rest: client });
  }, 60_000);
  afterAll(async () => {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  });

  it('discovers the API version the daemon serves and that Slurm 22.05 cannot update nodes over REST', async () => {
    const client = new SlurmRestClient({ url: rest.url, user: rest.user, tokenFile: rest.tokenFile, timeoutMs: 10_000 });
    const api = await client.describe();
    expect(api.version).toMatch(/^v0\.0\.\d+$/);
    // Debian bookworm ships 22.05 (v0.0.38, reads only); a newer Slurm offers POST on the node path.
    expect(api.updatesNodes).toBe(Number(api.version.split('.')[2]) >= 39);
  });

  it('reads node state over REST, and sees a drain with its reason', async () => {
    expect(await backend.nodeState('gpu-r01')).toMatchObject({ node: 'gpu-r01', exists: true, drained: false });
    await backend.drain('gpu-r02', 'steadfast: fatal Xid 79 audit=d-7');
    expect((await slurmNode(slurm, 'gpu-r02')).reason).toBe('steadfast: fatal Xid 79 audit=d-7');
    expect(await backend.nodeState('gpu-r02')).toMatchObject({ exists: true, drained: true, reason: 'steadfast: fatal Xid 79 audit=d-7' });
    await backend.resume('gpu-r02');
    expect((await backend.nodeState('gpu-r02')).drained).toBe(false);
  });

  it('reports a node Slurm does not know as not existing', async () => {
    expect(await backend.nodeState('gpu-zz')).toMatchObject({ exists: false, drained: false });
  });

  it('reads the standby reservation over REST and expands its compressed node list', async () => {
    expect(await backend.standbys()).toEqual([]);
    await backend.holdStandby('gpu-r01');
    await backend.holdStandby('gpu-r03');
    expect(await backend.standbys()).toEqual(['gpu-r01', 'gpu-r03']);
    await backend.activateStandby('gpu-r01', 'job-1');
    expect(await backend.standbys()).toEqual(['gpu-r03']);
  });

  it('reads a rotated token file on every call and names a file that holds no JWT', async () => {
    const tokenFile = join(root, 'rotating.token');
    writeFileSync(tokenFile, 'not a token\n');
    const client = new SlurmRestClient({ url: rest.url, user: rest.user, tokenFile, timeoutMs: 10_000 });
    const failure = await client.node('gpu-r01').catch((error: unknown) => error);
    expect(failure).toBeInstanceOf(RetryLaterError);
    expect(String(failure)).toContain(`the slurmrestd token file ${tokenFile} does not hold a JWT`);
    writeFileSync(tokenFile, readFileSync(rest.tokenFile));
    expect(await client.node('gpu-r01')).toMatchObject({ exists: true });
  });
});

describe('Slurm backend over slurmrestd v0.0.40 (a stand-in serving its documented node update)', () => {
  const requests: { method: string; url: string; user?: string; token?: string; body: string }[] = [];
  let server: Server;
  let url: string;
  const drained = new Map<string, string>();

  async function body(request: IncomingMessage): Promise<string> {
    let text = '';
    for await (const chunk of request) text += String(chunk);
    return text;
  }

  beforeAll(async () => {
    server = createServer((request, response) => void answer(request, response));
    async function answer(request: IncomingMessage, response: ServerResponse): Promise<void> {
      const text = await body(request);
      requests.push({
        method: request.method ?? '',
        url: request.url ?? '',
        user: request.headers['x-slurm-user-name'] as string,
        token: request.headers['x-slurm-user-token'] as string,
        body: text,
      });
      response.setHeader('content-type', 'application/json');
      if (request.headers['x-slurm-user-token'] === 'expired.token.x') {
        response.statusCode = 401;
        response.end('Authentication failure');
        return;
      }
      if (request.url === '/openapi/v3') {
        response.end(
          JSON.stringify({
            paths: { '/slurm/v0.0.39/node/{node_name}': { get: {}, post: {} }, '/slurm/v0.0.40/node/{node_name}': { get: {}, post: {}, delete: {} } },
          }),
        );
        return;
      }
      const match = /^\/slurm\/v0\.0\.40\/node\/([^/]+)$/.exec(request.url ?? '');
      if (!match?.[1] || match[1] === 'nosuch') {
        response.statusCode = 500;
        response.end(JSON.stringify({ errors: [{ error_number: 2018, errno: 2018, description: 'Invalid node name specified' }] }));
        return;
      }
      const node = decodeURIComponent(match[1]);
      if (request.method === 'POST') {
        const update = JSON.parse(text) as { state: string[]; reason?: string };
        if (update.state.includes('DRAIN')) drained.set(node, update.reason ?? '');
        if (update.state.includes('RESUME')) drained.delete(node);
        response.end(JSON.stringify({ errors: [] }));
        return;
      }
      response.end(
        JSON.stringify({
          errors: [],
          nodes: [{ name: node, state: drained.has(node) ? ['IDLE', 'DRAIN'] : ['IDLE'], reason: drained.get(node) ?? '' }],
        }),
      );
    }
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  it('drains and resumes over REST with the newest version, the user and the token, and no scontrol at all', async () => {
    const client = new SlurmRestClient({ url, user: 'steadfast', token: 'a.b.c', timeoutMs: 5000 });
    const backend = new SlurmBackend({ scontrol: '/nonexistent/scontrol', sinfo: '/nonexistent/sinfo', env: {}, timeoutMs: 1000, rest: client });
    await backend.drain('gpu-9', 'steadfast: NVLink error\nsecond line');
    expect(requests.at(-1)).toEqual({
      method: 'POST',
      url: '/slurm/v0.0.40/node/gpu-9',
      user: 'steadfast',
      token: 'a.b.c',
      body: JSON.stringify({ state: ['DRAIN'], reason: 'steadfast: NVLink error second line' }),
    });
    expect(await backend.nodeState('gpu-9')).toMatchObject({ exists: true, drained: true, raw: 'IDLE+DRAIN' });
    await backend.resume('gpu-9');
    expect(JSON.parse(requests.at(-1)?.body ?? '{}')).toEqual({ state: ['RESUME'] });
    expect((await backend.nodeState('gpu-9')).drained).toBe(false);
  });

  it('answers a rejected token with a retryable error that says the token may be expired', async () => {
    const client = new SlurmRestClient({ url, user: 'steadfast', token: 'expired.token.x', timeoutMs: 5000 });
    const failure = await client.node('gpu-9').catch((error: unknown) => error);
    expect(failure).toBeInstanceOf(RetryLaterError);
    expect(String(failure)).toMatch(/HTTP 401\): is the token for steadfast expired or wrong/);
  });

  it('refuses to retry an update of a node Slurm does not know', async () => {
    const client = new SlurmRestClient({ url, user: 'steadfast', token: 'a.b.c', timeoutMs: 5000 });
    await expect(client.updateNode('nosuch', 'DRAIN', 'x')).rejects.toBeInstanceOf(DoNotRetryError);
  });
});

describe('Slurm hostlist expansion', () => {
  it('expands ranges with their zero padding, lists, several brackets and plain names', () => {
    expect(expandHostlist('gpu-[01-03,07],login1')).toEqual(['gpu-01', 'gpu-02', 'gpu-03', 'gpu-07', 'login1']);
    expect(expandHostlist('r[1-2]n[8-9]')).toEqual(['r1n8', 'r1n9', 'r2n8', 'r2n9']);
    expect(expandHostlist('')).toEqual([]);
    expect(expandHostlist('(null)')).toEqual([]);
  });

  it('rejects malformed lists with a message naming the fault', () => {
    expect(() => expandHostlist('gpu-[01-03')).toThrow(/unmatched "\["/);
    expect(() => expandHostlist('gpu-[3-1]')).toThrow(/descending range/);
    expect(() => expandHostlist('gpu-[a-b]')).toThrow(/bad range/);
    expect(() => expandHostlist('gpu-[0-99999999]')).toThrow(/wider than/);
  });
});
