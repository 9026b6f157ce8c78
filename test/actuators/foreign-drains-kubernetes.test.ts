import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { kubernetesBackend, type KubernetesBackend } from '../../actuators/kubernetes.js';
import { startKubeApi, type KubeApiStandIn, type RecordedExchange } from '../support/kube-api.js';

/**
 * Others' cordons on Kubernetes: a node an administrator cordoned (kubectl cordon: unschedulable,
 * no taint of steadfast's) is theirs; steadfast's own cordon carries its taint. steadfast's cordon
 * on such a node remembers theirs, and its resume lifts only its own marks. node-problem-detector's
 * conditions are read.
 */

const MERGE = 'application/merge-patch+json';
const GPU_TAINT = { key: 'nvidia.com/gpu', value: 'present', effect: 'NoSchedule' };
const OUR_TAINT = { key: 'steadfast.dev/drained', value: 'true', effect: 'NoSchedule' };

function node(name: string, spec: Record<string, unknown>, annotations: Record<string, string> = {}, conditions: unknown[] = []): unknown {
  return {
    kind: 'Node',
    apiVersion: 'v1',
    metadata: { name, resourceVersion: '700', annotations },
    spec,
    status: { conditions: [{ type: 'Ready', status: 'True', reason: 'KubeletReady' }, ...conditions] },
  };
}

function get(name: string, body: unknown): RecordedExchange {
  return { request: { method: 'GET', path: `/api/v1/nodes/${name}` }, response: { status: 200, body } };
}

function patch(name: string, body: unknown): RecordedExchange {
  return { request: { method: 'PATCH', path: `/api/v1/nodes/${name}`, contentType: MERGE, body }, response: { status: 200, body: {} } };
}

describe("Kubernetes: others' cordons are kept", () => {
  let api: KubeApiStandIn;
  let backend: KubernetesBackend;

  beforeAll(async () => {
    api = await startKubeApi();
    backend = kubernetesBackend({ connection: { kind: 'token', server: api.url, token: api.token, skipTlsVerify: true }, timeoutMs: 5000 });
  });
  afterEach(() => api.verify());
  afterAll(async () => api.close());

  it("reads an administrator's cordon as someone else's, and node-problem-detector's conditions (not the kubelet's) as problems", async () => {
    const conditions = [
      { type: 'MemoryPressure', status: 'False', reason: 'KubeletHasSufficientMemory' },
      { type: 'KernelDeadlock', status: 'True', reason: 'AUFSUmountHung' },
      { type: 'GpuHealthy', status: 'False', reason: 'Fine' },
    ];
    api.load([get('gpu-a01', node('gpu-a01', { unschedulable: true, taints: [GPU_TAINT] }, {}, conditions))]);
    expect(await backend.nodeState('gpu-a01')).toMatchObject({
      drained: true,
      foreign: 'cordoned by someone else',
      conditions: ['KernelDeadlock (AUFSUmountHung)'],
    });
  });

  it('cordons a node an administrator cordoned by adding its taint and a note of their cordon, then lifts only its own marks', async () => {
    const theirs = node('gpu-a02', { unschedulable: true, taints: [GPU_TAINT] });
    api.load([
      get('gpu-a02', theirs),
      patch('gpu-a02', {
        metadata: {
          resourceVersion: '700',
          annotations: { 'steadfast.dev/drain-reason': 'steadfast: GPU reset audit=d-1', 'steadfast.dev/cordoned-before': 'true' },
        },
        spec: { taints: [GPU_TAINT, OUR_TAINT] },
      }),
    ]);
    await backend.cordon('gpu-a02', 'steadfast: GPU reset audit=d-1');
    api.verify();

    const both = node(
      'gpu-a02',
      { unschedulable: true, taints: [GPU_TAINT, OUR_TAINT] },
      { 'steadfast.dev/drain-reason': 'steadfast: GPU reset audit=d-1', 'steadfast.dev/cordoned-before': 'true' },
    );
    api.load([get('gpu-a02', both)]);
    expect(await backend.nodeState('gpu-a02')).toMatchObject({ drained: true, foreign: 'cordoned by someone else before steadfast' });
    api.verify();

    // No `unschedulable: false` in the patch: their cordon stays.
    api.load([
      get('gpu-a02', both),
      patch('gpu-a02', {
        metadata: { resourceVersion: '700', annotations: { 'steadfast.dev/drain-reason': null, 'steadfast.dev/cordoned-before': null } },
        spec: { taints: [GPU_TAINT] },
      }),
    ]);
    await backend.resume('gpu-a02');
  });

  it('uncordons a node cordoned by someone else only with force', async () => {
    api.load([get('gpu-a03', node('gpu-a03', { unschedulable: true, taints: [GPU_TAINT] })), patch('gpu-a03', { spec: { unschedulable: false } })]);
    await backend.resume('gpu-a03', { force: true });
  });

  it('leaves a node cordoned by someone else alone on a plain resume: nothing of steadfast to lift, nothing written', async () => {
    api.load([get('gpu-a04', node('gpu-a04', { unschedulable: true, taints: [GPU_TAINT] }))]);
    await backend.resume('gpu-a04');
  });

  it('still uncordons a node steadfast alone cordoned', async () => {
    api.load([
      get('gpu-a05', node('gpu-a05', { unschedulable: true, taints: [GPU_TAINT, OUR_TAINT] }, { 'steadfast.dev/drain-reason': 'steadfast: x audit=d-2' })),
      patch('gpu-a05', {
        metadata: { resourceVersion: '700', annotations: { 'steadfast.dev/drain-reason': null } },
        spec: { unschedulable: false, taints: [GPU_TAINT] },
      }),
    ]);
    await backend.resume('gpu-a05');
  });
});
