import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { agentCommand, agentSettingsFromFlags } from '../../cli/agent.js';
import { agentTokenFor } from '../../core/credentials.js';
import { InputError } from '../../core/errors.js';
import { silentLogger } from '../../core/log.js';
import { createAgent, type Agent, type AgentOptions } from '../../agent/agent.js';
import { DIAGNOSE_CONFIG_FLAG, diagnoseCollectorFactory } from '../../agent/collectors/diagnose.js';
import { PY_SPY_FLAG, processCollectorFactory } from '../../agent/collectors/process.js';
import { trainingCollectorFactory } from '../../agent/collectors/training/collector.js';
import { writeTorchrunProcfs } from '../agent/fake-procfs.js';
import { FIXTURES } from '../agent/helpers.js';
import { runCli } from '../support/cli.js';

/**
 * The node agent's HTTP edge: its POST endpoints (training push, trace, diagnose) need the
 * token when one is set, read at most 1 MiB, are rate limited per client, and no request line
 * can take the agent down. Metrics and health stay open for Prometheus.
 */

const TOKEN = 'agent-edge-token-0123456789';
const POST_ROUTES = ['/api/v1/training', '/api/v1/trace', '/api/v1/diagnose'] as const;
const STEP = { job: 'gpt', rank: 0, iteration: 10, loss: 2.5 };

let dir: string;
const agents: Agent[] = [];

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'steadfast-agent-edge-'));
  writeTorchrunProcfs(join(dir, 'proc'));
  writeFileSync(join(dir, 'diagnostics.json'), JSON.stringify({ checks: [{ name: 'quick', command: ['true'], timeoutSeconds: 5 }] }));
});
afterEach(async () => {
  await Promise.all(agents.splice(0).map((agent) => agent.close()));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

async function startAgent(options: Partial<AgentOptions> = {}): Promise<string> {
  const agent = createAgent({
    node: 'edge-node',
    listen: { host: '127.0.0.1', port: 0 },
    paths: { sysfs: join(dir, 'sys'), procfs: join(dir, 'proc'), kmsg: join(dir, 'kmsg'), nvidiaSmi: '/nonexistent/nvidia-smi' },
    pollIntervalSeconds: 60,
    collectors: [trainingCollectorFactory, processCollectorFactory, diagnoseCollectorFactory],
    settings: { [PY_SPY_FLAG]: join(FIXTURES, 'exporters', 'fake-py-spy.sh'), [DIAGNOSE_CONFIG_FLAG]: join(dir, 'diagnostics.json') },
    logger: silentLogger(),
    ...options,
  });
  agents.push(agent);
  const { port } = await agent.start();
  return `http://127.0.0.1:${port}`;
}

async function post(url: string, body: string, authorization?: string): Promise<{ status: number; headers: Headers; body: Record<string, unknown> }> {
  const response = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(authorization === undefined ? {} : { authorization }) },
    body,
  });
  return { status: response.status, headers: response.headers, body: (await response.json()) as Record<string, unknown> };
}

/** Sends raw bytes and returns what came back before the agent closed the connection. */
function raw(port: number, request: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let received = '';
    const socket = connect(port, '127.0.0.1', () => socket.write(request));
    socket.setEncoding('latin1');
    socket.setTimeout(5000, () => socket.destroy(new Error('no answer within 5 s')));
    socket.on('data', (chunk: string) => (received += chunk));
    // The agent may close while the request is still being written; what it answered before counts.
    socket.on('error', (error) => (received === '' ? reject(error) : resolve(received)));
    socket.on('close', () => resolve(received));
  });
}

describe('agent edge', () => {
  it('answers every POST endpoint with 401 for a missing, wrong or near-miss token when it has one, and takes the right token', async () => {
    const base = await startAgent({ apiToken: TOKEN, rateLimit: { requestsPerSecond: 0, burst: 1 } });
    const wrong = [undefined, '', 'Bearer', `Bearer ${TOKEN.slice(0, -1)}`, `Bearer ${TOKEN}x`, TOKEN, `Basic ${Buffer.from(`x:${TOKEN}`).toString('base64')}`];
    for (const path of POST_ROUTES) {
      for (const authorization of wrong) {
        const answer = await post(`${base}${path}`, JSON.stringify(STEP), authorization);
        expect(answer.status, `${path} with ${JSON.stringify(authorization)}`).toBe(401);
        expect(answer.headers.get('www-authenticate')).toMatch(/^Bearer realm=/);
        expect(typeof answer.body.error).toBe('string');
      }
    }
    expect((await post(`${base}/api/v1/training`, JSON.stringify(STEP), `Bearer ${TOKEN}`)).status).toBe(202);
    expect((await post(`${base}/api/v1/trace`, JSON.stringify({ timeoutSeconds: 5 }), `bearer ${TOKEN}`)).status).toBe(200);
    expect((await post(`${base}/api/v1/diagnose`, '{}', `Bearer ${TOKEN}`)).status).toBe(200);
    // Prometheus scrapes without a token.
    expect((await fetch(`${base}/metrics`)).status).toBe(200);
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
  });

  it('refuses an empty token rather than treating it as "no header needed"', () => {
    expect(() =>
      createAgent({
        node: 'n',
        paths: { sysfs: '/x', procfs: '/x', kmsg: '/x', nvidiaSmi: '/x' },
        pollIntervalSeconds: 60,
        collectors: [],
        apiToken: ' ',
        logger: silentLogger(),
      }),
    ).toThrow(/apiToken must not be empty/);
  });

  it('warns at start when its POST endpoints are open because no token was given', async () => {
    const lines: string[] = [];
    const sink = new Writable({ write: (chunk: Buffer, _encoding, done) => (lines.push(chunk.toString()), done()) });
    await startAgent({ logger: pino({ level: 'warn' }, sink) });
    const warning = lines.map((line) => JSON.parse(line) as { msg: string; endpoints?: string[] }).find((entry) => /without a token/.test(entry.msg));
    expect(warning?.endpoints).toEqual(expect.arrayContaining([...POST_ROUTES]));
  });

  it('answers a body over 1 MiB with a JSON 413 and closes the connection, whether declared up front or streamed', async () => {
    const base = await startAgent({ rateLimit: { requestsPerSecond: 0, burst: 1 } });
    const { port } = new URL(base);
    // Streamed (chunked, no length given): refused once the bytes read pass the limit.
    const big = JSON.stringify({ ...STEP, padding: 'x'.repeat(1024 * 1024) });
    const streamed = await raw(
      Number(port),
      `POST /api/v1/training HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n${big.length.toString(16)}\r\n${big}\r\n0\r\n\r\n`,
    );
    expect(streamed).toMatch(/^HTTP\/1\.1 413 /);
    expect(streamed).toMatch(/\r\nconnection: close\r\n/i);
    expect(streamed).toContain('{"error":"request body larger than 1048576 bytes"}');

    // Declared too large: refused before any of it is read.
    const declared = await raw(
      Number(port),
      `POST /api/v1/training HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${64 * 1024 * 1024}\r\n\r\n{`,
    );
    expect(declared).toMatch(/^HTTP\/1\.1 413 /);
    expect(declared).toContain('request body larger than 1048576 bytes');
  });

  it('rate limits each client on the POST endpoints, before checking its token, with 429 and Retry-After; scrapes are not limited', async () => {
    const base = await startAgent({ apiToken: TOKEN, rateLimit: { requestsPerSecond: 0.5, burst: 2 } });
    expect((await post(`${base}/api/v1/training`, JSON.stringify(STEP), 'Bearer guess')).status).toBe(401);
    expect((await post(`${base}/api/v1/training`, JSON.stringify(STEP), `Bearer ${TOKEN}`)).status).toBe(202);
    for (const path of POST_ROUTES) {
      const limited = await post(`${base}${path}`, JSON.stringify(STEP), `Bearer ${TOKEN}`);
      expect(limited.status, path).toBe(429);
      expect(Number(limited.headers.get('retry-after'))).toBe(2);
      expect(limited.body.error).toMatch(/^too many requests from this client/);
    }
    for (let index = 0; index < 5; index += 1) expect((await fetch(`${base}/metrics`)).status).toBe(200);
  });

  it('answers a request target that is not a valid URL with a JSON 400 and keeps running', async () => {
    const base = await startAgent();
    const { port } = new URL(base);
    for (const target of ['http://a:b/', 'http://[::1/', '//a:99999/', 'http://%zz/']) {
      const answer = await raw(Number(port), `GET ${target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
      expect(answer, target).toMatch(/^HTTP\/1\.1 400 /);
      expect(answer, target).toContain('{"error":"request target is not a valid URL"}');
    }
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
  });

  it('takes its rate limit from --web.rate-limit and --web.rate-burst, and refuses bad values naming the flag', () => {
    const flags = (argv: string[]): Record<string, unknown> => {
      const command = agentCommand({ env: {}, logger: silentLogger() });
      command.parseOptions(argv);
      return command.opts();
    };
    expect(agentSettingsFromFlags(flags(['--web.insecure']), {}).rateLimit).toEqual({ requestsPerSecond: 100, burst: 200 });
    expect(agentSettingsFromFlags(flags(['--web.insecure', '--web.rate-limit', '2.5', '--web.rate-burst', '7']), {}).rateLimit).toEqual({
      requestsPerSecond: 2.5,
      burst: 7,
    });
    expect(agentSettingsFromFlags(flags(['--web.insecure', '--web.rate-limit', '0']), {}).rateLimit?.requestsPerSecond).toBe(0);
    expect(() => agentSettingsFromFlags(flags(['--web.insecure', '--web.rate-burst', '0']), {})).toThrow(InputError);
    expect(() => agentSettingsFromFlags(flags(['--web.insecure', '--web.rate-limit', 'lots']), {})).toThrow(/--web\.rate-limit/);
  });
});

describe('agent collector flags', () => {
  const flags = (argv: string[]): Record<string, unknown> => {
    const command = agentCommand({ env: {}, logger: silentLogger() });
    command.parseOptions(argv);
    return command.opts();
  };
  const enabled = (argv: string[]): string[] => agentSettingsFromFlags(flags(['--web.insecure', ...argv]), {}).collectors.map((factory) => factory.name);

  it('turns each collector on and off by its flag, a hyphenated name (gpu-reset) included', () => {
    expect(enabled([])).not.toContain('gpu-reset');
    expect(enabled(['--collector.gpu-reset'])).toContain('gpu-reset');
    expect(enabled(['--no-collector.gpu'])).not.toContain('gpu');
    expect(enabled(['--collector.diagnose', '--no-collector.nvlink'])).toEqual(expect.arrayContaining(['diagnose']));
    expect(enabled(['--collector.diagnose', '--no-collector.nvlink'])).not.toContain('nvlink');
  });
});

describe('agent credentials', () => {
  const dir = mkdtempSync(join(tmpdir(), 'steadfast-agent-cred-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const flags = (argv: string[]): Record<string, unknown> => {
    const command = agentCommand({ env: {}, logger: silentLogger() });
    command.parseOptions(argv);
    return command.opts();
  };
  const file = (name: string, text: string): string => {
    const path = join(dir, name);
    writeFileSync(path, `${text}\n`);
    return path;
  };

  it('refuses to start with its POST endpoints open unless told --web.insecure, naming both flags', async () => {
    expect(() => agentSettingsFromFlags(flags([]), {})).toThrow(
      /--web\.token-file: the agent's POST endpoints .* need a token; give --web\.token-file FILE, or --web\.insecure/,
    );
    const run = await runCli(agentCommand({ env: {}, logger: silentLogger() }), ['--web.listen-address', '127.0.0.1:0', '--no-collector.gpu']);
    expect(run.exitCode).toBe(2);
    expect(run.stderr).toMatch(/--web\.token-file: .*--web\.insecure/);
    expect(agentSettingsFromFlags(flags(['--web.token-file', file('web', TOKEN)]), {}).apiToken).toBe(TOKEN);
    expect(agentSettingsFromFlags(flags(['--web.insecure']), {}).apiToken).toBeUndefined();
    expect(() => agentSettingsFromFlags(flags(['--web.insecure', '--web.token-file', file('web2', TOKEN)]), {})).toThrow(/not both/);
  });

  it("takes only its own node's agent token for the controller, and says whose token it was given", () => {
    const secret = 'agent-secret-0123456789abcdef0123456789';
    const own = file('own', agentTokenFor(secret, 'node-1'));
    const other = file('other', agentTokenFor(secret, 'node-2'));
    const base = ['--web.insecure', '--node', 'node-1', '--controller.url', 'http://controller:9400'];
    expect(agentSettingsFromFlags(flags([...base, '--controller.token-file', own]), {}).controllerToken).toBe(agentTokenFor(secret, 'node-1'));
    expect(() => agentSettingsFromFlags(flags([...base, '--controller.token-file', other]), {})).toThrow(
      /the token is node node-2's, but this agent runs as --node node-1/,
    );
    expect(() => agentSettingsFromFlags(flags([...base, '--controller.token-file', file('static', 'an-operator-token-0123456789')]), {})).toThrow(
      /not an agent token/,
    );
  });
});
