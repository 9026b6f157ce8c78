import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Controller } from '../../controller/service.js';
import { post, startController, testConfig } from '../support/controller.js';
import { recordedExchanges, startKubeApiOverTls, type KubeApiStandIn, type RecordedExchange } from '../support/kube-api.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

const WORKLOAD_PATH = '/apis/kubeflow.org/v1/namespaces/train/pytorchjobs/llama';
/** Ticks come every 5 s; a read or two of the workload is what the test waits for. */
const TICKS_MS = 20_000;

/** The recorded PyTorchJob answers (workload-pytorchjob.json): llama's Succeeded, and mistral's Failed served as llama's. */
function pytorchJobAnswers(): { failed: RecordedExchange['response']; succeeded: RecordedExchange['response'] } {
  const [, , succeeded, failed] = recordedExchanges('workload-pytorchjob').map((exchange) => exchange.response);
  if (!succeeded || !failed) throw new Error('workload-pytorchjob.json lacks an answer');
  return { failed, succeeded };
}

/**
 * A controller on the Kubernetes backend, against a stand-in API server that answers its node
 * reads (the job's nodes, and the standby list the scan for others' drains reads) and its reads
 * of the job's PyTorchJob: a failed PyTorchJob leaves the job to recovery,
 * a succeeded one marks it finished, its nodes out of its ladder.
 */
describe('job end on the Kubernetes backend', () => {
  const store = testRedis();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-k8s-job-end-'));
  let api: KubeApiStandIn;
  let controller: Controller;
  let url: string;
  let config: ReturnType<typeof testConfig>;
  const launchers = {
    pytorchjob: { kind: 'kubernetes', namespace: 'train', workload: 'pytorchjobs.kubeflow.org/llama', podSelector: 'training.kubeflow.org/job-name=llama' },
    gemma: { kind: 'kubernetes', namespace: 'train', workload: 'pytorchjobs.kubeflow.org/gemma', podSelector: 'training.kubeflow.org/job-name=gemma' },
  };
  const JOB = { name: 'llama', nodes: ['gpu-a01', 'gpu-b07'], ranksPerNode: 1, topology: { dp: 2 }, launcher: 'pytorchjob', codeVersion: 'v1' };

  /** The nodes' reads, answered until the next `api.verify()`. */
  function answerNodeReads(): void {
    const [a01, b07] = recordedExchanges('node-state');
    if (!a01 || !b07) throw new Error('node-state.json lacks a node');
    api.answer(a01.request.path, a01.response);
    api.answer(b07.request.path, b07.response);
    // With no standby pool configured, the scan for others' drains reads the backend's standbys: none here.
    const [standbys] = recordedExchanges('standby-list');
    if (!standbys) throw new Error('standby-list.json lacks the list');
    const body = standbys.response.body as Record<string, unknown>;
    api.answer(standbys.request.path, { ...standbys.response, body: { ...body, items: [] } }, standbys.request.query);
  }

  beforeAll(async () => {
    const served = await startKubeApiOverTls(root);
    api = served.api;
    const { caFile, tokenFile } = served;
    answerNodeReads();
    const backend = { kind: 'kubernetes', kubernetes: { connection: 'token', server: api.url, tokenFile, caFile } };
    config = testConfig(store.url, store.prefix, { backend, launchers });
    ({ controller, url } = await startController(config));
  });
  afterAll(async () => {
    await controller.close();
    await store.cleanup();
    await api.close();
    rmSync(root, { recursive: true, force: true });
  });

  it('leaves a job whose PyTorchJob failed to recovery, and marks it finished once its PyTorchJob succeeded', async () => {
    const answers = pytorchJobAnswers();
    api.answer(WORKLOAD_PATH, answers.failed);
    const registered = await post(`${url}/api/v1/jobs`, JOB);
    expect(registered.body.error).toBeUndefined();
    expect(registered.status).toBe(201);
    // Two reads: the first tick has decided by the time the second one asks.
    await until(
      'two reads of the failed PyTorchJob',
      async () => api.served(WORKLOAD_PATH),
      (count) => count >= 2,
      TICKS_MS,
    );
    expect((await controller.jobs.get('llama')).state).toBe('running');

    api.answer(WORKLOAD_PATH, answers.succeeded);
    const finished = await until(
      'job finished',
      () => controller.jobs.get('llama'),
      (record) => record.state === 'finished',
      TICKS_MS,
    );
    expect(finished.stateReason).toBe('pytorchjobs.kubeflow.org train/llama is Succeeded');
    expect(await controller.jobs.jobOnNode('gpu-a01')).toBeUndefined();
    expect((await controller.audit.read({ limit: 50 })).map((entry) => entry.summary)).toContain(
      'llama: finished (pytorchjobs.kubeflow.org train/llama is Succeeded); its nodes leave its recovery ladder',
    );
    api.verify();
  }, 60_000);

  it('marks a job finished when its PyTorchJob, seen by a controller before a restart, is deleted while it is down', async () => {
    const answers = pytorchJobAnswers();
    const deleted = recordedExchanges('workload-deleted')[0]?.response;
    if (!deleted) throw new Error('workload-deleted.json lacks the 404');
    const path = WORKLOAD_PATH.replace('/llama', '/gemma');
    answerNodeReads();
    api.answer(path, answers.failed);
    const gemma = { ...JOB, name: 'gemma', nodes: ['gpu-a01'], topology: { dp: 1 }, launcher: 'gemma' };
    const registered = await post(`${url}/api/v1/jobs`, gemma);
    expect(registered.body.error).toBeUndefined();
    expect(registered.status).toBe(201);
    await until(
      'two reads of the PyTorchJob',
      async () => api.served(path),
      (count) => count >= 2,
      TICKS_MS,
    );
    await controller.close();

    // The workload is deleted while no controller runs; the next one reads 404 on its first look.
    api.answer(path, deleted);
    ({ controller, url } = await startController(config));
    const finished = await until(
      'job finished',
      () => controller.jobs.get('gemma'),
      (record) => record.state === 'finished',
      TICKS_MS,
    );
    expect(finished.stateReason).toBe('pytorchjobs.kubeflow.org train/gemma was deleted');
    expect(await controller.jobs.jobOnNode('gpu-a01')).toBeUndefined();
  }, 60_000);
});
