import { mkdtempSync, rmSync } from 'node:fs';
import { request } from 'node:http';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { agentCommand, agentSettingsFromFlags } from '../../cli/agent.js';
import { InputError } from '../../core/errors.js';
import { silentLogger } from '../../core/log.js';
import { DEFAULT_AGENT_CONNECTIONS, createAgent, type Agent, type AgentOptions } from '../../agent/agent.js';
import { trainingCollectorFactory } from '../../agent/collectors/training/collector.js';
import { until } from '../support/until.js';

/**
 * What one client can hold of the node agent's HTTP server before it sends a request: its
 * connections beyond the per-address cap are closed as they open, and a connection that never
 * finishes its headers is cut at the headers timeout, while Prometheus (another address) is
 * still served.
 */

let dir: string;
const agents: Agent[] = [];
const sockets: Socket[] = [];

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'steadfast-agent-connections-'));
});
afterEach(async () => {
  for (const socket of sockets.splice(0)) socket.destroy();
  await Promise.all(agents.splice(0).map((agent) => agent.close()));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

async function startAgent(options: Partial<AgentOptions> = {}): Promise<number> {
  const agent = createAgent({
    node: 'edge-node',
    listen: { host: '127.0.0.1', port: 0 },
    paths: { sysfs: join(dir, 'sys'), procfs: join(dir, 'proc'), kmsg: join(dir, 'kmsg'), nvidiaSmi: '/nonexistent/nvidia-smi' },
    pollIntervalSeconds: 60,
    collectors: [trainingCollectorFactory],
    logger: silentLogger(),
    ...options,
  });
  agents.push(agent);
  return (await agent.start()).port;
}

/** A connection that sends half a request's headers and then nothing: what a slow-headers attacker holds. */
function halfOpen(port: number): Promise<{ socket: Socket; closed: () => boolean; said: () => string }> {
  return new Promise((resolve, reject) => {
    let closed = false;
    let said = '';
    const socket = connect({ port, host: '127.0.0.1' }, () => {
      socket.write('GET /metrics HTTP/1.1\r\nHost: agent\r\n');
      resolve({ socket, closed: () => closed, said: () => said });
    });
    sockets.push(socket);
    // Read what the agent sends, so that its closing is seen.
    socket.on('data', (chunk: Buffer) => (said += chunk.toString('latin1')));
    socket.on('error', () => undefined);
    socket.on('close', () => (closed = true));
    socket.once('error', reject);
  });
}

/** GET /metrics from another loopback address, as Prometheus on another host would scrape. */
function scrapeFrom(localAddress: string, port: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path: '/metrics', localAddress, agent: false }, (response) => {
      response.resume();
      response.on('end', () => resolve(response.statusCode ?? 0));
    });
    req.setTimeout(5000, () => req.destroy(new Error('scrape not answered within 5 s')));
    req.on('error', reject);
    req.end();
  });
}

describe('the node agent under many idle connections', () => {
  it('closes the connections one client address opens beyond its cap at once, and still answers a scrape from another address', async () => {
    const port = await startAgent({ connections: { ...DEFAULT_AGENT_CONNECTIONS, maxPerClient: 4 } });
    const held: Awaited<ReturnType<typeof halfOpen>>[] = [];
    for (let index = 0; index < 10; index += 1) held.push(await halfOpen(port));
    // The six past the cap are closed as they open; the first four are held until their headers time out (10 s).
    await until(
      'the connections past the cap to be closed',
      async () => held.filter((connection) => connection.closed()).length,
      (count) => count >= 6,
      5000,
    );
    expect(held.slice(0, 4).map((connection) => connection.closed())).toEqual([false, false, false, false]);
    expect(held.slice(4).map((connection) => connection.closed())).toEqual(Array(6).fill(true));
    expect(held.slice(4).map((connection) => connection.said())).toEqual(Array(6).fill(''));
    expect(await scrapeFrom('127.0.0.2', port)).toBe(200);

    // Once the client lets its connections go, it is served again.
    for (const connection of held) connection.socket.destroy();
    await until(
      'a scrape from the first address to be answered again',
      () => scrapeFrom('127.0.0.1', port).catch(() => 0),
      (status) => status === 200,
      5000,
    );
  });

  it('cuts a connection that has not sent its headers within the headers timeout', async () => {
    const port = await startAgent({ connections: { headersTimeoutSeconds: 1, requestTimeoutSeconds: 1, maxPerClient: 4 } });
    const slow = await halfOpen(port);
    // Node checks the timeout every second: cut within about two; without the bound, a minute and a half.
    await until(
      'the half-open connection to be cut',
      async () => slow.closed(),
      (closed) => closed,
      6000,
    );
    expect(slow.said()).toMatch(/^HTTP\/1\.1 408 /);
    expect(await scrapeFrom('127.0.0.1', port)).toBe(200);
  });

  it('holds at most 32 connections per client and cuts slow headers after 10 s by default; --web.max-connections-per-client sets the cap, named when wrong', () => {
    expect(DEFAULT_AGENT_CONNECTIONS).toEqual({ headersTimeoutSeconds: 10, requestTimeoutSeconds: 30, maxPerClient: 32 });
    const flags = (argv: string[]): Record<string, unknown> => {
      const command = agentCommand({ env: {}, logger: silentLogger() });
      command.parseOptions(argv);
      return command.opts();
    };
    expect(agentSettingsFromFlags(flags(['--web.insecure']), {}).connections).toEqual(DEFAULT_AGENT_CONNECTIONS);
    expect(agentSettingsFromFlags(flags(['--web.insecure', '--web.max-connections-per-client', '0']), {}).connections?.maxPerClient).toBe(0);
    expect(() => agentSettingsFromFlags(flags(['--web.insecure', '--web.max-connections-per-client', '-1']), {})).toThrow(InputError);
    expect(() => agentSettingsFromFlags(flags(['--web.insecure', '--web.max-connections-per-client', 'many']), {})).toThrow(
      /--web\.max-connections-per-client: must be a whole number/,
    );
  });
});
