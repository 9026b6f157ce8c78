import { afterEach, describe, expect, it } from 'vitest';
import type { AuditEntry } from '../../core/audit.js';
import { profilesSchema } from '../../core/profiles.js';
import { xidPolicyLayerSchema } from '../../core/xid-policy.js';
import type { Controller } from '../../controller/service.js';
import { DryRunBackend } from '../../actuators/dry-run.js';
import { agentToken, post, READ_ONLY_TOKEN, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

/** One fast-path Xid; each occurrence its own time, as the agent sends it when it reads the line. */
function xidEvent(node: string, xid: number, at: Date, gpu = '0000:3a:00'): Record<string, unknown> {
  return { kind: 'xid', node, gpu, xid, message: `NVRM: Xid (PCI:${gpu}): ${xid}, pid=1234`, time: at.toISOString() };
}

const signals = (entries: AuditEntry[]): AuditEntry[] => entries.filter((entry) => entry.type === 'signal');
const finished = (entries: AuditEntry[]): boolean =>
  entries.some((entry) => entry.type === 'action' && ['done', 'refused', 'failed'].includes(String(entry.data.state)));

describe('a configured Xid policy decides over the catalogue (real Redis, dry-run backend)', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  const controllers: Controller[] = [];
  afterEach(async () => {
    await Promise.all(controllers.splice(0).map((controller) => controller.close()));
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
  });

  async function setUp(xidPolicy: unknown, profiles: unknown = []): Promise<{ store: ReturnType<typeof testRedis>; controller: Controller; url: string }> {
    const store = testRedis();
    stores.push(store);
    const config = { ...testConfig(store.url, store.prefix), xidPolicy: xidPolicyLayerSchema.parse(xidPolicy), profiles: profilesSchema.parse(profiles) };
    const { controller, url } = await startController(config);
    controllers.push(controller);
    return { store, controller, url };
  }

  it('drains a node on the third Xid 13 within 10 minutes, observing the first two with their count', async () => {
    const { store, controller, url } = await setUp({ xid: { '13': { action: 'drain', count: 3, windowSeconds: 600 } } });
    const start = Date.now() - 60_000;
    for (const [index, expected] of ['1 of 3', '2 of 3'].entries()) {
      expect((await post(`${url}/api/v1/signals`, xidEvent('node-3', 13, new Date(start + index * 1000)))).status).toBe(202);
      const entries = await until(
        `signal ${index + 1} audited`,
        () => controller.audit.read({ node: 'node-3' }),
        (list) => signals(list).length === index + 1,
      );
      expect(signals(entries).find((entry) => entry.summary.includes(expected))?.summary).toBe(
        `agent reports Xid 13 on node-3 GPU 0000:3a:00; no action: Xid 13 on node-3: ${expected} within 600 s (configuration): no action yet`,
      );
      expect(entries.filter((entry) => entry.type === 'decision')).toHaveLength(0);
    }
    expect((await post(`${url}/api/v1/signals`, xidEvent('node-3', 13, new Date(start + 2000)))).status).toBe(202);
    const entries = await until('the drain carried out', () => controller.audit.read({ node: 'node-3' }), finished);
    const decisions = entries.filter((entry) => entry.type === 'decision');
    expect(decisions.map((entry) => entry.summary)).toEqual([
      'drain node-3: Xid 13 (graphics engine exception, usually the application) on GPU 0000:3a:00: configuration says drain',
    ]);
    const drained = await new DryRunBackend(store.redis, store.keys).recorded();
    expect(Object.keys(drained)).toEqual(['node-3']);
  });

  it('only observes a fatal Xid 48 configured to observe, and drains on a non-fatal Xid 31 configured to drain', async () => {
    const { store, controller, url } = await setUp({ xid: { '48': { action: 'observe' }, '31': { action: 'drain' } } });
    expect((await post(`${url}/api/v1/signals`, xidEvent('node-4', 48, new Date()))).status).toBe(202);
    const observed = await until(
      'Xid 48 audited',
      () => controller.audit.read({ node: 'node-4' }),
      (list) => signals(list).length === 1,
    );
    expect(observed.map((entry) => entry.summary)).toEqual([
      'agent reports Xid 48 on node-4 GPU 0000:3a:00; no action: Xid 48 is observed only (configuration)',
    ]);

    expect((await post(`${url}/api/v1/signals`, xidEvent('node-5', 31, new Date()))).status).toBe(202);
    const drained = await until('the Xid 31 drain carried out', () => controller.audit.read({ node: 'node-5' }), finished);
    expect(drained.filter((entry) => entry.type === 'decision').map((entry) => entry.summary)).toEqual([
      'drain node-5: Xid 31 (GPU memory page fault, usually the application) on GPU 0000:3a:00: configuration says drain',
    ]);
    const recorded = await new DryRunBackend(store.redis, store.keys).recorded();
    expect(Object.keys(recorded)).toEqual(['node-5']);
    // Node-4's Xid 48 decided nothing, though the catalogue would have drained it.
    expect((await controller.audit.read({ node: 'node-4' })).filter((entry) => entry.type === 'decision')).toHaveLength(0);
  });

  it('tells an agent which codes to send on its fast path beyond the fatal ones, and no read-only credential', async () => {
    const { url } = await setUp({
      xid: { '13': { action: 'drain', count: 3, windowSeconds: 600 }, '31': { action: 'observe' }, '48': { action: 'ignore' } },
      sxid: { '20034': { action: 'hand_off' } },
    });
    const get = (token: string) => fetch(`${url}/api/v1/xid-policy`, { headers: { authorization: `Bearer ${token}` } });
    const answer = await get(agentToken('node-3'));
    expect(answer.status).toBe(200);
    expect(await answer.json()).toEqual({ version: 1, fastPath: { xid: [13], sxid: [20034] } });
    expect((await get(READ_ONLY_TOKEN)).status).toBe(403);
  });

  it("drains a node on a configured SXid sent on the agent's fast path, naming the NVSwitch", async () => {
    const { controller, url } = await setUp({ sxid: { '20034': { action: 'drain' } } });
    const event = {
      kind: 'sxid',
      node: 'node-6',
      sxid: 20034,
      nvswitch: '0000:05:00.0',
      message: 'nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Non-fatal, Link 30 LTSSM Fault Up',
      time: new Date().toISOString(),
    };
    expect((await post(`${url}/api/v1/signals`, event)).status).toBe(202);
    const entries = await until('the SXid drain carried out', () => controller.audit.read({ node: 'node-6' }), finished);
    expect(entries.filter((entry) => entry.type === 'decision').map((entry) => entry.summary)).toEqual([
      'drain node-6: SXid 20034 (NVSwitch error) on NVSwitch 0000:05:00.0: configuration says drain',
    ]);
  });

  it("lays a profile's Xid policy over the configuration's for the profile's nodes only, naming the profile", async () => {
    const { store, controller, url } = await setUp({ xid: { '31': { action: 'drain' } } }, [
      { name: 'burn-in', match: { nodes: ['node-7'] }, xidPolicy: { xid: { '31': { action: 'observe' }, '13': { action: 'drain' } } } },
    ]);
    // The agents learn every code some group acts on.
    const policy = await fetch(`${url}/api/v1/xid-policy`, { headers: { authorization: `Bearer ${agentToken('node-1')}` } });
    expect(((await policy.json()) as { fastPath: { xid: number[] } }).fastPath.xid).toEqual([13, 31]);

    expect((await post(`${url}/api/v1/signals`, xidEvent('node-7', 31, new Date()))).status).toBe(202);
    const observed = await until(
      'Xid 31 on node-7 audited',
      () => controller.audit.read({ node: 'node-7' }),
      (list) => signals(list).length === 1,
    );
    expect(observed.map((entry) => entry.summary)).toEqual([
      'agent reports Xid 31 on node-7 GPU 0000:3a:00; no action: Xid 31 is observed only (profile burn-in)',
    ]);
    expect((await post(`${url}/api/v1/signals`, xidEvent('node-7', 13, new Date()))).status).toBe(202);
    const drained = await until('the Xid 13 drain carried out', () => controller.audit.read({ node: 'node-7' }), finished);
    expect(drained.filter((entry) => entry.type === 'decision').map((entry) => entry.summary)).toEqual([
      'drain node-7: Xid 13 (graphics engine exception, usually the application) on GPU 0000:3a:00: profile burn-in says drain [profile burn-in]',
    ]);
    // A node in no profile keeps the configuration's rule.
    expect((await post(`${url}/api/v1/signals`, xidEvent('node-8', 31, new Date()))).status).toBe(202);
    await until('the Xid 31 drain of node-8 carried out', () => controller.audit.read({ node: 'node-8' }), finished);
    expect(Object.keys(await new DryRunBackend(store.redis, store.keys).recorded()).sort()).toEqual(['node-7', 'node-8']);
  });
});
