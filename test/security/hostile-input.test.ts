import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { kubernetesBackend, type KubernetesBackend } from '../../actuators/kubernetes.js';
import { SlurmBackend } from '../../actuators/slurm.js';
import { signalsFromWebhookAlerts, webhookEnvelopeSchema } from '../../controller/intake/alertmanager.js';
import type { Controller } from '../../controller/service.js';
import { diagnoseRequestSchema } from '../../core/diagnostics.js';
import { DoNotRetryError, InputError } from '../../core/errors.js';
import { fastPathEventSchema } from '../../core/fast-path-event.js';
import { configSchema } from '../../core/config.js';
import { launchArgv, parseJobSpec } from '../../core/job.js';
import type { SlurmLauncher } from '../../core/launcher.js';
import { parseOrThrow } from '../../core/validate.js';
import { nodeNameSchema } from '../../core/names.js';
import { post, startController, testConfig } from '../support/controller.js';
import { HOSTILE_STRINGS } from '../support/hostile.js';
import { startKubeApi, type KubeApiStandIn } from '../support/kube-api.js';
import { testRedis } from '../support/redis.js';

/**
 * Strings that reach a command line or the Kubernetes API: node names, job names, code
 * versions, launcher arguments. Each hostile one (shell metacharacters, an option-looking
 * "--foo", a newline, NUL, 100 000 characters) is refused where it enters, and the actuators
 * refuse it again themselves, before any command runs or any request leaves.
 */

const JOB = {
  name: 'llama',
  nodes: ['n00', 'n01'],
  ranksPerNode: 1,
  topology: { dp: 2 },
  launcher: 'accept',
  codeVersion: 'v1',
};
const SLURM_LAUNCHER: SlurmLauncher = { kind: 'slurm', command: ['sbatch', '--job-name={job}', '--nodelist={nodes}', 'train.sh', '{version}'] };

/** Hostile as a code version too: 64 letters only break the 63-character limit of names; a version may have 128. */
const HOSTILE_VERSIONS = [...HOSTILE_STRINGS.filter((text) => text !== 'a'.repeat(64)), 'a'.repeat(129), 'release/../../etc'];

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => new Error('expected a rejection'),
    (reason: unknown) => reason,
  );
}

describe('names at the edge', () => {
  it('refuses every hostile string as a node name, wherever a node name enters', () => {
    for (const name of HOSTILE_STRINGS) {
      expect(nodeNameSchema.safeParse(name).success, JSON.stringify(name.slice(0, 40))).toBe(false);
      expect(fastPathEventSchema.safeParse({ kind: 'gpu_lost', node: name, gpu: '0000:3b:00', time: '2026-11-21T10:00:00Z' }).success).toBe(false);
      expect(diagnoseRequestSchema.safeParse({ peers: [name] }).success).toBe(false);
      expect(() => parseJobSpec({ ...JOB, nodes: ['n00', name] })).toThrow(InputError);
    }
  });

  it('refuses an Alertmanager alert with a hostile node label, naming the field, instead of passing it on or dropping the node', async () => {
    for (const name of HOSTILE_STRINGS.filter((text) => text.length < 1000)) {
      const good = { status: 'firing', labels: { alertname: 'SteadfastXidFatal', node: 'n01', xid: '79' }, annotations: {}, startsAt: '2026-11-21T10:00:00Z' };
      const hostile = { ...good, labels: { ...good.labels, node: name } };
      const envelope = webhookEnvelopeSchema.parse({ version: '4', status: 'firing', receiver: 'steadfast', alerts: [good, hostile] });
      const { signals, refused } = await signalsFromWebhookAlerts(envelope, new Date());
      expect(
        signals.map((signal) => signal.node),
        JSON.stringify(name),
      ).toEqual(['n01']);
      expect(refused).toEqual([{ index: 1, reason: expect.stringMatching(/^alerts\.1\.labels\.node: node must be 1-63 characters/) as unknown }]);
    }
  });

  it('refuses hostile code versions in a job spec, and launcher arguments with control characters or unknown placeholders in the configuration', () => {
    for (const version of HOSTILE_VERSIONS)
      expect(() => parseJobSpec({ ...JOB, codeVersion: version }), JSON.stringify(version.slice(0, 40))).toThrow(/codeVersion/);
    for (const version of ['v1', 'v1.2.3', 'release/2.1+cu124', 'sha256:0123abcd', 'main@2026-11-21', 'a'.repeat(128)])
      expect(parseJobSpec({ ...JOB, codeVersion: version }).spec.codeVersion).toBe(version);
    for (const arg of ['train.sh\n--wrap=id', 'train\0.sh', 'train.sh\r', '\u007f']) {
      expect(() => parseOrThrow(configSchema, { launchers: { train: { kind: 'slurm', command: ['sbatch', arg] } } }, 'config')).toThrow(
        /launchers\.train\.command\.1: must not contain control characters/,
      );
      expect(() => parseOrThrow(configSchema, { launchers: { train: { kind: 'slurm', command: ['sbatch'], replay: ['srun', arg] } } }, 'config')).toThrow(
        /launchers\.train\.replay\.1/,
      );
    }
    expect(() => parseOrThrow(configSchema, { launchers: { train: { kind: 'slurm', command: ['sbatch', '--uid={user}'] } } }, 'config')).toThrow(
      /may use only the placeholders \{job\}, \{nodes\}, \{nodeCount\}, \{version\}/,
    );
    for (const launcher of [{ kind: 'slurm', command: ['sbatch', 'train.sh'] }, ['sbatch', 'train.sh'], 'Train!', '../bin/sh']) {
      expect(() => parseJobSpec({ ...JOB, launcher }), JSON.stringify(launcher)).toThrow(/launcher/);
    }
  });

  it('builds launcher argv with each value one argument, and refuses hostile values before anything runs', () => {
    expect(launchArgv(SLURM_LAUNCHER, { job: 'llama', nodes: ['n00', 'n01'], version: 'v2' })).toEqual([
      'sbatch',
      '--job-name=llama',
      '--nodelist=n00,n01',
      'train.sh',
      'v2',
    ]);
    // {nodeCount}: how many nodes {nodes} names (a hot-swap job's allocation shrinks as it uses spares).
    expect(
      launchArgv(SLURM_LAUNCHER, { job: 'llama', nodes: ['n00', 'n01', 's02'], version: 'v2' }, ['sbatch', '--nodes={nodeCount}', '--nodelist={nodes}']),
    ).toEqual(['sbatch', '--nodes=3', '--nodelist=n00,n01,s02']);
    for (const hostile of HOSTILE_STRINGS) {
      expect(() => launchArgv(SLURM_LAUNCHER, { job: hostile, nodes: ['n00'], version: 'v2' })).toThrow(/launcher \{job\}/);
      expect(() => launchArgv(SLURM_LAUNCHER, { job: 'llama', nodes: ['n00', hostile], version: 'v2' })).toThrow(/launcher \{nodes\}/);
    }
    for (const version of HOSTILE_VERSIONS) expect(() => launchArgv(SLURM_LAUNCHER, { job: 'llama', nodes: ['n00'], version })).toThrow(/launcher \{version\}/);
    expect(() => launchArgv(SLURM_LAUNCHER, { job: 'llama', nodes: [], version: 'v2' })).toThrow(InputError);
    expect(() => launchArgv({ kind: 'slurm', command: ['sbatch', 'x\0y'] }, { job: 'llama', nodes: ['n00'], version: 'v2' })).toThrow(/launcher argv/);
  });
});

describe('the Slurm backend with hostile names', () => {
  let dir: string;
  let log: string;
  let backend: SlurmBackend;

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'steadfast-hostile-slurm-'));
    log = join(dir, 'invocations.log');
    // Stands in for scontrol and sinfo: writes each argument on its own line, then a separator.
    const recorder = join(dir, 'record.sh');
    writeFileSync(recorder, '#!/bin/sh\nfor arg in "$@"; do printf "%s\\n" "$arg" >> "$STEADFAST_TEST_LOG"; done\necho "--end--" >> "$STEADFAST_TEST_LOG"\n');
    chmodSync(recorder, 0o755);
    backend = new SlurmBackend({ scontrol: recorder, sinfo: recorder, env: { STEADFAST_TEST_LOG: log }, timeoutMs: 5000 });
  });
  afterEach(() => rmSync(log, { force: true }));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('refuses every hostile node name in every call with DoNotRetryError, and runs no command at all', async () => {
    for (const name of HOSTILE_STRINGS) {
      for (const call of [
        () => backend.drain(name, 'x'),
        () => backend.resume(name),
        () => backend.nodeState(name),
        () => backend.holdStandby(name),
        () => backend.activateStandby(name, 'llama'),
      ]) {
        expect(await rejection(call()), JSON.stringify(name.slice(0, 40))).toBeInstanceOf(DoNotRetryError);
      }
    }
    expect(existsSync(log)).toBe(false);
  });

  it('passes a valid node and a hostile reason as exactly four arguments, the reason on one printable line', async () => {
    await backend.drain('gpu-01', 'Xid 79\nState=RESUME\0; reboot $(id) --force');
    // The node's state is read first (sinfo: whose drain is on it), then scontrol drains it.
    const calls = readFileSync(log, 'utf8').split('--end--\n');
    expect(calls[0]?.split('\n')[0]).toBe('--noheader');
    expect(calls[1]?.split('\n').slice(0, 4)).toEqual(['update', 'NodeName=gpu-01', 'State=DRAIN', 'Reason=Xid 79 State=RESUME ; reboot $(id) --force']);
    expect(calls[1]?.split('\n')[4]).toBe('');
  });
});

describe('the Kubernetes backend with hostile names', () => {
  let api: KubeApiStandIn;
  let backend: KubernetesBackend;

  beforeAll(async () => {
    api = await startKubeApi();
    backend = kubernetesBackend({ connection: { kind: 'token', server: api.url, token: api.token, skipTlsVerify: true }, timeoutMs: 2000 });
  });
  afterAll(async () => api.close());

  it('refuses hostile node names, job labels, namespaces and selectors before sending any request', async () => {
    const refused: unknown[] = [];
    // Valid for Slurm, not for Kubernetes: node names there are lower-case DNS names.
    for (const name of [...HOSTILE_STRINGS, 'Upper-Case', 'under_score']) {
      for (const call of [
        () => backend.drain(name, 'x'),
        () => backend.resume(name),
        () => backend.nodeState(name),
        () => backend.holdStandby(name),
        () => backend.activateStandby(name, 'llama'),
      ]) {
        refused.push(await rejection(call()));
      }
    }
    for (const name of HOSTILE_STRINGS) {
      refused.push(await rejection(backend.activateStandby('gpu-a01', name)));
      refused.push(await rejection(backend.relaunchWorkload(name, 'job-name=llama')));
      refused.push(await rejection(backend.relaunchWorkload('ml', `job-name=${name}`)));
    }
    const hostileSelectors = [
      'job-name in (a,b)',
      'job-name=llama,!x',
      'job-name',
      'a=b c=d',
      'job-name=llama\n',
      'job-name=',
      '=llama',
      'Bad_Prefix/job=llama',
      `x=${'a'.repeat(64)}`,
      `${'a.'.repeat(600)}b/x=y`,
    ];
    for (const selector of hostileSelectors) refused.push(await rejection(backend.relaunchWorkload('ml', selector)));
    expect(refused.filter((error) => !(error instanceof DoNotRetryError))).toEqual([]);
    // Not one request reached the API server.
    expect(() => api.verify()).not.toThrow();
  });
});

describe('the jobs API with hostile values', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;

  beforeAll(async () => {
    ({ controller, url } = await startController(testConfig(store.url, store.prefix, { controller: { rateLimit: { requestsPerSecond: 0 } } }), {
      workers: false,
    }));
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
  });
  afterAll(async () => {
    await controller.close();
    await store.cleanup();
  });

  it("answers a code update with a hostile version with 400 naming the field, and keeps the job's version", async () => {
    for (const version of HOSTILE_VERSIONS.filter((text) => text.length < 50_000)) {
      const answer = await post(`${url}/api/v1/jobs/llama/code-updates`, { version, urgent: true });
      expect(answer.status, JSON.stringify(version.slice(0, 40))).toBe(400);
      expect(answer.body.error).toContain('version');
    }
    expect((await controller.jobs.get('llama')).spec.codeVersion).toBe('v1');
  });

  it('answers a job whose topology would hold hundreds of millions of ranks with 400 at once, not by running out of memory', async () => {
    const nodes = Array.from({ length: 100_000 }, (_, index) => `n${index}`);
    const started = Date.now();
    const answer = await post(`${url}/api/v1/jobs`, { ...JOB, name: 'huge', nodes, ranksPerNode: 1024, topology: { tp: 8, dp: 12_800_000, order: 'tp-dp' } });
    expect(answer.status).toBe(400);
    expect(answer.body.error).toMatch(/at most 262144 are supported/);
    expect(Date.now() - started).toBeLessThan(5000);
  });
});
