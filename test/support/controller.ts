import { configSchema, type Config } from '../../core/config.js';
import { agentTokenFor } from '../../core/credentials.js';
import type { Launchers } from '../../core/launcher.js';
import { silentLogger } from '../../core/log.js';
import { Controller } from '../../controller/service.js';

/** The operator's credential: every scope (controller/intake/scopes.ts). */
export const TEST_TOKEN = 'test-token-0123456789abcdef';
export const READ_ONLY_TOKEN = 'read-only-token-0123456789';
export const ALERTMANAGER_TOKEN = 'alertmanager-token-0123456789';
export const AGENT_SECRET = 'agent-secret-0123456789abcdef0123456789';

/** The node-bound credential of `node`'s agent under AGENT_SECRET. */
export function agentToken(node: string): string {
  return agentTokenFor(AGENT_SECRET, node);
}

/** Every role's credential, as `controller.auth` takes them. */
export const TEST_AUTH = { operatorToken: TEST_TOKEN, readOnlyToken: READ_ONLY_TOKEN, alertmanagerToken: ALERTMANAGER_TOKEN, agentSecret: AGENT_SECRET };

/** The launcher test controllers are configured with: `true` stands in for sbatch and accepts every job. */
export const TEST_LAUNCHER = 'accept';
export const TEST_LAUNCHERS: Launchers = { [TEST_LAUNCHER]: { kind: 'slurm', command: ['true', '{job}', '{nodes}', '{version}'] } };

export function testConfig(redisUrl: string, prefix: string, overrides: Partial<Record<keyof Config, object>> = {}): Config {
  // Every test controller knows the `accept` launcher; a test adds its own under `launchers`.
  return configSchema.parse({
    redis: { url: redisUrl, prefix, ...(overrides.redis ?? {}) },
    controller: { host: '127.0.0.1', port: 0, metrics: { port: 0 }, auth: TEST_AUTH, ...(overrides.controller ?? {}) },
    backend: { kind: 'dry-run', ...(overrides.backend ?? {}) },
    safety: { ...(overrides.safety ?? {}) },
    recovery: { ...(overrides.recovery ?? {}) },
    policy: { ...(overrides.policy ?? {}) },
    standby: { ...(overrides.standby ?? {}) },
    progress: { ...(overrides.progress ?? {}) },
    launchers: { ...TEST_LAUNCHERS, ...(overrides.launchers ?? {}) },
    ...(overrides.agents ? { agents: overrides.agents } : {}),
    ...(overrides.grafana ? { grafana: overrides.grafana } : {}),
    ...(overrides.remedies ? { remedies: overrides.remedies } : {}),
  });
}

/** Starts a controller; `url` is its API, `metricsUrl` its metrics listener. */
export async function startController(
  config: Config,
  options: { workers?: boolean } = {},
): Promise<{ controller: Controller; url: string; metricsUrl: string }> {
  const controller = new Controller({ config, logger: silentLogger(), workers: options.workers ?? true });
  const { port, metricsPort } = await controller.start();
  return { controller, url: `http://127.0.0.1:${port}`, metricsUrl: `http://127.0.0.1:${metricsPort}` };
}

export async function post(
  url: string,
  body: unknown,
  token: string | null = TEST_TOKEN,
): Promise<{ status: number; body: { error?: string; accepted?: number; ids?: string[] }; headers: Headers }> {
  const response = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as { error?: string }, headers: response.headers };
}

/** An Alertmanager webhook (v4) carrying one firing SteadfastXidFatal for node-3's GPU 0000:3a:00. */
export function xidAlertPayload(overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    version: '4',
    status: 'firing',
    receiver: 'steadfast-controller',
    groupLabels: { alertname: 'SteadfastXidFatal' },
    commonLabels: {},
    commonAnnotations: {},
    alerts: [
      {
        status: 'firing',
        labels: { alertname: 'SteadfastXidFatal', node: 'node-3', pci_bus_id: '0000:3a:00', xid: '79', severity: 'critical' },
        annotations: { summary: 'Fatal Xid' },
        startsAt: '2026-11-21T10:00:00.000Z',
        fingerprint: 'abc123',
      },
    ],
    ...overrides,
  };
}
