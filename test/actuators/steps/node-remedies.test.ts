import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { AuditLog } from '../../../core/audit.js';
import { handOffPayloadSchema, type GpuResetReport, type HandOffPayload } from '../../../core/remedy.js';
import { remediesSchema, type MaintenanceWindow } from '../../../core/remedy-config.js';
import type { NodeVerb } from '../../../core/steps.js';
import { DryRunBackend } from '../../../actuators/dry-run.js';
import { WebhookHandOff } from '../../../actuators/hand-off.js';
import { RemediationHistory } from '../../../actuators/remediation-history.js';
import type { GpuResetter } from '../../../actuators/steps/gpu-resetter.js';
import { SafetyGates } from '../../../actuators/safety.js';
import { JobStore } from '../../../controller/job-store.js';
import { testRedis } from '../../support/redis.js';
import { lastAction, nodeTransition, queued, recordingBackend, testStepProcessor } from '../../support/steps.js';

/** An agent double: answers each reset with the next scripted outcome, and counts the calls. */
class ScriptedResetter implements GpuResetter {
  calls = 0;
  constructor(
    private readonly outcomes: GpuResetReport['outcome'][],
    private readonly processes: number[] = [],
  ) {}
  async reset(node: string, gpu: string): Promise<GpuResetReport> {
    const outcome = this.outcomes[Math.min(this.calls, this.outcomes.length - 1)] ?? 'reset';
    this.calls += 1;
    return {
      node,
      gpu,
      index: 2,
      outcome,
      processes: outcome === 'refused' ? this.processes : [],
      stopped: [],
      reason: outcome === 'reset' ? 'GPU 2 reset and listed again' : 'processes 7 still use GPU 2',
      seconds: 0.5,
    };
  }
}

describe("the node ladder's remedy steps: reset_gpu, reboot, hand_off (a node outside any job)", () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  const servers: Server[] = [];
  afterEach(async () => {
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
    await Promise.all(servers.splice(0).map((server) => new Promise((resolve) => server.close(resolve))));
  });

  function setUp(
    resetter: GpuResetter,
    options: { maxPerWindow?: number; remedies?: Record<string, unknown>; webhookUrl?: string; windows?: MaintenanceWindow[] } = {},
  ) {
    const store = testRedis();
    stores.push(store);
    const audit = new AuditLog(store.redis, store.keys);
    const gates = new SafetyGates(store.redis, store.keys, { maxPerWindow: options.maxPerWindow ?? 10, windowSeconds: 60 }, 30, options.windows);
    const backend = recordingBackend(store);
    const history = new RemediationHistory(store.redis, store.keys, 10);
    const counted: string[] = [];
    const steps = testStepProcessor(
      store,
      { backend, audit, gates },
      {
        history,
        resetter,
        handOff: options.webhookUrl === undefined ? undefined : new WebhookHandOff({ url: options.webhookUrl, timeoutMs: 2000, attempts: 3, baseDelayMs: 10 }),
        remedies: remediesSchema.parse({ gpuReset: { busyRetries: 2, busyRetryDelaySeconds: 0 }, ...options.remedies }),
        onRemediation: (node, action, outcome) => counted.push(`${node} ${action} ${outcome}`),
      },
    );
    // Runs the node's one-step transition and answers with how that step ended.
    const processor = async (verb: NodeVerb, id = `d-${verb}`, attemptsMade = 0): Promise<{ state: string; detail: string }> => {
      await steps(queued(nodeTransition(verb, { id }), attemptsMade));
      return lastAction(audit, id);
    };
    return { store, audit, gates, backend, history, processor, steps, counted };
  }

  it('resets the GPU, returns the node to service, and does not reset again when the job is redelivered', async () => {
    const resetter = new ScriptedResetter(['reset']);
    const { processor, steps, backend, history, counted } = setUp(resetter);
    const result = await processor('reset_gpu');
    expect(result).toEqual({ state: 'done', detail: 'GPU 0000:3a:00 (index 2) reset and listed again in 0.5 s; node returned to service' });
    expect((await backend.nodeState('node-1')).drained).toBe(false);
    expect(await steps(queued(nodeTransition('reset_gpu'), 1))).toEqual({ done: 0, halted: undefined });
    expect(resetter.calls).toBe(1);
    expect((await history.read('node-1')).map((entry) => `${entry.action} ${entry.outcome}`)).toEqual(['reset_gpu done']);
    expect(counted).toEqual(['node-1 reset_gpu done']);
  });

  it('asks again while processes hold the GPU, then drains the node instead', async () => {
    const resetter = new ScriptedResetter(['refused'], [7]);
    const { processor, backend, history } = setUp(resetter);
    const result = await processor('reset_gpu');
    expect(result.detail).toBe('GPU reset refused (processes 7 still use GPU 2); node drained instead');
    expect(resetter.calls).toBe(3);
    expect((await backend.nodeState('node-1')).reason).toMatch(/GPU reset refused: processes 7 still use GPU 2 audit=d-reset_gpu$/);
    expect((await history.read('node-1')).map((entry) => `${entry.action} ${entry.outcome}`)).toEqual(['drain done', 'reset_gpu fell_back']);
  });

  it('refuses while paused, on a held node, and past the budget, without asking the agent', async () => {
    const resetter = new ScriptedResetter(['reset']);
    const { processor, gates, history } = setUp(resetter, { maxPerWindow: 1 });
    await gates.pause('storage migration');
    expect(await processor('reset_gpu', 'd-a')).toMatchObject({ state: 'refused', detail: 'actions are paused: storage migration' });
    await gates.unpause();
    await gates.hold('node-1', 'firmware update', Date.now() + 60_000);
    expect((await processor('reset_gpu', 'd-b')).detail).toMatch(/^held for maintenance by an operator: node-1 \(firmware update/);
    await gates.release('node-1');
    expect((await processor('reset_gpu', 'd-c')).state).toBe('done');
    expect((await processor('reset_gpu', 'd-d')).detail).toBe('eviction budget exhausted: 1 drains per 60 s already used');
    expect(resetter.calls).toBe(1);
    expect((await history.read('node-1')).map((entry) => `${entry.action} ${entry.outcome}`)).toEqual([
      'reset_gpu refused',
      'reset_gpu done',
      'reset_gpu refused',
      'reset_gpu refused',
    ]);
  });

  it('acts on no node inside a scheduled maintenance window, and on it again once the window has closed', async () => {
    const now = Date.now();
    const open = { name: 'rack-7-firmware', nodes: ['node-1'], start: new Date(now - 60_000).toISOString(), end: new Date(now + 60_000).toISOString() };
    const resetter = new ScriptedResetter(['reset']);
    const { processor, gates } = setUp(resetter, { windows: [open] });
    expect((await processor('reset_gpu')).detail).toBe(`in a scheduled maintenance window: node-1 (window rack-7-firmware, until ${open.end})`);
    expect(resetter.calls).toBe(0);
    expect((await gates.checkHolds(['node-1'], now + 120_000)).ok).toBe(true);
    expect([...gates.inMaintenance(now).keys()]).toEqual(['node-1']);
    expect(gates.inMaintenance(now + 120_000).size).toBe(0);
  });

  it('hands a node off: drains it, holds it as handed off, and posts the documented payload, retrying a failing receiver', async () => {
    const received: HandOffPayload[] = [];
    let answered = 0;
    const server = createServer((request, response) => {
      let body = '';
      request.on('data', (chunk: Buffer) => (body += chunk.toString()));
      request.on('end', () => {
        answered += 1;
        if (answered === 1) return void response.writeHead(503).end();
        received.push(handOffPayloadSchema.parse(JSON.parse(body)));
        response.writeHead(204).end();
      });
    });
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks/rma`;
    const { processor, backend, gates } = setUp(new ScriptedResetter(['reset']), { webhookUrl: url });
    const result = await processor('hand_off');
    expect(result.detail).toMatch(/^handed off to people: drained, held until \S+; webhook answered 204 \(attempt 2\)$/);
    expect((await backend.nodeState('node-1')).drained).toBe(true);
    expect((await gates.holds()).get('node-1')?.reason).toMatch(/^handed off: fatal Xid 48/);
    expect(received).toHaveLength(1);
    expect(received[0]).toMatchObject({ version: 1, kind: 'steadfast.node.handoff', node: 'node-1', decisionId: 'd-hand_off' });
    // Handed off: steadfast leaves the node alone until it is released.
    expect((await processor('reset_gpu', 'd-later')).state).toBe('refused');
  });

  it('asks no agent under a dry-run backend: the reset is recorded as done, the node left in service', async () => {
    const store = testRedis();
    stores.push(store);
    const audit = new AuditLog(store.redis, store.keys);
    const resetter = new ScriptedResetter(['reset']);
    const backend = new DryRunBackend(store.redis, store.keys);
    const steps = testStepProcessor(store, { backend, audit }, { resetter, remedies: remediesSchema.parse({ gpuReset: { busyRetries: 0 } }) });
    await steps(queued(nodeTransition('reset_gpu')));
    expect(resetter.calls).toBe(0);
    expect(await lastAction(audit, 'd-reset_gpu')).toEqual({
      state: 'done',
      detail: 'GPU 0000:3a:00 reset and listed again in 0.0 s; node returned to service',
    });
    expect((await backend.nodeState('node-1')).drained).toBe(false);
  });

  it('asks again while processes hold the GPU of a stopped job too, and keeps the node in the job once the reset holds', async () => {
    const store = testRedis();
    stores.push(store);
    const jobs = new JobStore(store.redis, store.keys);
    await jobs.create({ name: 'llama', nodes: ['node-0', 'node-1'], ranksPerNode: 1, launcher: 'accept', codeVersion: 'v1' });
    const audit = new AuditLog(store.redis, store.keys);
    // The job's ranks are still exiting after the stop: the first answer is "busy", the second a reset.
    const resetter = new ScriptedResetter(['refused', 'reset'], [7]);
    const steps = testStepProcessor(
      store,
      { backend: recordingBackend(store), audit, jobs },
      { resetter, remedies: remediesSchema.parse({ gpuReset: { busyRetries: 2, busyRetryDelaySeconds: 0 } }) },
    );
    const step = { verb: 'reset_gpu' as const, job: 'llama', nodes: ['node-1'], gpu: '0000:3a:00', reason: 'fatal Xid 48', citation: 'test' };
    await steps(queued({ v: 2, transitionId: 't-reset', job: 'llama', steps: [step] }));
    expect(resetter.calls).toBe(2);
    expect(await lastAction(audit, 't-reset:0')).toEqual({
      state: 'done',
      detail: 'GPU 0000:3a:00 of node-1 reset through its agent (GPU 2 reset and listed again); the job relaunches on the same nodes',
    });
    expect((await jobs.get('llama')).spec.nodes).toEqual(['node-0', 'node-1']);
  });
});
