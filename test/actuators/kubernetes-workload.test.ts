import { readFileSync } from 'node:fs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { DoNotRetryError } from '../../core/errors.js';
import type { Launcher } from '../../core/launcher.js';
import { kubernetesBackend, type KubernetesBackend } from '../../actuators/kubernetes.js';
import { WORKLOAD_KINDS } from '../../actuators/kubernetes-workload.js';
import { recordedExchanges, startKubeApi, type KubeApiStandIn } from '../support/kube-api.js';

function launcher(workload: string): Launcher {
  return { kind: 'kubernetes', namespace: 'train', workload, podSelector: `job-name=${workload.split('/')[1] ?? ''}` };
}

describe("reading whether a Kubernetes job's workload ended, against recorded API exchanges", () => {
  let api: KubeApiStandIn;
  let backend: KubernetesBackend;

  beforeAll(async () => {
    api = await startKubeApi();
    backend = kubernetesBackend({ connection: { kind: 'token', server: api.url, token: api.token, skipTlsVerify: true }, timeoutMs: 5000 });
  });
  afterEach(() => api.verify());
  afterAll(async () => api.close());

  it('reads a batch/v1 Job: running and suspended are active, Complete is completed, Failed is failed (for recovery, not finished)', async () => {
    api.load(recordedExchanges('workload-batch-job'));
    expect(await backend.workloadState('llama', launcher('jobs.batch/llama'))).toEqual({
      state: 'active',
      detail: 'jobs.batch train/llama is without conditions yet',
    });
    expect(await backend.workloadState('llama', launcher('jobs.batch/llama'))).toEqual({ state: 'completed', detail: 'jobs.batch train/llama is Complete' });
    expect(await backend.workloadState('mistral', launcher('jobs.batch/mistral'))).toEqual({
      state: 'failed',
      detail: 'jobs.batch train/mistral is Failed (BackoffLimitExceeded)',
    });
    expect(await backend.workloadState('queued', launcher('jobs.batch/queued'))).toEqual({ state: 'active', detail: 'jobs.batch train/queued is Suspended' });
  });

  it('reads a Kubeflow PyTorchJob: Running and Restarting are active, Succeeded is completed, Failed is failed', async () => {
    api.load(recordedExchanges('workload-pytorchjob'));
    const llama = launcher('pytorchjobs.kubeflow.org/llama');
    expect(await backend.workloadState('llama', llama)).toEqual({ state: 'active', detail: 'pytorchjobs.kubeflow.org train/llama is Created, Running' });
    expect(await backend.workloadState('llama', llama)).toEqual({ state: 'active', detail: 'pytorchjobs.kubeflow.org train/llama is Created, Restarting' });
    expect(await backend.workloadState('llama', llama)).toEqual({ state: 'completed', detail: 'pytorchjobs.kubeflow.org train/llama is Succeeded' });
    expect(await backend.workloadState('mistral', launcher('pytorchjobs.kubeflow.org/mistral'))).toEqual({
      state: 'failed',
      detail: 'pytorchjobs.kubeflow.org train/mistral is Failed (PyTorchJobFailed)',
    });
  });

  it('reads a Kubeflow TrainJob: Created is active, Complete is completed, Failed is failed', async () => {
    api.load(recordedExchanges('workload-trainjob'));
    const llama = launcher('trainjobs.trainer.kubeflow.org/llama');
    expect(await backend.workloadState('llama', llama)).toEqual({ state: 'active', detail: 'trainjobs.trainer.kubeflow.org train/llama is Created' });
    expect(await backend.workloadState('llama', llama)).toEqual({ state: 'completed', detail: 'trainjobs.trainer.kubeflow.org train/llama is Complete' });
    expect(await backend.workloadState('mistral', launcher('trainjobs.trainer.kubeflow.org/mistral'))).toEqual({
      state: 'failed',
      detail: 'trainjobs.trainer.kubeflow.org train/mistral is Failed (FailedJobs)',
    });
  });

  it('counts a workload not found as deleted (cancelled) only when it was seen present before', async () => {
    api.load(recordedExchanges('workload-deleted'));
    const gemma = launcher('pytorchjobs.kubeflow.org/gemma');
    expect(await backend.workloadState('gemma', gemma, false)).toEqual({
      state: 'unknown',
      detail: 'pytorchjobs.kubeflow.org train/gemma not found (not created yet, or deleted before steadfast saw it)',
    });
    expect((await backend.workloadState('gemma', gemma, false)).state).toBe('active');
    expect(await backend.workloadState('gemma', gemma, true)).toEqual({ state: 'cancelled', detail: 'pytorchjobs.kubeflow.org train/gemma was deleted' });
    // What was seen is the caller's to keep (the job store): the backend itself remembers nothing.
    expect((await backend.workloadState('gemma', gemma)).state).toBe('unknown');
  });

  it('answers unknown, asking the API nothing, for a kind it cannot read or a job without a Kubernetes launcher', async () => {
    expect(await backend.workloadState('llama', launcher('jobsets.jobset.x-k8s.io/llama'))).toEqual({
      state: 'unknown',
      detail:
        'steadfast cannot read the end of jobsets.jobset.x-k8s.io workloads (it reads jobs.batch, pytorchjobs.kubeflow.org, trainjobs.trainer.kubeflow.org)',
    });
    expect((await backend.workloadState('llama', { kind: 'slurm', command: ['sbatch', 'train.sh'] })).state).toBe('unknown');
    expect((await backend.workloadState('llama')).state).toBe('unknown');
  });

  it('names the missing RBAC rule when the API server forbids reading the workload', async () => {
    api.load(recordedExchanges('workload-forbidden'));
    const error = await backend.workloadState('llama', launcher('jobs.batch/llama')).then(
      () => undefined,
      (reason: unknown) => reason,
    );
    expect(error).toBeInstanceOf(DoNotRetryError);
    expect((error as Error).message).toMatch(
      /^steadfast lacks the RBAC permission "get jobs\.batch" \(see deploy\/kubernetes\/rbac-training\.yaml, applied in the workload's namespace\); forbidden to get jobs\.batch train\/llama: HTTP 403: /,
    );
  });
});

describe("the controller's Role in a training namespace", () => {
  it('grants get, and only get, on every workload kind whose end steadfast reads', () => {
    const documents = parseAllDocuments(readFileSync(new URL('../../deploy/kubernetes/rbac-training.yaml', import.meta.url), 'utf8')).map(
      (document) => document.toJS() as Record<string, unknown>,
    );
    const role = documents.find((document) => document.kind === 'Role') as { rules: { apiGroups: string[]; resources: string[]; verbs: string[] }[] };
    for (const [resource, kind] of Object.entries(WORKLOAD_KINDS)) {
      const rules = role.rules.filter((rule) => rule.apiGroups.includes(kind.group) && rule.resources.includes(kind.plural));
      expect(
        rules.map((rule) => rule.verbs),
        resource,
      ).toEqual([['get']]);
    }
  });
});
