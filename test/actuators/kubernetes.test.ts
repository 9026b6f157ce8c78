import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createTcpServer, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { DoNotRetryError, RetryLaterError } from '../../core/errors.js';
import { kubernetesBackend, type KubernetesBackend } from '../../actuators/kubernetes.js';
import { recordedExchanges, startKubeApi, type KubeApiStandIn } from '../support/kube-api.js';

const XID_REASON = 'steadfast: fatal Xid 79 on GPU 0000:3a:00 audit=d-123';

function backendFor(server: string, token: string, timeoutMs = 5000): KubernetesBackend {
  return kubernetesBackend({ connection: { kind: 'token', server, token, skipTlsVerify: true }, timeoutMs });
}

async function rejection(promise: Promise<unknown>): Promise<Error> {
  const error: unknown = await promise.then(
    () => undefined,
    (reason: unknown) => reason,
  );
  if (!(error instanceof Error)) throw new Error('expected the call to reject with an Error');
  return error;
}

describe('Kubernetes backend against recorded API exchanges', () => {
  let api: KubeApiStandIn;
  let backend: KubernetesBackend;

  beforeAll(async () => {
    api = await startKubeApi();
    backend = backendFor(api.url, api.token);
  });
  afterEach(() => api.verify());
  afterAll(async () => api.close());

  it('reads a schedulable node as in service and a cordoned, tainted one as drained with its reason', async () => {
    api.load(recordedExchanges('node-state'));
    expect(await backend.nodeState('gpu-a01')).toEqual({
      node: 'gpu-a01',
      exists: true,
      drained: false,
      reason: undefined,
      raw: 'Ready=True, unschedulable=false',
    });
    expect(await backend.nodeState('gpu-b07')).toEqual({
      node: 'gpu-b07',
      exists: true,
      drained: true,
      reason: 'steadfast: fatal Xid 79 on GPU 0000:5d:00 audit=d-88',
      raw: 'Ready=Unknown, unschedulable=true',
    });
  });

  it('drains a schedulable node with one merge patch (cordon, taint kept beside the GPU taint, reason) and evicts its pods except DaemonSet and mirror pods', async () => {
    api.load(recordedExchanges('drain-schedulable'));
    await backend.drain('gpu-a01', XID_REASON);
  });

  it('drains a node already drained with reads only: it lists the pods, finds none to move, and writes nothing', async () => {
    api.load(recordedExchanges('drain-already-drained'));
    await backend.drain('gpu-b07', 'steadfast: a later report audit=d-99');
  });

  it('reports a node the API server does not know as not existing, and refuses to drain it without retry', async () => {
    api.load(recordedExchanges('node-not-found'));
    expect(await backend.nodeState('gpu-zz9')).toMatchObject({ node: 'gpu-zz9', exists: false, drained: false });
    const error = await rejection(backend.drain('gpu-zz9', XID_REASON));
    expect(error).toBeInstanceOf(DoNotRetryError);
    expect(error.message).toContain('gpu-zz9 does not exist');
  });

  it('asks for a retry naming the pod when a PodDisruptionBudget blocks its eviction, after evicting the rest and accepting a pod that vanished', async () => {
    api.load(recordedExchanges('drain-pdb-blocked'));
    const error = await rejection(backend.drain('gpu-a02', XID_REASON));
    expect(error).toBeInstanceOf(RetryLaterError);
    expect(error.message).toContain('inference/reward-model-7f8d9c6b5-h3k8m');
    expect(error.message).toContain('disruption budget');
    expect(error.message).not.toContain('llama-70b-worker-4');
  });

  it('asks for a retry when the node changed under the taint patch (409), without evicting anything', async () => {
    api.load(recordedExchanges('drain-conflict'));
    const error = await rejection(backend.drain('gpu-a03', 'steadfast: NVLink down on GPU 0000:3a:00 audit=d-125'));
    expect(error).toBeInstanceOf(RetryLaterError);
    expect(error.message).toContain('HTTP 409');
  });

  it('resumes a drained node by uncordoning and removing only its own taint and annotation, and a second resume writes nothing', async () => {
    api.load(recordedExchanges('resume'));
    await backend.resume('gpu-b09');
    await backend.resume('gpu-b09');
  });

  it('holds a node as standby with a role label and a NoSchedule taint, once', async () => {
    api.load(recordedExchanges('standby-hold'));
    await backend.holdStandby('gpu-c01');
    await backend.holdStandby('gpu-c01');
  });

  it('relaunches a training workload by deleting its pods for their controller to recreate', async () => {
    api.load(recordedExchanges('relaunch'));
    expect(await backend.relaunchWorkload('train', 'training.kubeflow.org/job-name=llama-70b')).toBe(2);
  });

  it('refuses a set-based pod selector without asking the API server', async () => {
    const error = await rejection(backend.relaunchWorkload('train', 'job in (a,b)'));
    expect(error).toBeInstanceOf(DoNotRetryError);
  });

  it('lists the standbys by their role label, sorted by name', async () => {
    api.load(recordedExchanges('standby-list'));
    expect(await backend.standbys()).toEqual(['gpu-c01', 'gpu-c02']);
  });

  it('activates a standby for a job once, and refuses to hand it to a second job', async () => {
    api.load(recordedExchanges('standby-activate'));
    await backend.activateStandby('gpu-c01', 'llama-70b');
    await backend.activateStandby('gpu-c01', 'llama-70b');
    const error = await rejection(backend.activateStandby('gpu-c01', 'mixtral-8x22b'));
    expect(error).toBeInstanceOf(DoNotRetryError);
    expect(error.message).toContain('already active for job llama-70b');
  });

  it('sends no request at all for a node name or job that Kubernetes would not accept', async () => {
    api.load([]);
    for (const name of ['', '--all', 'gpu a01', 'GPU-A01', 'gpu_a01', '../nodes', 'gpu-a01/proxy', '-gpu']) {
      await expect(backend.drain(name, XID_REASON)).rejects.toBeInstanceOf(DoNotRetryError);
      await expect(backend.nodeState(name)).rejects.toBeInstanceOf(DoNotRetryError);
      await expect(backend.resume(name)).rejects.toBeInstanceOf(DoNotRetryError);
      await expect(backend.holdStandby(name)).rejects.toBeInstanceOf(DoNotRetryError);
      await expect(backend.activateStandby(name, 'llama-70b')).rejects.toBeInstanceOf(DoNotRetryError);
    }
    for (const job of ['', 'job with spaces', '-leading-dash', 'x'.repeat(64), 'a/b']) {
      await expect(backend.activateStandby('gpu-c01', job)).rejects.toBeInstanceOf(DoNotRetryError);
    }
  });

  it('answers 403 on the node patch with a do-not-retry error naming the missing "patch nodes" permission', async () => {
    api.load(recordedExchanges('forbidden-patch'));
    const error = await rejection(backend.drain('gpu-a03', 'steadfast: NVLink down on GPU 0000:3a:00 audit=d-125'));
    expect(error).toBeInstanceOf(DoNotRetryError);
    expect(error.message).toContain('"patch nodes"');
  });

  it('answers 403 on an eviction with a do-not-retry error naming the missing "create pods/eviction" permission', async () => {
    api.load(recordedExchanges('forbidden-eviction'));
    const error = await rejection(backend.drain('gpu-a01', XID_REASON));
    expect(error).toBeInstanceOf(DoNotRetryError);
    expect(error.message).toContain('"create pods/eviction"');
  });

  it("connects through the chosen context of a kubeconfig file, with that context's token", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'steadfast-kubeconfig-'));
    try {
      const path = join(dir, 'config');
      writeFileSync(
        path,
        [
          'apiVersion: v1',
          'kind: Config',
          'current-context: other',
          'clusters:',
          `- name: stand-in\n  cluster:\n    server: ${api.url}\n    insecure-skip-tls-verify: true`,
          '- name: elsewhere\n  cluster:\n    server: https://192.0.2.1:6443',
          'users:',
          `- name: steadfast\n  user:\n    token: ${api.token}`,
          '- name: someone\n  user:\n    token: not-ours',
          'contexts:',
          '- name: steadfast\n  context:\n    cluster: stand-in\n    user: steadfast',
          '- name: other\n  context:\n    cluster: elsewhere\n    user: someone',
          '',
        ].join('\n'),
      );
      api.load(recordedExchanges('standby-list'));
      const fromFile = kubernetesBackend({ connection: { kind: 'kubeconfig', path, context: 'steadfast' }, timeoutMs: 5000 });
      expect(await fromFile.standbys()).toEqual(['gpu-c01', 'gpu-c02']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('asks for a retry when the API server answers 503', async () => {
    api.load(recordedExchanges('server-unavailable'));
    await expect(backend.nodeState('gpu-a01')).rejects.toBeInstanceOf(RetryLaterError);
  });
});

describe('Kubernetes backend when the API server cannot be reached', () => {
  it('asks for a retry when nothing listens at the server address', async () => {
    const probe = createTcpServer();
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
    const { port } = probe.address() as AddressInfo;
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    const error = await rejection(backendFor(`http://127.0.0.1:${port}`, 'any-token').nodeState('gpu-a01'));
    expect(error).toBeInstanceOf(RetryLaterError);
    expect(error.message).toContain('unreachable');
  });

  it('asks for a retry when the API server accepts the connection but never answers within timeoutMs', async () => {
    const sockets: Socket[] = [];
    const silent = createTcpServer((socket) => sockets.push(socket));
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const { port } = silent.address() as AddressInfo;
    try {
      const started = Date.now();
      const error = await rejection(backendFor(`http://127.0.0.1:${port}`, 'any-token', 300).nodeState('gpu-a01'));
      expect(error).toBeInstanceOf(RetryLaterError);
      expect(Date.now() - started).toBeLessThan(5000);
    } finally {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => silent.close(() => resolve()));
    }
  });
});
