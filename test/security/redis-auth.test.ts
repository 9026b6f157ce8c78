import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { RedisOptions } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { configSchema, loadConfig } from '../../core/config.js';
import { signalBatchId } from '../../core/queues.js';
import { InputError } from '../../core/errors.js';
import { silentLogger } from '../../core/log.js';
import { describeRedis, intakeConnection, redactedRedisUrl, redisConnectionOptions, workerConnection, type RedisSettings } from '../../core/redis.js';
import { Controller } from '../../controller/service.js';
import { ProcessGroup, freePort, waitFor } from '../../tryit/processes.js';
import { TEST_TOKEN, post } from '../support/controller.js';

/**
 * Redis behind a password and behind TLS: the URL may carry the password
 * (redis://:secret@host) or `redis.passwordFile` may hold it, a rediss:// URL with
 * `redis.tls.caFile` verifies the server against a private CA, and a wrong or missing secret
 * fails instead of connecting. Each case runs its own redis-server; the shared one of the test
 * setup serves the plain URL case.
 */

const run = promisify(execFile);
/** Characters a URL would need escaped: the password must survive the trip through the file. */
const PASSWORD = 'p@ss:w/rd%41 #';

/** PING through a fresh connection made from `settings`; the answer, or the error's message. */
async function ping(settings: RedisSettings | string, extra: RedisOptions = {}): Promise<string> {
  const redis = workerConnection(settings, { lazyConnect: true, maxRetriesPerRequest: 1, retryStrategy: () => null, connectTimeout: 3000, ...extra });
  redis.on('error', () => undefined);
  try {
    await redis.connect();
    return await redis.ping();
  } catch (error) {
    return `failed: ${error instanceof Error ? error.message : String(error)}`;
  } finally {
    redis.disconnect();
  }
}

let root: string;
const group = new ProcessGroup();

beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), 'steadfast-redis-auth-'));
});
afterAll(async () => {
  await group.stopAll();
  rmSync(root, { recursive: true, force: true });
});

async function startRedisServer(name: string, args: readonly string[], cliArgs: readonly string[]): Promise<void> {
  const dir = join(root, name);
  mkdirSync(dir, { recursive: true });
  group.start(name, 'redis-server', ['--bind', '127.0.0.1', '--dir', dir, '--save', '', '--appendonly', 'no', ...args], join(dir, 'redis.log'));
  await waitFor(`${name} to answer PING`, async () => (await run('redis-cli', [...cliArgs, '--no-auth-warning', 'ping'])).stdout.trim() === 'PONG');
}

function secretFile(name: string, content: string): string {
  const path = join(root, name);
  writeFileSync(path, content, { mode: 0o600 });
  return path;
}

describe('Redis with a password', () => {
  let port: number;

  beforeAll(async () => {
    port = await freePort();
    await startRedisServer('redis-password', ['--port', String(port), '--requirepass', PASSWORD], ['-p', String(port), '-a', PASSWORD]);
  });

  it('connects with the password in the URL, percent-encoded, with or without the default user', async () => {
    const encoded = encodeURIComponent(PASSWORD);
    expect(await ping(`redis://:${encoded}@127.0.0.1:${port}`)).toBe('PONG');
    expect(await ping({ url: `redis://default:${encoded}@127.0.0.1:${port}` })).toBe('PONG');
  });

  it('connects with the password from passwordFile (trailing newline dropped), also when the URL names the user', async () => {
    const passwordFile = secretFile('redis-password.txt', `${PASSWORD}\n`);
    expect(await ping({ url: `redis://127.0.0.1:${port}`, passwordFile })).toBe('PONG');
    expect(await ping({ url: `redis://default@127.0.0.1:${port}`, passwordFile })).toBe('PONG');
  });

  it('does not get in without the password or with a wrong one, and the intake connection reports Redis down', async () => {
    expect(await ping(`redis://127.0.0.1:${port}`)).toMatch(/^failed/);
    expect(await ping(`redis://:wrong-password@127.0.0.1:${port}`)).toMatch(/^failed/);
    expect(await ping({ url: `redis://127.0.0.1:${port}`, passwordFile: secretFile('wrong.txt', 'wrong\n') })).toMatch(/^failed/);
    const intake = intakeConnection(`redis://127.0.0.1:${port}`, { retryStrategy: () => null });
    intake.on('error', () => undefined);
    await expect(intake.ping()).rejects.toThrow();
    intake.disconnect();
  });

  it('refuses a missing or empty password file with an InputError naming redis.passwordFile, before connecting', () => {
    expect(() => workerConnection({ url: `redis://127.0.0.1:${port}`, passwordFile: join(root, 'no-such-file') })).toThrow(InputError);
    expect(() => workerConnection({ url: `redis://127.0.0.1:${port}`, passwordFile: join(root, 'no-such-file') })).toThrow(/redis\.passwordFile/);
    expect(() => workerConnection({ url: `redis://127.0.0.1:${port}`, passwordFile: secretFile('empty.txt', '\n') })).toThrow(/is empty/);
  });

  it('runs the controller against it from the config: a signal posted is stored behind the password', async () => {
    const passwordFile = secretFile('controller-redis-password.txt', `${PASSWORD}\n`);
    const config = configSchema.parse({
      redis: { url: `redis://127.0.0.1:${port}`, passwordFile, prefix: 'secured' },
      controller: { host: '127.0.0.1', port: 0, metrics: { port: 0 }, auth: { operatorToken: TEST_TOKEN } },
    });
    const controller = new Controller({ config, logger: silentLogger(), workers: false });
    try {
      const { port: httpPort } = await controller.start();
      const url = `http://127.0.0.1:${httpPort}`;
      expect((await fetch(`${url}/healthz`)).status).toBe(200);
      const accepted = await post(`${url}/api/v1/signals`, { kind: 'xid', node: 'n01', gpu: '0000:3b:00', xid: 79, time: new Date().toISOString() });
      expect(accepted.status).toBe(202);
      // The signal's job (a batch: core/queues.ts), read with the password.
      const { stdout } = await run('redis-cli', [
        '-p',
        String(port),
        '-a',
        PASSWORD,
        '--no-auth-warning',
        'hget',
        `secured:signals:${signalBatchId([{ id: accepted.body.ids?.[0] ?? '' }])}`,
        'data',
      ]);
      expect(stdout).toContain(accepted.body.ids?.[0] ?? 'no id');
    } finally {
      await controller.close();
    }
  });
});

describe('Redis over TLS', () => {
  let port: number;
  let caFile: string;

  beforeAll(async () => {
    const dir = join(root, 'tls');
    mkdirSync(dir, { recursive: true });
    caFile = join(dir, 'ca.crt');
    const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
    await run('openssl', ['req', '-x509', ...ec, '-keyout', join(dir, 'ca.key'), '-out', caFile, '-days', '2', '-subj', '/CN=steadfast-test-ca']);
    await run('openssl', ['req', ...ec, '-keyout', join(dir, 'server.key'), '-out', join(dir, 'server.csr'), '-subj', '/CN=127.0.0.1']);
    writeFileSync(join(dir, 'san.cnf'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n');
    await run('openssl', [
      'x509',
      '-req',
      '-in',
      join(dir, 'server.csr'),
      '-CA',
      caFile,
      '-CAkey',
      join(dir, 'ca.key'),
      '-CAcreateserial',
      '-out',
      join(dir, 'server.crt'),
      '-days',
      '2',
      '-extfile',
      join(dir, 'san.cnf'),
    ]);
    port = await freePort();
    await startRedisServer(
      'redis-tls',
      [
        '--port',
        '0',
        '--tls-port',
        String(port),
        '--tls-cert-file',
        join(dir, 'server.crt'),
        '--tls-key-file',
        join(dir, 'server.key'),
        '--tls-ca-cert-file',
        caFile,
        '--tls-auth-clients',
        'no',
        '--requirepass',
        PASSWORD,
      ],
      ['--tls', '--cacert', caFile, '-p', String(port), '-a', PASSWORD],
    );
  });

  it('connects to rediss:// with the password and the private CA from tls.caFile', async () => {
    const passwordFile = secretFile('tls-password.txt', PASSWORD);
    expect(await ping({ url: `rediss://127.0.0.1:${port}`, passwordFile, tls: { caFile } })).toBe('PONG');
  });

  it('refuses a server its CA did not sign, and a plain connection to the TLS port gets nowhere', async () => {
    const passwordFile = secretFile('tls-password-2.txt', PASSWORD);
    // The system CAs do not know the test CA.
    expect(await ping({ url: `rediss://127.0.0.1:${port}`, passwordFile })).toMatch(/^failed/);
    expect(await ping({ url: `redis://127.0.0.1:${port}`, passwordFile }, { connectTimeout: 1000 })).toMatch(/^failed/);
  });

  it('names redis.tls.caFile when the CA file cannot be read', () => {
    expect(() => workerConnection({ url: `rediss://127.0.0.1:${port}`, tls: { caFile: join(root, 'missing-ca.crt') } })).toThrow(/redis\.tls\.caFile/);
  });
});

describe('Redis settings', () => {
  it('connects to the shared test Redis from a plain URL, as before', async () => {
    expect(await ping({ url: inject('redisUrl') })).toBe('PONG');
  });

  it('validates the redis section: a real URL, one place for the password, TLS settings only with rediss://', () => {
    expect(
      loadConfig({
        env: {
          STEADFAST_REDIS__PASSWORD_FILE: '/etc/steadfast/redis-password',
          STEADFAST_REDIS__TLS__CA_FILE: '/etc/ca.pem',
          STEADFAST_REDIS__URL: 'rediss://redis:6380',
        },
      }).redis,
    ).toEqual({
      url: 'rediss://redis:6380',
      prefix: 'steadfast',
      passwordFile: '/etc/steadfast/redis-password',
      tls: { caFile: '/etc/ca.pem' },
      minReplicasAcked: 0,
      replicaAckTimeoutMs: 1000,
      retentionBudgetMB: 1024,
    });
    expect(() => loadConfig({ env: { STEADFAST_REDIS__URL: 'redis://:secret@redis:6379', STEADFAST_REDIS__PASSWORD_FILE: '/x' } })).toThrow(
      /redis\.passwordFile: give the password in the URL or in passwordFile, not both/,
    );
    expect(() => loadConfig({ env: { STEADFAST_REDIS__TLS__CA_FILE: '/etc/ca.pem' } })).toThrow(/redis\.tls: tls settings need a rediss:\/\/ URL/);
    expect(() => loadConfig({ env: { STEADFAST_REDIS__URL: 'redis://[::1' } })).toThrow(/redis\.url: is not a valid URL/);
    expect(() => loadConfig({ env: { STEADFAST_REDIS__URL: 'http://redis:6379' } })).toThrow(/redis\.url/);
  });

  it('validates sentinels: they need the master group name, and their password file needs them', () => {
    const configFile = join(root, 'sentinel.yaml');
    const write = (redis: object): string => {
      writeFileSync(configFile, JSON.stringify({ redis }));
      return configFile;
    };
    expect(() => loadConfig({ file: write({ sentinels: [{ host: 'a', port: 26379 }] }), env: {} })).toThrow(/redis\.name: sentinels and name go together/);
    expect(() => loadConfig({ file: write({ name: 'mymaster' }), env: {} })).toThrow(/redis\.name: sentinels and name go together/);
    expect(() => loadConfig({ file: write({ sentinelPasswordFile: '/x' }), env: {} })).toThrow(
      /redis\.sentinelPasswordFile: sentinelPasswordFile needs sentinels/,
    );
    expect(() => loadConfig({ file: write({ sentinels: [{ host: 'a', port: 0 }], name: 'm' }), env: {} })).toThrow(
      /redis\.sentinels\.0\.port: must be a port number/,
    );
    expect(() => loadConfig({ file: write({ sentinels: [], name: 'm' }), env: {} })).toThrow(/redis\.sentinels/);
    expect(() => loadConfig({ file: write({ minReplicasAcked: -1 }), env: {} })).toThrow(/redis\.minReplicasAcked/);

    const config = loadConfig({
      file: write({
        sentinels: [
          { host: 's1', port: 26379 },
          { host: 's2', port: 26380 },
        ],
        name: 'mymaster',
        sentinelPasswordFile: secretFile('sentinel.txt', 'sentinel-secret\n'),
      }),
      env: {},
    });
    const { options } = redisConnectionOptions(config.redis);
    expect(options).toMatchObject({
      sentinels: [
        { host: 's1', port: 26379 },
        { host: 's2', port: 26380 },
      ],
      name: 'mymaster',
      sentinelPassword: 'sentinel-secret',
    });
    expect(describeRedis(config.redis)).toBe('primary of "mymaster" from sentinels s1:26379, s2:26380');
    expect(() => redisConnectionOptions({ ...config.redis, sentinelPasswordFile: secretFile('blank.txt', '\n') })).toThrow(
      /redis\.sentinelPasswordFile: .* is empty/,
    );
  });

  it('keeps the password out of what it logs', () => {
    expect(redactedRedisUrl('rediss://default:s3cret@redis:6380/2')).toBe('rediss://default:***@redis:6380/2');
    expect(redactedRedisUrl('redis://127.0.0.1:6379')).toBe('redis://127.0.0.1:6379');
    expect(redactedRedisUrl('not a url')).not.toContain('not a url');
  });
});
