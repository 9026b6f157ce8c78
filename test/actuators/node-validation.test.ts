import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { AuditLog } from '../../core/audit.js';
import type { GpuResetReport } from '../../core/remedy.js';
import { VALIDATE_PATH, type ValidationReport } from '../../core/validation.js';
import { validationSchema } from '../../core/validation-config.js';
import { AgentNodeValidator, PeerThroughputs, judgeThroughput, type NodeValidator } from '../../actuators/node-validation.js';
import { RemediationHistory } from '../../actuators/remediation-history.js';
import type { GpuResetter } from '../../actuators/steps/gpu-resetter.js';
import { remediesSchema } from '../../core/remedy-config.js';
import { testRedis } from '../support/redis.js';
import { lastAction, nodeTransition, queued, recordingBackend, testStepProcessor } from '../support/steps.js';

const CONFIG = validationSchema.parse({ enabled: true, timeoutSeconds: 30 });

/** A report as the agent's validate endpoint gives it: the burn on one GPU at `tflops`, DCGM as given. */
function report(node: string, options: { tflops?: number; burn?: 'passed' | 'failed'; dcgm?: 'passed' | 'failed' | 'skipped' } = {}): ValidationReport {
  const burnOk = (options.burn ?? 'passed') === 'passed';
  const dcgm = options.dcgm ?? 'skipped';
  return {
    node,
    startedAt: new Date().toISOString(),
    seconds: 17.5,
    ok: burnOk && dcgm !== 'failed',
    checks: [
      {
        name: 'burn',
        result: burnOk ? 'passed' : 'failed',
        ok: burnOk,
        seconds: 17.2,
        outputTail: '',
        ...(burnOk ? {} : { reason: 'cuda:3: round 4: checksum off the CPU reference by 0.31 (tolerance 1e-05)' }),
      },
      {
        name: 'dcgm',
        result: dcgm,
        ok: dcgm !== 'failed',
        seconds: 0.3,
        outputTail: '',
        ...(dcgm === 'passed' ? {} : { reason: dcgm === 'failed' ? 'exited with status 226: | Memory | Fail' : 'DCGM is not installed here' }),
      },
    ],
    devices: [
      {
        device: 'cuda:0',
        name: 'NVIDIA H100 80GB HBM3',
        ok: burnOk,
        checksum_error: burnOk ? 1e-7 : 0.31,
        tflops: options.tflops ?? 50,
        seconds: 15,
        rounds: 700,
      },
    ],
  };
}

/** A stand-in for the nodes' agents: answers POST /api/v1/validate with each node's scripted report and counts the calls. */
async function standInAgents(reports: Map<string, ValidationReport>, servers: Server[]): Promise<{ url: string; calls: string[] }> {
  const calls: string[] = [];
  const server = createServer((request, response) => {
    const node = /^\/(?<node>[^/]+)(?<path>\/.*)$/.exec(request.url ?? '')?.groups;
    if (request.method !== 'POST' || node?.path !== VALIDATE_PATH || request.headers.authorization !== `Bearer token-${node.node}`) {
      response.writeHead(404).end();
      return;
    }
    calls.push(node.node!);
    response.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(reports.get(node.node!)));
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, calls };
}

function endpoints(url: string) {
  return { urls: async (nodes: readonly string[]) => new Map(nodes.map((node) => [node, `${url}/${node}`])), tokenFor: (node: string) => `token-${node}` };
}

class ResetsFine implements GpuResetter {
  async reset(node: string, gpu: string): Promise<GpuResetReport> {
    return { node, gpu, index: 2, outcome: 'reset', processes: [], stopped: [], reason: 'GPU 2 reset and listed again', seconds: 0.5 };
  }
}

describe('validation before a node returns to service', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  const servers: Server[] = [];
  afterEach(async () => {
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
    await Promise.all(servers.splice(0).map((server) => new Promise((resolve) => server.close(resolve))));
  });

  it('judges a node slow below the configured share of its peers’ median, and only with enough peers', () => {
    const options = { minPeers: 3, minPeerFraction: 0.8 };
    expect(judgeThroughput(39, [50, 49, 51], options)).toEqual({ slow: true, median: 50 });
    expect(judgeThroughput(41, [50, 49, 51], options)).toEqual({ slow: false, median: 50 });
    expect(judgeThroughput(41, [40, 50, 60, 70], options)).toEqual({ slow: true, median: 55 });
    // Two peers are too few: only the reference comparison decides.
    expect(judgeThroughput(1, [50, 50], options)).toEqual({ slow: false });
  });

  it('compares a node’s burn throughput with its peers of the same model validated within the window, keeping a bounded history', async () => {
    const store = testRedis();
    stores.push(store);
    const reports = new Map(['n1', 'n2', 'n3', 'n4'].map((node) => [node, report(node, { tflops: 50 })]));
    reports.set('slow', report('slow', { tflops: 30 }));
    const agents = await standInAgents(reports, servers);
    const throughputs = new PeerThroughputs(store.redis, store.keys, 3);
    let now = Date.parse('2025-01-01T00:00:00Z');
    const validator = new AgentNodeValidator(endpoints(agents.url), throughputs, CONFIG, fetch, () => now);
    // The first nodes have too few peers to compare with: their burn alone decides.
    const first = await validator.validate('n1');
    expect(first).toMatchObject({ ok: true });
    expect(first.detail).toBe('burn passed in 17.2 s, dcgm skipped in 0.3 s (DCGM is not installed here); burn 50.0 TFLOPS (0 peers: too few to compare)');
    for (const node of ['n2', 'n3']) expect((await validator.validate(node)).ok).toBe(true);
    const slow = await validator.validate('slow');
    expect(slow).toMatchObject({ ok: false, failed: 'throughput' });
    expect(slow.detail).toBe(
      "burn passed in 17.2 s, dcgm skipped in 0.3 s (DCGM is not installed here); burn 30.0 TFLOPS is below 0.8 of its 3 peers' median 50.0 TFLOPS",
    );
    expect((await validator.validate('n4')).detail).toMatch(/burn 50\.0 TFLOPS against its 4 peers' median 50\.0 TFLOPS$/);
    // Peers validated longer ago than the window do not count.
    now += (CONFIG.peerWindowSeconds + 1) * 1000;
    expect((await validator.validate('slow')).detail).toMatch(/\(0 peers: too few to compare\)$/);
    for (let round = 0; round < 5; round += 1) await validator.validate('n1');
    expect(await throughputs.history('n1')).toHaveLength(3);
  });

  it('fails a node whose burn or DCGM fails, or whose agent cannot be asked, naming the check', async () => {
    const store = testRedis();
    stores.push(store);
    const agents = await standInAgents(
      new Map([
        ['bad', report('bad', { burn: 'failed' })],
        ['ecc', report('ecc', { dcgm: 'failed' })],
      ]),
      servers,
    );
    const validator = new AgentNodeValidator(endpoints(agents.url), new PeerThroughputs(store.redis, store.keys, 10), CONFIG);
    expect(await validator.validate('bad')).toMatchObject({ ok: false, failed: 'burn' });
    expect(await validator.validate('ecc')).toMatchObject({ ok: false, failed: 'dcgm' });
    const gone = new AgentNodeValidator(endpoints('http://127.0.0.1:1'), new PeerThroughputs(store.redis, store.keys, 10), CONFIG);
    const unreachable = await gone.validate('n1');
    expect(unreachable).toMatchObject({ ok: false, failed: 'agent' });
    expect(unreachable.detail).toMatch(/could not be reached/);
  });

  function resetSetUp(reports: Map<string, ValidationReport>, url: string) {
    const store = testRedis();
    stores.push(store);
    const audit = new AuditLog(store.redis, store.keys);
    const backend = recordingBackend(store);
    const history = new RemediationHistory(store.redis, store.keys, 10);
    const validator = new AgentNodeValidator(endpoints(url), new PeerThroughputs(store.redis, store.keys, 10), CONFIG);
    const steps = testStepProcessor(
      store,
      { backend, audit },
      { history, resetter: new ResetsFine(), validator, remedies: remediesSchema.parse({ gpuReset: { enabled: true } }) },
    );
    return { store, audit, backend, history, steps, reports };
  }

  it('after a GPU reset outside a job, keeps a node whose validation fails drained with a reason naming the check, and validates once however often the step is redelivered', async () => {
    const reports = new Map([['node-1', report('node-1', { burn: 'failed' })]]);
    const agents = await standInAgents(reports, servers);
    const { audit, backend, history, steps } = resetSetUp(reports, agents.url);
    await steps(queued(nodeTransition('reset_gpu')));
    const state = await backend.nodeState('node-1');
    expect(state.drained).toBe(true);
    expect(state.reason).toMatch(
      /^steadfast: GPU 0000:3a:00 reset \(GPU 2 reset and listed again\); validation failed \(burn\): burn failed in 17\.2 s \(cuda:3: round 4: checksum off/,
    );
    const action = await lastAction(audit, 'd-reset_gpu');
    expect(action.state).toBe('done');
    expect(action.detail).toMatch(/validation failed \(burn\): .*; node kept out of service$/);
    expect((await history.read('node-1')).map((entry) => `${entry.action} ${entry.outcome}`)).toEqual(['drain done', 'reset_gpu done']);
    expect(await steps(queued(nodeTransition('reset_gpu'), 1))).toEqual({ done: 0, halted: undefined });
    expect(agents.calls).toEqual(['node-1']);
  });

  it('after a GPU reset outside a job, returns a node whose validation passes to service and says so in the audit', async () => {
    const reports = new Map([['node-1', report('node-1', { dcgm: 'passed' })]]);
    const agents = await standInAgents(reports, servers);
    const { audit, backend, steps } = resetSetUp(reports, agents.url);
    await steps(queued(nodeTransition('reset_gpu')));
    expect((await backend.nodeState('node-1')).drained).toBe(false);
    expect(await lastAction(audit, 'd-reset_gpu')).toEqual({
      state: 'done',
      detail: 'GPU 0000:3a:00 (index 2) reset and listed again in 0.5 s; node returned to service',
    });
    const entries = await audit.read({ limit: 20 });
    expect(entries.map((entry) => entry.summary)).toContainEqual(
      expect.stringMatching(
        /running \(node-1 validated before its return to service in [\d.]+ s: burn passed in 17\.2 s, dcgm passed in 0\.3 s; burn 50\.0 TFLOPS/,
      ),
    );
    expect(agents.calls).toEqual(['node-1']);
  });

  it("keeps the node's lease for as long as a validation may take, past the 60 s a step's lease lasts", async () => {
    const store = testRedis();
    stores.push(store);
    const backend = recordingBackend(store);
    let leaseMs = -1;
    // A validator as long as the agent's: it looks at the lease while it runs.
    const validator: NodeValidator = {
      maxSeconds: 315,
      validate: async () => {
        leaseMs = await store.redis.pttl(store.keys.nodeLease('node-1'));
        return { ok: true, detail: 'burn passed', seconds: 0 };
      },
    };
    const steps = testStepProcessor(
      store,
      { backend, audit: new AuditLog(store.redis, store.keys) },
      {
        history: new RemediationHistory(store.redis, store.keys, 10),
        resetter: new ResetsFine(),
        validator,
        remedies: remediesSchema.parse({ gpuReset: { enabled: true } }),
      },
    );
    await steps(queued(nodeTransition('reset_gpu')));
    expect(leaseMs).toBeGreaterThan(315_000);
    expect((await backend.nodeState('node-1')).drained).toBe(false);
    // The step let go of it once done.
    expect(await store.redis.exists(store.keys.nodeLease('node-1'))).toBe(0);
  });
});
