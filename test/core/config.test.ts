import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { InputError } from '../../core/errors.js';
import { envOverrides, loadConfig } from '../../core/config.js';
import { resolveCredentials } from '../../core/auth-config.js';
import { workerTiming } from '../../core/queues.js';
import { DEFAULT_LADDER_CONFIG, ladderConfig } from '../../controller/policy/ladder/index.js';

const dir = mkdtempSync(join(tmpdir(), 'steadfast-config-'));
function file(name: string, text: string): string {
  const path = join(dir, name);
  writeFileSync(path, text);
  return path;
}

describe('configuration', () => {
  it('fills every default when no file and no environment are given', () => {
    const config = loadConfig({ env: {} });
    expect(config.redis.url).toBe('redis://127.0.0.1:6379');
    expect(config.backend.kind).toBe('dry-run');
    expect(config.safety.maxDrainsPerWindow).toBe(4);
  });

  it('reads the YAML file and lets STEADFAST_SECTION__KEY variables override it', () => {
    const path = file('ok.yaml', 'controller:\n  port: 9500\nbackend:\n  kind: slurm\n');
    const config = loadConfig({ file: path, env: { STEADFAST_CONTROLLER__PORT: '9600', STEADFAST_SAFETY__MAX_DRAINS_PER_WINDOW: '10' } });
    expect(config.controller.port).toBe(9600);
    expect(config.backend.kind).toBe('slurm');
    expect(config.safety.maxDrainsPerWindow).toBe(10);
  });

  it("takes the recovery ladder's thresholds from the recovery section, in seconds, and refuses a backoff cap below its start", () => {
    const path = file('recovery.yaml', 'recovery:\n  networkAlertsBeforeEviction: 3\n  retryInitialBackoffSeconds: 10\n');
    const config = loadConfig({ file: path, env: { STEADFAST_RECOVERY__QUARANTINE_WINDOW_SECONDS: '86400' } });
    expect(ladderConfig(config.recovery)).toMatchObject({
      networkAlertsBeforeEviction: 3,
      retryInitialBackoffMs: 10_000,
      exclusionWindowMs: 86_400_000,
      retryLimit: 6,
    });
    expect(ladderConfig(loadConfig({ env: {} }).recovery)).toEqual(DEFAULT_LADDER_CONFIG);
    const inverted = file('inverted.yaml', 'recovery:\n  retryInitialBackoffSeconds: 120\n  retryMaxBackoffSeconds: 60\n');
    expect(() => loadConfig({ file: inverted, env: {} })).toThrow(/recovery\.retryMaxBackoffSeconds: must be at least retryInitialBackoffSeconds/);
  });

  it("reads the stop-time checks' stages in order, and refuses a check in two stages or a stage named twice", () => {
    expect(loadConfig({ env: {} }).analysis.diagnoseStages).toEqual([]);
    const staged = file(
      'stages.yaml',
      'analysis:\n  diagnoseStages:\n    - { name: machine, checks: [eud] }\n    - { name: intra-machine, checks: [nccl-all-to-all], timeoutSeconds: 300 }\n',
    );
    expect(loadConfig({ file: staged, env: {} }).analysis.diagnoseStages).toEqual([
      { name: 'machine', checks: ['eud'] },
      { name: 'intra-machine', checks: ['nccl-all-to-all'], timeoutSeconds: 300 },
    ]);
    const twice = file('twice.yaml', 'analysis:\n  diagnoseStages:\n    - { name: a, checks: [eud] }\n    - { name: b, checks: [eud] }\n');
    expect(() => loadConfig({ file: twice, env: {} })).toThrow(/analysis\.diagnoseStages\.1\.checks: check "eud" is already in stage "a"/);
    const named = file('named.yaml', 'analysis:\n  diagnoseStages:\n    - { name: a, checks: [eud] }\n    - { name: a, checks: [nccl] }\n');
    expect(() => loadConfig({ file: named, env: {} })).toThrow(/analysis\.diagnoseStages\.1\.name: stage name "a" is used twice/);
    const empty = file('empty-stage.yaml', 'analysis:\n  diagnoseStages:\n    - { name: a, checks: [] }\n');
    expect(() => loadConfig({ file: empty, env: {} })).toThrow(/analysis\.diagnoseStages\.0\.checks/);
  });

  it('reads the label names multi-signal detection queries with, and refuses one Prometheus could not have, naming the key', () => {
    expect(loadConfig({ env: {} }).analysis.labels).toEqual({ scrapeJob: 'steadfast-agent', nodeLabel: 'node', trainingJobLabel: 'training_job' });
    const own = file('labels.yaml', 'analysis:\n  labels:\n    scrapeJob: dcgm|node-exporter\n    nodeLabel: host\n    trainingJobLabel: run\n');
    expect(loadConfig({ file: own, env: {} }).analysis.labels).toEqual({ scrapeJob: 'dcgm|node-exporter', nodeLabel: 'host', trainingJobLabel: 'run' });
    const dashed = file('dashed.yaml', 'analysis:\n  labels:\n    nodeLabel: host-name\n');
    expect(() => loadConfig({ file: dashed, env: {} })).toThrow(/analysis\.labels\.nodeLabel: must be a Prometheus label name/);
    const quoted = file('quoted.yaml', "analysis:\n  labels:\n    scrapeJob: 'a\"b'\n");
    expect(() => loadConfig({ file: quoted, env: {} })).toThrow(/analysis\.labels\.scrapeJob: must not hold quotes/);
    const typo = file('typo.yaml', 'analysis:\n  labels:\n    nodelabel: host\n');
    expect(() => loadConfig({ file: typo, env: {} })).toThrow(/analysis\.labels/);
  });

  it("verifies fail-slow changes at Greyhound's 10 % unless told otherwise, and refuses a threshold outside (0, 1), naming the key", () => {
    expect(loadConfig({ env: {} }).analysis.failSlowThreshold).toBe(0.1);
    expect(loadConfig({ env: { STEADFAST_ANALYSIS__FAIL_SLOW_THRESHOLD: '0.5' } }).analysis.failSlowThreshold).toBe(0.5);
    for (const bad of ['0', '1', '-0.1', 'ten'])
      expect(() => loadConfig({ env: { STEADFAST_ANALYSIS__FAIL_SLOW_THRESHOLD: bad } }), bad).toThrow(/analysis\.failSlowThreshold/);
  });

  it("takes how soon a dead worker's jobs move on from the queues section, within bounds, BullMQ's 30 s by default", () => {
    expect(loadConfig({ env: {} }).queues).toEqual({ lockDurationSeconds: 30, stalledIntervalSeconds: 30 });
    expect(workerTiming(loadConfig({ env: {} }).queues)).toEqual({ lockDuration: 30_000, stalledInterval: 30_000 });
    const config = loadConfig({ file: file('queues.yaml', 'queues:\n  lockDurationSeconds: 10\n'), env: { STEADFAST_QUEUES__STALLED_INTERVAL_SECONDS: '5' } });
    expect(workerTiming(config.queues)).toEqual({ lockDuration: 10_000, stalledInterval: 5000 });
    expect(() => loadConfig({ env: { STEADFAST_QUEUES__LOCK_DURATION_SECONDS: '1' } })).toThrow(/queues\.lockDurationSeconds/);
    expect(() => loadConfig({ env: { STEADFAST_QUEUES__STALLED_INTERVAL_SECONDS: '0' } })).toThrow(/queues\.stalledIntervalSeconds/);
    expect(() => loadConfig({ env: { STEADFAST_QUEUES__LOCK_DURATION_SECONDS: '3601' } })).toThrow(/queues\.lockDurationSeconds/);
  });

  it("sizes the intake for the shipped max_alerts, serves metrics on their own port, and refuses a budget below one body or a metrics port on the API's", () => {
    const { controller } = loadConfig({ env: {} });
    expect(controller).toMatchObject({ bodyLimitBytes: 4 * 1024 * 1024, inFlightBodyBytes: 16 * 1024 * 1024, metrics: { port: 9402 } });
    expect(loadConfig({ env: { STEADFAST_CONTROLLER__METRICS__PORT: '9500', STEADFAST_CONTROLLER__METRICS__HOST: '10.0.0.1' } }).controller.metrics).toEqual({
      port: 9500,
      host: '10.0.0.1',
    });
    expect(() => loadConfig({ env: { STEADFAST_CONTROLLER__IN_FLIGHT_BODY_BYTES: '65536', STEADFAST_CONTROLLER__BODY_LIMIT_BYTES: '131072' } })).toThrow(
      /controller\.inFlightBodyBytes: must be at least bodyLimitBytes/,
    );
    expect(() => loadConfig({ env: { STEADFAST_CONTROLLER__METRICS__PORT: '9400' } })).toThrow(/controller\.metrics\.port: must differ from controller\.port/);
    // On another address the same port is no clash.
    expect(loadConfig({ env: { STEADFAST_CONTROLLER__METRICS__PORT: '9400', STEADFAST_CONTROLLER__METRICS__HOST: '10.0.0.1' } }).controller.metrics.port).toBe(
      9400,
    );
  });

  it('names the bad field when a value has the wrong type', () => {
    const path = file('bad-type.yaml', 'controller:\n  port: "ninety"\n');
    expect(() => loadConfig({ file: path, env: {} })).toThrow(/invalid config: controller\.port: /);
  });

  it('refuses a stack-dump timeout the agents would refuse', () => {
    expect(() => loadConfig({ env: { STEADFAST_AGENTS__TRACE_TIMEOUT_SECONDS: '120' } })).toThrow(/agents\.traceTimeoutSeconds/);
  });

  it('names an unknown key instead of ignoring a typo', () => {
    const path = file('typo.yaml', 'safety:\n  maxDrainPerWindow: 3\n');
    expect(() => loadConfig({ file: path, env: {} })).toThrow(/safety.*maxDrainPerWindow/);
  });

  it('names the field of a bad environment override', () => {
    expect(() => loadConfig({ env: { STEADFAST_BACKEND__KIND: 'openstack' } })).toThrow(/backend\.kind/);
  });

  it('says so when the file is not YAML or not there', () => {
    expect(() => loadConfig({ file: file('broken.yaml', 'a: [1,\n'), env: {} })).toThrow(InputError);
    expect(() => loadConfig({ file: join(dir, 'missing.yaml'), env: {} })).toThrow(/cannot read config file/);
  });

  it('keeps a numeric-looking token a string', () => {
    expect(envOverrides({ STEADFAST_CONTROLLER__AUTH__OPERATOR_TOKEN: '1234567890123456789' })).toEqual({
      controller: { auth: { operatorToken: '1234567890123456789' } },
    });
    const config = loadConfig({ env: { STEADFAST_CONTROLLER__AUTH__OPERATOR_TOKEN_FILE: file('token', 'abcdefabcdefabcdef\n') } });
    expect(resolveCredentials(config.controller.auth).operator).toBe('abcdefabcdefabcdef');
  });

  it('accepts the Kubernetes backend and names what a token connection lacks', () => {
    expect(loadConfig({ env: { STEADFAST_BACKEND__KIND: 'kubernetes' } }).backend.kubernetes.connection).toBe('in-cluster');
    expect(() => loadConfig({ env: { STEADFAST_BACKEND__KIND: 'kubernetes', STEADFAST_BACKEND__KUBERNETES__CONNECTION: 'token' } })).toThrow(
      /backend\.kubernetes\.server: connection "token" needs server and tokenFile/,
    );
  });

  it('bounds drains per window by a share of the cluster when its size is given', async () => {
    const { drainBudget } = await import('../../actuators/safety.js');
    expect(drainBudget(loadConfig({ env: {} }).safety)).toBe(4);
    expect(drainBudget(loadConfig({ env: { STEADFAST_SAFETY__CLUSTER_NODES: '64', STEADFAST_SAFETY__MAX_DRAIN_PERCENT: '5' } }).safety)).toBe(3);
    expect(drainBudget(loadConfig({ env: { STEADFAST_SAFETY__CLUSTER_NODES: '1000', STEADFAST_SAFETY__MAX_DRAIN_PERCENT: '5' } }).safety)).toBe(4);
  });

  it('refuses to run without any credential', () => {
    expect(() => resolveCredentials(loadConfig({ env: {} }).controller.auth)).toThrow(
      /controller\.auth: no credential configured.*refusing to run unauthenticated/,
    );
  });

  it('refuses two roles sharing one token, and a role given both inline and in a file', () => {
    expect(() => resolveCredentials({ operatorToken: 'same-token-0123456789', alertmanagerToken: 'same-token-0123456789' })).toThrow(
      /two roles share one token/,
    );
    expect(() =>
      loadConfig({ env: { STEADFAST_CONTROLLER__AUTH__READ_ONLY_TOKEN: 'read-only-0123456789', STEADFAST_CONTROLLER__AUTH__READ_ONLY_TOKEN_FILE: '/x' } }),
    ).toThrow(/controller\.auth\.readOnlyTokenFile: give readOnlyToken or readOnlyTokenFile, not both/);
    expect(() => loadConfig({ env: { STEADFAST_CONTROLLER__AUTH__AGENT_SECRET: 'too-short' } })).toThrow(
      /controller\.auth\.agentSecret: must be at least 32 characters/,
    );
  });
});
