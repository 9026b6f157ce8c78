import { readFileSync, readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse as parseYaml, parseAllDocuments } from 'yaml';
import { DaemonSet, Deployment } from 'kubernetes-models/apps/v1';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1';
import { ClusterRole, ClusterRoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1';
import { ConfigMap, Namespace, Service, ServiceAccount } from 'kubernetes-models/v1';
import { PodMonitor, PrometheusRule, ServiceMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';
import { configSchema } from '../../core/config.js';

const DEPLOY = resolve(import.meta.dirname, '..', '..', 'deploy', 'kubernetes');

interface Validatable {
  validate(): void;
}
type Model = new (data: never) => Validatable;

/** Each kind the manifests use, with the model that validates it against the Kubernetes (or CRD) schema. */
const MODELS: Record<string, Model> = {
  'v1/Namespace': Namespace,
  'v1/ServiceAccount': ServiceAccount,
  'v1/ConfigMap': ConfigMap,
  'v1/Service': Service,
  'apps/v1/Deployment': Deployment,
  'apps/v1/DaemonSet': DaemonSet,
  'policy/v1/PodDisruptionBudget': PodDisruptionBudget,
  'rbac.authorization.k8s.io/v1/ClusterRole': ClusterRole,
  'rbac.authorization.k8s.io/v1/ClusterRoleBinding': ClusterRoleBinding,
  'monitoring.coreos.com/v1/PodMonitor': PodMonitor,
  'monitoring.coreos.com/v1/ServiceMonitor': ServiceMonitor,
  'monitoring.coreos.com/v1/PrometheusRule': PrometheusRule,
};

interface KubeObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string };
  spec?: Record<string, unknown>;
  data?: Record<string, string>;
}

interface Container {
  args: string[];
  env: Array<{ name: string; valueFrom?: { fieldRef?: { fieldPath: string } } }>;
  securityContext: { capabilities?: unknown; privileged?: boolean };
  volumeMounts: Array<{ mountPath: string; readOnly?: boolean }>;
}
interface PodSpec {
  tolerations?: Array<{ key: string }>;
  hostPID?: boolean;
  automountServiceAccountToken?: boolean;
  containers: Container[];
  volumes?: Array<{ secret?: { secretName: string } }>;
}
interface Workload {
  spec: { replicas?: number; template: { spec: PodSpec } };
}
interface PodMonitorObject {
  spec: { podMetricsEndpoints: Array<{ honorLabels?: boolean; relabelings: unknown[] }> };
}

function manifests(): Array<{ file: string; object: KubeObject }> {
  return readdirSync(DEPLOY)
    .filter((file) => file.endsWith('.yaml'))
    .flatMap((file) => parseAllDocuments(readFileSync(join(DEPLOY, file), 'utf8')).map((document) => ({ file, object: document.toJS() as KubeObject })));
}

function find(kind: string, name: string): KubeObject {
  const found = manifests().find(({ object }) => object.kind === kind && object.metadata.name === name)?.object;
  if (!found) throw new Error(`no ${kind} ${name} in deploy/kubernetes`);
  return found;
}

describe('the Kubernetes manifests in deploy/kubernetes', () => {
  it('are each valid against the schema of their kind (Kubernetes API, prometheus-operator CRDs)', () => {
    const all = manifests();
    expect(all.length).toBeGreaterThanOrEqual(12);
    for (const { file, object } of all) {
      const model = MODELS[`${object.apiVersion}/${object.kind}`];
      expect(model, `${file}: ${object.apiVersion} ${object.kind} has no model to validate it`).toBeDefined();
      expect(() => new (model as Model)(object as never).validate(), `${file}: ${object.kind} ${object.metadata.name}`).not.toThrow();
    }
  });

  it('would be refused by that validation with a field of the wrong type', () => {
    const controller = structuredClone(find('Deployment', 'steadfast-controller'));
    (controller.spec as Record<string, unknown>).replicas = 'two';
    expect(() => new Deployment(controller as never).validate()).toThrow(/replicas/);
  });

  it('run the controller as two replicas on one Redis with a config the controller accepts', () => {
    const controller = find('Deployment', 'steadfast-controller') as unknown as Workload;
    expect(controller.spec.replicas).toBe(2);
    const config = parseYaml(find('ConfigMap', 'steadfast-controller').data?.['config.yaml'] ?? '') as { controller: { auth: Record<string, string> }; redis: { passwordFile: string } };
    const parsed = configSchema.safeParse(config);
    expect(parsed.success, JSON.stringify(parsed.error?.issues)).toBe(true);
    const mounts = controller.spec.template.spec.containers[0]?.volumeMounts.map((mount) => mount.mountPath);
    expect(mounts).toEqual(expect.arrayContaining(['/etc/steadfast/auth', '/etc/steadfast/redis']));
    for (const file of Object.values(config.controller.auth)) expect(file.startsWith('/etc/steadfast/auth/')).toBe(true);
    expect(config.redis.passwordFile.startsWith('/etc/steadfast/redis/')).toBe(true);
  });

  it('reference the credentials as Secrets, never inline', () => {
    const secretNames = manifests()
      .flatMap(({ object }) => (object as unknown as Partial<Workload>).spec?.template?.spec?.volumes ?? [])
      .flatMap((volume) => (volume.secret ? [volume.secret.secretName] : []));
    expect(new Set(secretNames)).toEqual(new Set(['steadfast-controller-auth', 'steadfast-agent-web-token', 'steadfast-agent-tokens', 'steadfast-redis']));
    expect(manifests().some(({ object }) => object.kind === 'Secret')).toBe(false);
  });

  it('run the agent on GPU nodes whatever their taints, named as the node, reading host paths read-only', () => {
    const pod = (find('DaemonSet', 'steadfast-agent') as unknown as Workload).spec.template.spec;
    expect(pod.tolerations?.map((toleration) => toleration.key)).toEqual(expect.arrayContaining(['nvidia.com/gpu', 'steadfast.dev/drained', 'steadfast.dev/standby']));
    expect(pod.hostPID).toBe(true);
    expect(pod.automountServiceAccountToken).toBe(false);
    const [container] = pod.containers;
    if (!container) throw new Error('the agent DaemonSet has no container');
    expect(container.args).toEqual(expect.arrayContaining(['--node=$(NODE_NAME)', '--controller.token-file=/etc/steadfast/agent-tokens/$(NODE_NAME)']));
    expect(container.env.find((variable) => variable.name === 'NODE_NAME')?.valueFrom?.fieldRef?.fieldPath).toBe('spec.nodeName');
    expect(container.securityContext.capabilities).toEqual({ drop: ['ALL'], add: ['SYS_PTRACE'] });
    expect(container.securityContext.privileged).toBeUndefined();
    const writable = container.volumeMounts.filter((mount) => !mount.readOnly).map((mount) => mount.mountPath);
    expect(writable).toEqual(['/var/lib/steadfast']);
  });

  it('scrape the agents with the node name as `node`, as the rules and the controller expect', () => {
    const [endpoint] = (find('PodMonitor', 'steadfast-agent') as unknown as PodMonitorObject).spec.podMetricsEndpoints;
    expect(endpoint?.honorLabels).toBe(true);
    expect(endpoint?.relabelings).toContainEqual({ sourceLabels: ['__meta_kubernetes_pod_node_name'], targetLabel: 'node' });
  });
});
