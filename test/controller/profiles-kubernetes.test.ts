import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { kubernetesBackend, type KubernetesBackend } from '../../actuators/kubernetes.js';
import { AuditLog } from '../../core/audit.js';
import { RetryLaterError } from '../../core/errors.js';
import { profilesSchema } from '../../core/profiles.js';
import { ProfileResolver } from '../../controller/profile-resolver.js';
import { startKubeApi, type KubeApiStandIn } from '../support/kube-api.js';
import { testRedis } from '../support/redis.js';
import { lastAction, nodeTransition, queued, recordingBackend, testStepProcessor } from '../support/steps.js';

/** A Node as the API server answers `GET /api/v1/nodes/NAME`, with `labels`. */
function nodeWith(name: string, labels: Record<string, string>): { status: number; body: unknown } {
  return {
    status: 200,
    body: { apiVersion: 'v1', kind: 'Node', metadata: { name, resourceVersion: '7', labels }, spec: {}, status: { conditions: [] } },
  };
}

const PROFILES = profilesSchema.parse([
  { name: 'inference', match: { nodeLabels: { 'node.example.com/pool': 'inference' } }, dryRun: true },
  { name: 'h100', match: { nodeLabels: { 'nvidia.com/gpu.product': 'H100' } } },
]);

/** Profiles matched by Kubernetes node label, read through the API server (a stand-in replaying its answers). */
describe('profiles matched by Kubernetes node labels', () => {
  let api: KubeApiStandIn;
  let backend: KubernetesBackend;
  const stores: ReturnType<typeof testRedis>[] = [];

  beforeAll(async () => {
    api = await startKubeApi();
    backend = kubernetesBackend({ connection: { kind: 'token', server: api.url, token: api.token, skipTlsVerify: true }, timeoutMs: 5000 });
  });
  afterEach(async () => {
    api.verify();
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
  });
  afterAll(async () => api.close());

  it("reads a node's labels and matches the profile whose labels it all carries; a relabelled node moves once its labels are read again", async () => {
    api.answer('/api/v1/nodes/gpu-a01', nodeWith('gpu-a01', { 'node.example.com/pool': 'inference', 'kubernetes.io/os': 'linux' }));
    api.answer('/api/v1/nodes/gpu-b01', nodeWith('gpu-b01', { 'node.example.com/pool': 'training' }));
    let now = 1_000_000;
    const resolver = new ProfileResolver(PROFILES, { nodeLabels: (node) => backend.nodeLabels(node) }, { now: () => now, labelsTtlMs: 30_000 });
    expect(await resolver.resolve('gpu-a01')).toMatchObject({ kind: 'profile', profile: { name: 'inference' } });
    expect(await resolver.resolve('gpu-b01')).toEqual({ kind: 'none' });
    // Read once per node within the time labels are trusted.
    await resolver.resolve('gpu-a01');
    expect(api.served('/api/v1/nodes/gpu-a01')).toBe(1);

    api.answer('/api/v1/nodes/gpu-b01', nodeWith('gpu-b01', { 'node.example.com/pool': 'inference', 'nvidia.com/gpu.product': 'H100' }));
    expect(await resolver.resolve('gpu-b01')).toEqual({ kind: 'none' });
    now += 30_000;
    // Both profiles' labels now: a conflict, never the first one silently.
    expect(await resolver.resolve('gpu-b01')).toEqual({ kind: 'conflict', profiles: ['inference', 'h100'] });
  });

  it('answers a node it cannot read the labels of with a retry, never a guess; a node the API server does not know is in no profile', async () => {
    api.answer('/api/v1/nodes/gpu-c01', { status: 500, body: { kind: 'Status', code: 500, message: 'etcd timed out' } });
    api.answer('/api/v1/nodes/gpu-gone', { status: 404, body: { kind: 'Status', code: 404, reason: 'NotFound' } });
    const resolver = new ProfileResolver(PROFILES, { nodeLabels: (node) => backend.nodeLabels(node) });
    await expect(resolver.resolve('gpu-c01')).rejects.toBeInstanceOf(RetryLaterError);
    expect(await resolver.resolve('gpu-gone')).toEqual({ kind: 'none' });
  });

  it('records, without doing, the drain of a node whose labels put it in a dry-run profile, and names the profile in the audit', async () => {
    api.answer('/api/v1/nodes/gpu-a01', nodeWith('gpu-a01', { 'node.example.com/pool': 'inference' }));
    api.answer('/api/v1/nodes/gpu-b01', nodeWith('gpu-b01', { 'node.example.com/pool': 'training' }));
    const store = testRedis();
    stores.push(store);
    const audit = new AuditLog(store.redis, store.keys);
    const profiles = new ProfileResolver(PROFILES, { nodeLabels: (node) => backend.nodeLabels(node) });
    // A backend that acts (it records under another name): only the profile's dry-run keeps the drain from it.
    const steps = testStepProcessor(store, { backend: recordingBackend(store), audit }, { profiles });
    await steps(queued(nodeTransition('drain', { id: 'd-inf', node: 'gpu-a01' })));
    await steps(queued(nodeTransition('drain', { id: 'd-train', node: 'gpu-b01' })));
    const [inference] = await audit.read({ type: 'action', ref: 'd-inf', limit: 10 }).then((entries) => entries.filter((entry) => entry.data.state === 'done'));
    expect(inference?.data).toMatchObject({ backend: 'dry-run', profile: 'inference' });
    expect(inference?.summary).toMatch(/ \[profile inference\]$/);
    const training = await audit.read({ type: 'action', ref: 'd-train', limit: 10 });
    expect(training.map((entry) => entry.data.backend)).toEqual(['recorder', 'recorder']);
    expect(training.every((entry) => entry.data.profile === undefined && !entry.summary.includes('[profile'))).toBe(true);
    expect((await lastAction(audit, 'd-train')).state).toBe('done');
  });
});
