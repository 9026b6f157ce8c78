import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { AuditLog } from '../../core/audit.js';
import { silentLogger } from '../../core/log.js';
import { remediesSchema } from '../../core/remedy-config.js';
import { VALIDATE_PATH, type ValidationReport } from '../../core/validation.js';
import { validationSchema } from '../../core/validation-config.js';
import { AgentNodeValidator, PeerThroughputs } from '../../actuators/node-validation.js';
import { StandbyPool } from '../../actuators/standby-pool.js';
import { ValidationUpkeep, stillRebooting } from '../../actuators/validation-upkeep.js';
import { testRedis } from '../support/redis.js';
import { lastAction, nodeTransition, queued, recordingBackend, testStepProcessor } from '../support/steps.js';

const CONFIG = validationSchema.parse({ enabled: true, timeoutSeconds: 30 });

function report(node: string, burn: 'passed' | 'failed'): ValidationReport {
  const ok = burn === 'passed';
  return {
    node,
    startedAt: new Date().toISOString(),
    seconds: 17,
    ok,
    checks: [
      {
        name: 'burn',
        result: burn,
        ok,
        seconds: 16.9,
        outputTail: '',
        ...(ok ? {} : { reason: 'cuda:1: round 0: checksum off the CPU reference by 0.5 (tolerance 1e-05)' }),
      },
      { name: 'dcgm', result: 'passed', ok: true, seconds: 120, outputTail: '' },
    ],
    devices: [{ device: 'cuda:0', name: 'NVIDIA H100 80GB HBM3', ok, checksum_error: ok ? 1e-7 : 0.5, tflops: 50, seconds: 15, rounds: 700 }],
  };
}

/**
 * The validations the controller's tick drives: a node rebooted with validation on (it comes back
 * DOWN) is validated once back, then resumed or kept out naming the failed check; a warm standby
 * that became ready is validated once, and one that fails leaves the pool as failed.
 */
describe('validation after a reboot and of warm standbys', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  const servers: Server[] = [];
  afterEach(async () => {
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
    await Promise.all(servers.splice(0).map((server) => new Promise((resolve) => server.close(resolve))));
  });

  async function setUp(reports: Map<string, ValidationReport>) {
    const store = testRedis();
    stores.push(store);
    const calls: string[] = [];
    const server = createServer((request, response) => {
      const node = /^\/([^/]+)/.exec(request.url ?? '')?.[1] ?? '';
      calls.push(node);
      const body = reports.get(node);
      if (request.url !== `/${node}${VALIDATE_PATH}` || body === undefined) response.writeHead(503).end('{"error":"not up yet"}');
      else response.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body));
    });
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const agents = { urls: async (nodes: readonly string[]) => new Map(nodes.map((node) => [node, `${url}/${node}`])), tokenFor: () => undefined };
    const validator = new AgentNodeValidator(agents, new PeerThroughputs(store.redis, store.keys, 10), CONFIG);
    const audit = new AuditLog(store.redis, store.keys);
    const backend = recordingBackend(store);
    const pool = new StandbyPool(store.redis, store.keys, backend, { candidates: ['spare-1'], dailyFailureRate: 0.5, quantile: 0.99 });
    const upkeep = new ValidationUpkeep({
      redis: store.redis,
      keys: store.keys,
      backend,
      validator,
      audit,
      logger: silentLogger(),
      pool,
      giveUpMs: 3600_000,
      timeoutMs: 30_000,
    });
    const steps = testStepProcessor(store, { backend, audit }, { validator, remedies: remediesSchema.parse({ reboot: { enabled: true } }) });
    return { store, audit, backend, pool, upkeep, steps, calls };
  }

  it('tells a reboot still under way or slurmd not answering from a node that is back', () => {
    for (const raw of ['drained@', 'down*', 'draining^', 'DOWN+DRAIN+REBOOT_REQUESTED', 'DOWN+NOT_RESPONDING']) expect(stillRebooting(raw)).toBe(true);
    for (const raw of ['down', 'drained', 'DOWN+DRAIN', 'drained (dry-run)']) expect(stillRebooting(raw)).toBe(false);
  });

  it('reboots into DOWN, then keeps a node whose validation fails out naming the check, and returns one that passes', async () => {
    const reports = new Map([['node-1', report('node-1', 'failed')]]);
    const { audit, backend, upkeep, steps } = await setUp(reports);
    await steps(queued(nodeTransition('reboot')));
    expect((await lastAction(audit, 'd-reboot')).detail).toMatch(/once idle, then down, validated before it returns\)$/);
    expect((await backend.recorded())['node-1']).toMatch(/\(reboot, then down\)$/);
    upkeep.tick(Date.now());
    await waitFor(async () => (await audit.read({ type: 'action', ref: 'd-reboot' })).some((entry) => entry.data.verb === 'validate'));
    await upkeep.settled();
    const state = await backend.nodeState('node-1');
    expect(state.drained).toBe(true);
    expect(state.reason).toMatch(/^steadfast: after its reboot, validation failed \(burn\): burn failed in 16\.9 s \(cuda:1: round 0: checksum off/);
    const entry = (await audit.read({ type: 'action', ref: 'd-reboot' })).at(-1);
    expect(entry?.summary).toMatch(/^validate node-1: failed \(back from its reboot, but validation failed \(burn\)/);
    // Done with: the next tick does not validate it again.
    upkeep.tick(Date.now());
    await upkeep.settled();

    reports.set('node-2', report('node-2', 'passed'));
    await steps(queued(nodeTransition('reboot', { id: 'd-reboot-2', node: 'node-2' })));
    upkeep.tick(Date.now());
    await waitFor(async () => !(await backend.nodeState('node-2')).drained);
    const back = (await audit.read({ type: 'action', ref: 'd-reboot-2' })).at(-1);
    expect(back?.summary).toMatch(
      /^validate node-2: done \(back from its reboot and validated in [\d.]+ s \(burn passed in 16\.9 s, dcgm passed in 120\.0 s; .*\); returned to service\)$/,
    );
  });

  it('waits for a rebooted node whose agent is not up yet, instead of failing it', async () => {
    const { audit, backend, upkeep, steps, calls } = await setUp(new Map());
    await steps(queued(nodeTransition('reboot')));
    upkeep.tick(Date.now());
    await waitFor(async () => calls.length > 0);
    await upkeep.settled();
    expect((await backend.nodeState('node-1')).drained).toBe(true);
    expect((await audit.read({ type: 'action', ref: 'd-reboot' })).some((entry) => entry.data.verb === 'validate')).toBe(false);
  });

  it('validates a standby once it is ready, and takes one that fails out of the pool', async () => {
    const { pool, upkeep, calls } = await setUp(new Map([['spare-1', report('spare-1', 'failed')]]));
    expect(await pool.reconcile(1, new Set())).toEqual(['spare-1']);
    await pool.selfCheck('spare-1', true, 'all collectors working');
    upkeep.tick(Date.now());
    await waitFor(async () => (await pool.member('spare-1'))?.state === 'failed');
    expect((await pool.member('spare-1'))?.detail).toMatch(/^validation failed \(burn\)/);
    await upkeep.settled();
    upkeep.tick(Date.now());
    await upkeep.settled();
    expect(calls).toEqual(['spare-1']);
  });
});

async function waitFor(condition: () => Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
