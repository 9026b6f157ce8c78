import { mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Registry } from 'prom-client';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { agentCommand, agentSettingsFromFlags } from '../../cli/agent.js';
import { kubernetesApiConfiguration } from '../../actuators/kubernetes.js';
import { kubernetesAgentsSchema } from '../../core/auth-config.js';
import { configSchema } from '../../core/config.js';
import { ReviewUnavailableError, ReviewsRateLimitedError, TokenRefusedError } from '../../core/credentials.js';
import { InputError } from '../../core/errors.js';
import { silentLogger } from '../../core/log.js';
import { createFastPathClient, type TokenSource } from '../../agent/fast-path-client.js';
import { KubernetesAgentTokens, kubernetesAgentTokens } from '../../controller/kubernetes-agents.js';
import type { Controller } from '../../controller/service.js';
import { TEST_TOKEN, post, startController, testConfig } from '../support/controller.js';
import { startKubeApi, startKubeApiOverTls, type KubeApiStandIn } from '../support/kube-api.js';
import { AGENT_USER, AUDIENCE, START, podRead, projectedToken, tokenReview } from '../support/kube-tokens.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

/** Where the agents' requests come from, as the intake passes it to the reviewer. */
const AGENT_ADDRESS = '10.0.0.7';

describe('agents authenticated by their pod service-account token (TokenReview)', () => {
  let api: KubeApiStandIn;
  let clock = START;

  function reviewer(
    overrides: { cacheEntries?: number; cacheSeconds?: number; refusedCacheSeconds?: number; reviewRateLimit?: object; server?: string } = {},
  ): KubernetesAgentTokens {
    const { server, ...agents } = overrides;
    const settings = kubernetesAgentsSchema.parse(agents);
    const configuration = kubernetesApiConfiguration({
      connection: { kind: 'token', server: server ?? api.url, token: api.token, skipTlsVerify: true },
      timeoutMs: 2000,
    });
    return kubernetesAgentTokens(configuration, { ...settings, now: () => clock });
  }

  beforeAll(async () => {
    api = await startKubeApi();
  });
  afterEach(() => {
    clock = START;
    api.verify();
  });
  afterAll(async () => {
    await api.close();
  });

  it('accepts a token the API server authenticates for the controller audience as the agent of the node its pod runs on, and asks once while it is remembered', async () => {
    const tokens = reviewer();
    const token = projectedToken({ bound: { node: 'gpu-a01' } });
    api.load([tokenReview(token, { bound: { node: 'gpu-a01' } })]);
    expect(await tokens.review(token, AGENT_ADDRESS)).toEqual({ role: 'agent', node: 'gpu-a01' });
    clock += 59_000;
    expect(await tokens.review(token, AGENT_ADDRESS)).toEqual({ role: 'agent', node: 'gpu-a01' });
  });

  it('reads the node from the pod the review names when the API server (before 1.30) does not name it, matching the pod by its uid', async () => {
    const tokens = reviewer();
    const bound = { pod: 'steadfast-agent-q9z4w', podUid: 'b1b2b3b4-0000-4000-8000-000000000009' };
    const token = projectedToken({ bound });
    api.load([tokenReview(token, { bound }), podRead(bound.pod, bound.podUid, 'gpu-b07')]);
    expect(await tokens.review(token, AGENT_ADDRESS)).toEqual({ role: 'agent', node: 'gpu-b07' });

    const replaced = projectedToken({ bound });
    api.load([tokenReview(replaced, { bound }), podRead(bound.pod, 'another-uid-0000-4000-8000-000000000010', 'gpu-b07')]);
    await expect(tokens.review(replaced, AGENT_ADDRESS)).rejects.toThrow(
      new TokenRefusedError(`the token's pod steadfast/${bound.pod} was replaced (uid ${bound.podUid} is gone)`),
    );
  });

  it('refuses a token for another audience without asking, one the API server does not authenticate, and one of another service account', async () => {
    const tokens = reviewer();
    const foreign = projectedToken({ audiences: ['https://kubernetes.default.svc.cluster.local'] });
    await expect(tokens.review(foreign, AGENT_ADDRESS)).rejects.toThrow(
      /is for audience "https:\/\/kubernetes.default.svc.cluster.local", not this controller's "steadfast-controller"/,
    );

    const expired = projectedToken();
    api.load([tokenReview(expired, { error: '[invalid bearer token, service account token has expired]' })]);
    await expect(tokens.review(expired, AGENT_ADDRESS)).rejects.toThrow(
      new TokenRefusedError(
        'the Kubernetes API server did not authenticate the service-account token: [invalid bearer token, service account token has expired]',
      ),
    );

    const other = projectedToken();
    api.load([tokenReview(other, { username: 'system:serviceaccount:default:default' })]);
    await expect(tokens.review(other, AGENT_ADDRESS)).rejects.toThrow(
      `the token is "system:serviceaccount:default:default"'s; agents present the service account ${AGENT_USER}'s`,
    );

    const unaware = projectedToken();
    api.load([tokenReview(unaware, { audiences: [] })]);
    await expect(tokens.review(unaware, AGENT_ADDRESS)).rejects.toThrow(
      'the Kubernetes API server authenticated the token but not for audience "steadfast-controller"',
    );
    expect(tokens.cached).toBe(0);
  });

  it('refuses while the API server cannot be reached or refuses the controller, and remembers no failure: the next request is reviewed afresh', async () => {
    const token = projectedToken();
    const down = reviewer({ server: 'http://127.0.0.1:9' });
    const unreachable = await down.review(token, AGENT_ADDRESS).then(
      () => undefined,
      (error: unknown) => error,
    );
    expect(unreachable).toBeInstanceOf(ReviewUnavailableError);
    expect((unreachable as Error).message).toMatch(/^the Kubernetes API server is unreachable, cannot review the token: /);
    expect(down.cached).toBe(0);

    const tokens = reviewer();
    api.load([
      tokenReview(token, {
        status: 403,
        message:
          'tokenreviews.authentication.k8s.io is forbidden: User "system:serviceaccount:steadfast:steadfast-controller" cannot create resource "tokenreviews"',
      }),
    ]);
    await expect(tokens.review(token, AGENT_ADDRESS)).rejects.toThrow(
      /^the controller may not review the token: it lacks the RBAC permission "create tokenreviews.authentication.k8s.io" \(deploy\/kubernetes\/rbac.yaml\); HTTP 403: tokenreviews.authentication.k8s.io is forbidden/,
    );
    api.load([tokenReview(token, { bound: { node: 'gpu-a01' } })]);
    expect(await tokens.review(token, AGENT_ADDRESS)).toEqual({ role: 'agent', node: 'gpu-a01' });
  });

  it('remembers at most cacheEntries tokens, each until the sooner of cacheSeconds and its own expiry', async () => {
    const tokens = reviewer({ cacheEntries: 3, cacheSeconds: 60 });
    const many = ['gpu-a01', 'gpu-a02', 'gpu-a03', 'gpu-a04', 'gpu-a05'].map((node) => ({ node, token: projectedToken({ bound: { node } }) }));
    for (const { node, token } of many) {
      api.load([tokenReview(token, { bound: { node } })]);
      expect(await tokens.review(token, AGENT_ADDRESS)).toEqual({ role: 'agent', node });
      expect(tokens.cached).toBeLessThanOrEqual(3);
    }
    // The newest three are remembered; the first was let go and is asked about again.
    api.verify();
    for (const { token } of many.slice(2)) await tokens.review(token, AGENT_ADDRESS);
    const [first] = many;
    if (!first) throw new Error('no token');
    api.load([tokenReview(first.token, { bound: { node: first.node } })]);
    await tokens.review(first.token, AGENT_ADDRESS);
    api.verify();

    const shortLived = projectedToken({ expiresInSeconds: 10, bound: { node: 'gpu-a09' } });
    api.load([tokenReview(shortLived, { bound: { node: 'gpu-a09' } })]);
    await tokens.review(shortLived, AGENT_ADDRESS);
    clock += 10_000;
    api.load([tokenReview(shortLived, { error: '[invalid bearer token, service account token has expired]' })]);
    await expect(tokens.review(shortLived, AGENT_ADDRESS)).rejects.toThrow(TokenRefusedError);
  });

  it('refuses a token the API server refused again without asking for refusedCacheSeconds, remembering at most cacheEntries refusals', async () => {
    const tokens = reviewer({ cacheEntries: 3, refusedCacheSeconds: 60 });
    const revoked = projectedToken();
    api.load([tokenReview(revoked, { error: '[invalid bearer token, service account token has been invalidated]' })]);
    await expect(tokens.review(revoked, AGENT_ADDRESS)).rejects.toThrow(TokenRefusedError);
    api.verify();
    clock += 59_000;
    await expect(tokens.review(revoked, AGENT_ADDRESS)).rejects.toThrow(
      new TokenRefusedError('the Kubernetes API server refused this token in the last 60 s; not asked again'),
    );
    clock += 1000;
    api.load([tokenReview(revoked, { error: '[invalid bearer token, service account token has been invalidated]' })]);
    await expect(tokens.review(revoked, AGENT_ADDRESS)).rejects.toThrow(/did not authenticate/);
    api.verify();

    for (let index = 0; index < 5; index += 1) {
      const token = projectedToken();
      api.load([tokenReview(token, { error: '[invalid bearer token]' })]);
      await expect(tokens.review(token, AGENT_ADDRESS)).rejects.toThrow(TokenRefusedError);
    }
    expect(tokens.cachedRefusals).toBe(3);
  });

  it('sends unknown tokens of one client for review at reviewRateLimit, but renews a token found good before whatever that client sent', async () => {
    const tokens = reviewer({ cacheSeconds: 0, reviewRateLimit: { requestsPerSecond: 1, burst: 2 } });
    const agent = projectedToken({ bound: { node: 'gpu-a01' } });
    api.load([tokenReview(agent, { bound: { node: 'gpu-a01' } })]);
    expect(await tokens.review(agent, AGENT_ADDRESS)).toEqual({ role: 'agent', node: 'gpu-a01' });
    const stranger = projectedToken();
    api.load([tokenReview(stranger, { error: '[invalid bearer token]' })]);
    await expect(tokens.review(stranger, AGENT_ADDRESS)).rejects.toThrow(TokenRefusedError);
    const limited = await tokens.review(projectedToken(), AGENT_ADDRESS).then(
      () => undefined,
      (error: unknown) => error,
    );
    expect(limited).toBeInstanceOf(ReviewsRateLimitedError);
    expect((limited as ReviewsRateLimitedError).retryAfterSeconds).toBe(1);
    // Another client has its own bucket.
    const elsewhere = projectedToken();
    api.load([tokenReview(elsewhere, { error: '[invalid bearer token]' })]);
    await expect(tokens.review(elsewhere, '10.0.0.8')).rejects.toThrow(TokenRefusedError);
    // The agent's token, found good before, is reviewed again (cacheSeconds 0) past the limit.
    api.load([tokenReview(agent, { bound: { node: 'gpu-a01' } })]);
    expect(await tokens.review(agent, AGENT_ADDRESS)).toEqual({ role: 'agent', node: 'gpu-a01' });
    clock += 1000;
    const later = projectedToken();
    api.load([tokenReview(later, { error: '[invalid bearer token]' })]);
    await expect(tokens.review(later, AGENT_ADDRESS)).rejects.toThrow(TokenRefusedError);
  });

  it("keeps review slots that strangers' tokens cannot take for the kubelet's next token of a pod whose token was found good", async () => {
    const tokens = reviewer({ reviewRateLimit: { requestsPerSecond: 0 } });
    const bound = { node: 'gpu-a05', podUid: 'b1b2b3b4-0000-4000-8000-000000000005' };
    const held: (() => void)[] = [];
    const good = new Set<string>();
    api.reviews(async (token) => {
      if (good.has(token)) return tokenReview(token, { bound }).response;
      await new Promise<void>((resolve) => held.push(resolve));
      return tokenReview(token, { error: '[invalid bearer token]' }).response;
    });
    const first = projectedToken({ bound });
    good.add(first);
    expect(await tokens.review(first, AGENT_ADDRESS)).toEqual({ role: 'agent', node: 'gpu-a05' });

    const strangers = Array.from({ length: 192 }, () => tokens.review(projectedToken(), '10.9.9.9').catch((error: unknown) => error));
    await until(
      '192 reviews of strangers to be held',
      async () => held.length,
      (count) => count === 192,
      10_000,
    );
    await expect(tokens.review(projectedToken(), '10.9.9.9')).rejects.toThrow(
      new ReviewUnavailableError('192 reviews of tokens not seen before are already in progress'),
    );
    // The kubelet rotated the pod's token: a token never seen, naming the same pod.
    const next = projectedToken({ bound });
    good.add(next);
    expect(await tokens.review(next, AGENT_ADDRESS)).toEqual({ role: 'agent', node: 'gpu-a05' });
    // The claim is read unverified: a stranger naming the pod holds one such slot at most.
    const forged = tokens.review(projectedToken({ bound }), '10.9.9.9').catch((error: unknown) => error);
    await until(
      'the forged token of the pod to be held',
      async () => held.length,
      (count) => count === 193,
      10_000,
    );
    await expect(tokens.review(projectedToken({ bound }), '10.9.9.9')).rejects.toThrow(ReviewUnavailableError);
    for (const release of held) release();
    for (const outcome of await Promise.all([...strangers, forged])) expect(outcome).toBeInstanceOf(TokenRefusedError);
  });

  it('keeps a review that two requests wait for while one of them is left, and abandons it once both have gone', async () => {
    const tokens = reviewer();
    const token = projectedToken({ bound: { node: 'gpu-a01' } });
    const pending: { answer: () => void; abandoned: AbortSignal }[] = [];
    api.reviews(
      (reviewed, abandoned) =>
        new Promise((resolve) => pending.push({ answer: () => resolve(tokenReview(reviewed, { bound: { node: 'gpu-a01' } }).response), abandoned })),
    );
    const first = new AbortController();
    const second = new AbortController();
    const firstWait = tokens.review(token, AGENT_ADDRESS, first.signal);
    const secondWait = tokens.review(token, AGENT_ADDRESS, second.signal);
    await until(
      'the review to reach the API server',
      async () => pending.length,
      (count) => count === 1,
      5000,
    );
    first.abort();
    pending[0]?.answer();
    expect(await secondWait).toEqual({ role: 'agent', node: 'gpu-a01' });
    expect(await firstWait).toEqual({ role: 'agent', node: 'gpu-a01' });
    expect(pending[0]?.abandoned.aborted).toBe(false);

    const other = projectedToken({ bound: { node: 'gpu-a02' } });
    const third = new AbortController();
    const fourth = new AbortController();
    const waits = [tokens.review(other, AGENT_ADDRESS, third.signal), tokens.review(other, AGENT_ADDRESS, fourth.signal)].map((wait) =>
      wait.catch((error: unknown) => error),
    );
    await until(
      'the second review to reach the API server',
      async () => pending.length,
      (count) => count === 2,
      5000,
    );
    third.abort();
    fourth.abort();
    await until(
      'the API server to see the review dropped',
      async () => pending[1]?.abandoned.aborted,
      (aborted) => aborted === true,
      5000,
    );
    for (const error of await Promise.all(waits))
      expect(error).toEqual(new ReviewUnavailableError('the token review was abandoned: every request waiting for it went away'));
  });

  it('is configured under controller.auth.kubernetesAgents, each field validated with its name', () => {
    const base = { redis: { url: 'redis://127.0.0.1:6379' } };
    const parsed = configSchema.parse({ ...base, controller: { auth: { kubernetesAgents: {} } } });
    expect(parsed.controller.auth.kubernetesAgents).toEqual({
      audience: AUDIENCE,
      namespace: 'steadfast',
      serviceAccount: 'steadfast-agent',
      cacheSeconds: 60,
      cacheEntries: 20_000,
      refusedCacheSeconds: 60,
      reviewRateLimit: { requestsPerSecond: 1, burst: 10 },
    });
    const wrong = configSchema.safeParse({
      ...base,
      controller: {
        auth: { kubernetesAgents: { namespace: 'Steadfast', cacheSeconds: 3600, refusedCacheSeconds: -1, reviewRateLimit: { burst: 0 }, role: 'x' } },
      },
    });
    const issues = wrong.error?.issues.map((issue) => `${issue.path.join('.')}: ${issue.message}`) ?? [];
    expect(issues).toEqual(
      expect.arrayContaining([
        'controller.auth.kubernetesAgents.namespace: must be a namespace name (lower-case letters, digits and "-", at most 63)',
        expect.stringMatching(/^controller\.auth\.kubernetesAgents\.cacheSeconds: /),
        expect.stringMatching(/^controller\.auth\.kubernetesAgents\.refusedCacheSeconds: /),
        expect.stringMatching(/^controller\.auth\.kubernetesAgents\.reviewRateLimit\.burst: /),
        expect.stringMatching(/^controller\.auth\.kubernetesAgents: Unrecognized key: "role"/),
      ]),
    );
  });
});

/**
 * The same check on the controller's intake: an agent's fast-path report is taken for its pod's
 * node and refused for any other, and a report whose token cannot be reviewed is refused with 503
 * (the agent retries it) instead of being let through.
 */
describe('the controller intake with agents on Kubernetes', () => {
  const store = testRedis();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-k8s-agents-'));
  let api: KubeApiStandIn;
  let controller: Controller;
  let url: string;

  beforeAll(async () => {
    const served = await startKubeApiOverTls(root);
    api = served.api;
    const { caFile, tokenFile } = served;
    const config = testConfig(store.url, store.prefix, {
      controller: { auth: { operatorToken: TEST_TOKEN, kubernetesAgents: {} } },
      backend: { kind: 'dry-run', kubernetes: { connection: 'token', server: api.url, tokenFile, caFile } },
    });
    ({ controller, url } = await startController(config, { workers: false }));
  });
  afterAll(async () => {
    await controller?.close();
    await api?.close();
    await store.cleanup();
    rmSync(root, { recursive: true, force: true });
  });

  it('takes a fast-path report from the agent of the pod node, refuses one about another node, and answers 503 while the API server fails', async () => {
    const xid = (node: string): object => ({ kind: 'xid', node, gpu: '0000:3b:00', xid: 79, time: new Date().toISOString() });
    const token = projectedToken({ bound: { node: 'gpu-a01' } });
    api.load([tokenReview(token, { bound: { node: 'gpu-a01' } })]);
    expect((await post(`${url}/api/v1/signals`, xid('gpu-a01'), token)).status).toBe(202);
    const other = await post(`${url}/api/v1/signals`, xid('gpu-b07'), token);
    expect(other.status).toBe(403);
    expect(other.body.error).toBe('agent gpu-a01 may not report a fault about node gpu-b07: its credential is bound to gpu-a01');
    api.verify();

    const fresh = projectedToken({ bound: { node: 'gpu-a02' } });
    api.load([tokenReview(fresh, { status: 500, message: 'etcdserver: request timed out' })]);
    const failing = await post(`${url}/api/v1/signals`, xid('gpu-a02'), fresh);
    expect(failing.status).toBe(503);
    expect(failing.headers.get('retry-after')).toBe('5');
    // What the API server said goes to the controller's log, not to a sender that has shown no credential yet.
    expect(failing.body.error).toBe('credentials could not be checked now; retry later');
    api.verify();

    const refused = await post(`${url}/api/v1/signals`, xid('gpu-a01'), projectedToken({ audiences: ['vault'] }));
    expect(refused.status).toBe(401);
    expect(refused.body.error).toBe('invalid bearer token');
  });
});

/** The agent's side: --controller.kubernetes-token-file is read at every request, as the kubelet rotates the token under it. */
describe('an agent with --controller.kubernetes-token-file', () => {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-k8s-agent-token-'));
  afterAll(() => rmSync(root, { recursive: true, force: true }));

  function settings(argv: string[]): ReturnType<typeof agentSettingsFromFlags> {
    const command = agentCommand({ env: {}, logger: silentLogger() });
    command.parseOptions(['--web.insecure', '--node', 'gpu-a01', '--controller.url', 'http://controller:9400', ...argv]);
    return agentSettingsFromFlags(command.opts(), {});
  }

  it('sends the token the file holds at each request, and refuses to start without the file or beside --controller.token-file', async () => {
    const file = join(root, 'token');
    // The kubelet swaps the projected volume's files atomically; a rename does the same.
    const rotate = (token: string): void => {
      writeFileSync(`${file}.new`, token);
      renameSync(`${file}.new`, file);
    };
    const first = projectedToken({ bound: { node: 'gpu-a01' } });
    rotate(first);
    const token = settings([`--controller.kubernetes-token-file=${file}`]).controllerToken as TokenSource;
    expect(typeof token).toBe('function');

    const seen: string[] = [];
    const server = createServer((request, response) => {
      seen.push(request.headers.authorization ?? '');
      request.resume();
      request.on('end', () => response.writeHead(202, { 'content-type': 'application/json' }).end('{"accepted":1}'));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const client = createFastPathClient({
      controllerUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
      token,
      registry: new Registry(),
      logger: silentLogger(),
    });
    try {
      const xid = {
        kind: 'xid' as const,
        node: 'gpu-a01',
        gpu: '0000:3b:00',
        xid: 79,
        message: 'NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.',
        time: new Date().toISOString(),
      };
      client.send(xid);
      await client.drained();
      const second = projectedToken({ bound: { node: 'gpu-a01' } });
      rotate(second);
      client.send({ ...xid, xid: 48 });
      await client.drained();
      expect(seen).toEqual([`Bearer ${first}`, `Bearer ${second}`]);
    } finally {
      await client.close();
      server.close();
    }

    expect(() => settings([`--controller.kubernetes-token-file=${join(root, 'missing')}`])).toThrow(
      /--controller.kubernetes-token-file: cannot read token file/,
    );
    expect(() => settings([`--controller.kubernetes-token-file=${file}`, `--controller.token-file=${file}`])).toThrow(InputError);
    expect(() => settings([`--controller.kubernetes-token-file=${file}`, `--controller.token-file=${file}`])).toThrow(
      '--controller.kubernetes-token-file: give it or --controller.token-file, not both',
    );
  });
});
