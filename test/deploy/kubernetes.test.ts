import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { parse as parseYaml, parseAllDocuments } from 'yaml';
import { DaemonSet, Deployment, StatefulSet } from 'kubernetes-models/apps/v1';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1';
import { ClusterRole, ClusterRoleBinding, Role, RoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1';
import { ConfigMap, Namespace, Service, ServiceAccount } from 'kubernetes-models/v1';
import { PodMonitor, PrometheusRule, ServiceMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';
import { configSchema } from '../../core/config.js';
import { ProcessGroup, freePort, waitFor } from '../../tryit/processes.js';

const DEPLOY = resolve(import.meta.dirname, '..', '..', 'deploy', 'kubernetes');
const run = promisify(execFile);

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
  'apps/v1/StatefulSet': StatefulSet,
  'policy/v1/PodDisruptionBudget': PodDisruptionBudget,
  'rbac.authorization.k8s.io/v1/ClusterRole': ClusterRole,
  'rbac.authorization.k8s.io/v1/ClusterRoleBinding': ClusterRoleBinding,
  'rbac.authorization.k8s.io/v1/Role': Role,
  'rbac.authorization.k8s.io/v1/RoleBinding': RoleBinding,
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
  name: string;
  image: string;
  command?: string[];
  args: string[];
  env: Array<{ name: string; valueFrom?: { fieldRef?: { fieldPath: string }; secretKeyRef?: { name: string; key: string; optional?: boolean } } }>;
  securityContext: { capabilities?: unknown; privileged?: boolean; allowPrivilegeEscalation?: boolean; runAsUser?: number };
  volumeMounts: Array<{ name: string; mountPath: string; readOnly?: boolean; subPath?: string }>;
}
interface Volume {
  name: string;
  secret?: { secretName: string };
  hostPath?: { path: string; type?: string };
  projected?: { sources: Array<{ serviceAccountToken?: { audience?: string; expirationSeconds?: number; path: string } }> };
}
interface PodSpec {
  serviceAccountName?: string;
  tolerations?: Array<{ key: string }>;
  hostPID?: boolean;
  automountServiceAccountToken?: boolean;
  initContainers?: Container[];
  containers: Container[];
  volumes?: Volume[];
}
interface Rule {
  apiGroups: string[];
  resources: string[];
  verbs: string[];
}
interface Workload {
  spec: { replicas?: number; template: { spec: PodSpec } };
}
interface PodMonitorObject {
  spec: { podMetricsEndpoints: Array<{ honorLabels?: boolean; relabelings: unknown[] }> };
}

function manifests(): Array<{ file: string; object: KubeObject }> {
  return readdirSync(DEPLOY)
    .filter((file) => statSync(join(DEPLOY, file)).isFile())
    .filter((file) => file.endsWith('.yaml'))
    .flatMap((file) => parseAllDocuments(readFileSync(join(DEPLOY, file), 'utf8')).map((document) => ({ file, object: document.toJS() as KubeObject })));
}

function find(kind: string, name: string, namespace?: string): KubeObject {
  const found = manifests().find(
    ({ object }) => object.kind === kind && object.metadata.name === name && (namespace === undefined || object.metadata.namespace === namespace),
  )?.object;
  if (!found) throw new Error(`no ${kind} ${name} in deploy/kubernetes`);
  return found;
}

/** What a role grants: `verb resource.group` lines, as `kubectl auth can-i` spells them. */
function grants(role: KubeObject): string[] {
  return ((role as unknown as { rules: Rule[] }).rules ?? []).flatMap((rule) =>
    rule.apiGroups.flatMap((group) => rule.resources.flatMap((resource) => rule.verbs.map((verb) => `${verb} ${resource}${group ? `.${group}` : ''}`))),
  );
}

function controllerConfig(): {
  redis: { url: string; passwordFile: string };
  controller: { auth: Record<string, unknown> & { kubernetesAgents: { audience: string; namespace: string; serviceAccount: string } } };
} {
  return parseYaml(find('ConfigMap', 'steadfast-controller').data?.['config.yaml'] ?? '') as ReturnType<typeof controllerConfig>;
}

function podSpec(kind: string, name: string): PodSpec {
  return (find(kind, name) as unknown as Workload).spec.template.spec;
}

describe('the Kubernetes manifests in deploy/kubernetes', () => {
  it('are each valid against the schema of their kind (Kubernetes API, prometheus-operator CRDs)', () => {
    const all = manifests();
    expect(all.length).toBeGreaterThanOrEqual(22);
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
    const config = controllerConfig();
    const parsed = configSchema.safeParse(config);
    expect(parsed.success, JSON.stringify(parsed.error?.issues)).toBe(true);
    const [container] = controller.spec.template.spec.containers;
    expect(container?.image).toBe('steadfast-controller:0.1.0');
    const mounts = container?.volumeMounts.map((mount) => mount.mountPath);
    expect(mounts).toEqual(expect.arrayContaining(['/etc/steadfast/auth', '/etc/steadfast/redis']));
    const { kubernetesAgents, ...files } = config.controller.auth;
    expect(kubernetesAgents).toBeDefined();
    for (const file of Object.values(files)) expect(String(file).startsWith('/etc/steadfast/auth/')).toBe(true);
    expect(config.redis.passwordFile).toBe('/etc/steadfast/redis/password');
  });

  it('point the controller at the bundled Redis, or at the URL of a Redis of your own in the steadfast-redis Secret', () => {
    const config = controllerConfig();
    const service = find('Service', 'steadfast-redis');
    expect(config.redis.url).toBe(`redis://${service.metadata.name}.${service.metadata.namespace}.svc:6379`);
    const [container] = podSpec('Deployment', 'steadfast-controller').containers;
    // STEADFAST_REDIS__URL overrides redis.url (docs/configuration.md), and is absent without the key.
    expect(container?.env.find((variable) => variable.name === 'STEADFAST_REDIS__URL')?.valueFrom?.secretKeyRef).toEqual({
      name: 'steadfast-redis',
      key: 'url',
      optional: true,
    });
  });

  it("reference the credentials as Secrets, never inline, and give the agents none: their pods' own tokens", () => {
    const secretNames = manifests()
      .flatMap(({ object }) => (object as unknown as Partial<Workload>).spec?.template?.spec?.volumes ?? [])
      .flatMap((volume) => (volume.secret ? [volume.secret.secretName] : []));
    expect(new Set(secretNames)).toEqual(new Set(['steadfast-controller-auth', 'steadfast-agent-web-token', 'steadfast-redis']));
    expect(manifests().some(({ object }) => object.kind === 'Secret')).toBe(false);
    const agentSecrets = (podSpec('DaemonSet', 'steadfast-agent').volumes ?? []).flatMap((volume) => (volume.secret ? [volume.secret.secretName] : []));
    expect(agentSecrets).toEqual(['steadfast-agent-web-token']);
  });

  it("give each agent its pod's service-account token for the controller audience, which the controller checks for that service account", () => {
    const pod = podSpec('DaemonSet', 'steadfast-agent');
    const { kubernetesAgents } = controllerConfig().controller.auth;
    const daemonSet = find('DaemonSet', 'steadfast-agent');
    expect([daemonSet.metadata.namespace, pod.serviceAccountName]).toEqual([kubernetesAgents.namespace, kubernetesAgents.serviceAccount]);
    // No API token: the projected one is for the controller alone.
    expect(pod.automountServiceAccountToken).toBe(false);
    const [container] = pod.containers;
    const tokenArg = container?.args.find((arg) => arg.startsWith('--controller.kubernetes-token-file='));
    const tokenFile = tokenArg?.split('=')[1] ?? '';
    const mount = container?.volumeMounts.find((candidate) => tokenFile.startsWith(`${candidate.mountPath}/`));
    expect(mount?.readOnly).toBe(true);
    const source = pod.volumes?.find((volume) => volume.name === mount?.name)?.projected?.sources[0]?.serviceAccountToken;
    expect(source?.audience).toBe(kubernetesAgents.audience);
    expect(`${mount?.mountPath}/${source?.path}`).toBe(tokenFile);
    // The API server refuses a projected token shorter than 10 minutes.
    expect(source?.expirationSeconds).toBeGreaterThanOrEqual(600);
    expect(container?.args.some((arg) => arg.startsWith('--controller.token-file'))).toBe(false);
  });

  it('run the agent image on GPU nodes whatever their taints, named as the node, reading /dev/kmsg and host paths read-only', () => {
    const pod = podSpec('DaemonSet', 'steadfast-agent');
    expect(pod.tolerations?.map((toleration) => toleration.key)).toEqual(
      expect.arrayContaining(['nvidia.com/gpu', 'steadfast.dev/drained', 'steadfast.dev/standby']),
    );
    expect(pod.hostPID).toBe(true);
    const [container] = pod.containers;
    if (!container) throw new Error('the agent DaemonSet has no container');
    expect(container.image).toBe('steadfast-agent:0.1.0');
    // The image's entrypoint is steadfast-agent: its arguments are the agent's flags, no subcommand.
    expect(container.args[0]?.startsWith('--')).toBe(true);
    expect(container.args).toEqual(expect.arrayContaining(['--node=$(NODE_NAME)', '--path.kmsg=/dev/kmsg']));
    expect(container.env.find((variable) => variable.name === 'NODE_NAME')?.valueFrom?.fieldRef?.fieldPath).toBe('spec.nodeName');
    // /dev/kmsg opens only in a privileged container; the API server refuses privileged with allowPrivilegeEscalation false.
    expect(container.securityContext).toMatchObject({ privileged: true, runAsUser: 0 });
    expect(container.securityContext.allowPrivilegeEscalation).toBeUndefined();
    const kmsg = container.volumeMounts.find((mount) => mount.mountPath === '/dev/kmsg');
    expect(pod.volumes?.find((volume) => volume.name === kmsg?.name)?.hostPath).toEqual({ path: '/dev/kmsg', type: 'CharDevice' });
    const writable = container.volumeMounts.filter((mount) => !mount.readOnly).map((mount) => mount.mountPath);
    expect(writable).toEqual(['/var/lib/steadfast']);
    expect(
      manifests()
        .flatMap(({ object }) => (object as unknown as Partial<Workload>).spec?.template?.spec?.volumes ?? [])
        .some((volume) => volume.hostPath?.path === '/var/log/kern.log'),
    ).toBe(false);
  });

  it('never set allowPrivilegeEscalation false on a privileged container, which the API server refuses', () => {
    const recipe = parseYaml(readFileSync(join(DEPLOY, 'preflight', 'training-pod.yaml'), 'utf8')) as { spec: PodSpec };
    const specs = [
      ...manifests().flatMap(({ object }) =>
        (object as unknown as Partial<Workload>).spec?.template?.spec ? [(object as unknown as Workload).spec.template.spec] : [],
      ),
      recipe.spec,
    ];
    for (const spec of specs) {
      for (const container of [...(spec.initContainers ?? []), ...spec.containers]) {
        if (container.securityContext?.privileged) expect(container.securityContext.allowPrivilegeEscalation, container.name).toBeUndefined();
      }
    }
  });

  it('grant the controller cluster-wide only what drains and token reviews need, and pod deletion only in training namespaces', () => {
    const cluster = grants(find('ClusterRole', 'steadfast-controller'));
    expect(cluster.sort()).toEqual([
      'create pods/eviction',
      'create tokenreviews.authentication.k8s.io',
      'get nodes',
      'list nodes',
      'list pods',
      'patch nodes',
    ]);
    expect(grants(find('Role', 'steadfast-controller-agents', 'steadfast'))).toEqual(['get pods']);
    const training = find('Role', 'steadfast-controller', 'training');
    expect(grants(training).sort()).toEqual(['deletecollection pods', 'get jobs.batch', 'get pytorchjobs.kubeflow.org', 'get trainjobs.trainer.kubeflow.org']);
    for (const [role, namespace] of [
      ['steadfast-controller', 'training'],
      ['steadfast-controller-agents', 'steadfast'],
    ] as const) {
      const binding = find('RoleBinding', role, namespace) as unknown as {
        roleRef: { kind: string; name: string };
        subjects: Array<{ kind: string; name: string; namespace: string }>;
      };
      expect(binding.roleRef).toMatchObject({ kind: 'Role', name: role });
      expect(binding.subjects).toEqual([{ kind: 'ServiceAccount', name: 'steadfast-controller', namespace: 'steadfast' }]);
    }
    expect(grants(find('ClusterRole', 'steadfast-controller')).some((grant) => grant.startsWith('deletecollection'))).toBe(false);
  });

  it("copy the training namespace's role to another namespace with the sed line the file documents", async () => {
    const text = readFileSync(join(DEPLOY, 'rbac-training.yaml'), 'utf8');
    expect(text).toContain("sed 's/namespace: training$/namespace: NS/' deploy/kubernetes/rbac-training.yaml | kubectl apply -f -");
    const copied = (await run('sed', ['s/namespace: training$/namespace: llm-pretrain/', join(DEPLOY, 'rbac-training.yaml')])).stdout;
    const objects = parseAllDocuments(copied).map(
      (document) => document.toJS() as { kind: string; metadata: { namespace: string }; subjects?: Array<{ namespace: string }> },
    );
    expect(objects.map((object) => `${object.kind} ${object.metadata.namespace}`)).toEqual(['Role llm-pretrain', 'RoleBinding llm-pretrain']);
    // The subject stays the controller's service account in its own namespace.
    expect(objects[1]?.subjects?.[0]?.namespace).toBe('steadfast');
  });

  it("scrape the agents with the node name as `node`, as the rules and the controller expect, which no agent's own label overrides", () => {
    const [endpoint] = (find('PodMonitor', 'steadfast-agent') as unknown as PodMonitorObject).spec.podMetricsEndpoints;
    expect(endpoint?.honorLabels).toBeUndefined();
    expect(endpoint?.relabelings).toContainEqual({ sourceLabels: ['__meta_kubernetes_pod_node_name'], targetLabel: 'node' });
  });
});

/**
 * The bundled Redis (redis.yaml), started here from Debian's redis-server with the manifest's
 * own redis.conf and the init container's own command (their paths moved into a temporary
 * directory): it must take the password from the Secret's file, keep an AOF fsynced every
 * second and refuse to evict, as BullMQ needs.
 */
describe('the bundled Redis of deploy/kubernetes/redis.yaml', () => {
  it('starts from its ConfigMap with the password the init container wrote, AOF every second and noeviction', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'steadfast-k8s-redis-'));
    const processes = new ProcessGroup();
    try {
      const moved = (text: string): string => text.replaceAll('/etc/redis/', `${dir}/etc/`).replaceAll('dir /data', `dir ${dir}/data`);
      const pod = podSpec('StatefulSet', 'steadfast-redis');
      const init = pod.initContainers?.find((container) => container.name === 'auth');
      const [shell, flag, script] = init?.command ?? [];
      expect([shell, flag]).toEqual(['sh', '-c']);
      await run('mkdir', ['-p', `${dir}/etc/secret`, `${dir}/etc/auth`, `${dir}/data`]);
      const password = 'Zx9-redis-password-from-the-secret';
      writeFileSync(`${dir}/etc/secret/password`, `${password}\n`);
      await run('sh', ['-c', moved(script ?? '')]);
      expect(statSync(`${dir}/etc/auth/auth.conf`).mode & 0o777).toBe(0o600);
      const conf = find('ConfigMap', 'steadfast-redis').data?.['redis.conf'] ?? '';
      const port = await freePort();
      writeFileSync(`${dir}/redis.conf`, moved(conf).replace(/^port \d+$/m, `port ${port}\nbind 127.0.0.1`));
      const [redis] = pod.containers;
      expect(redis?.command).toEqual(['redis-server', '/etc/redis/redis.conf']);
      processes.start('bundled-redis', 'redis-server', [`${dir}/redis.conf`], join(dir, 'redis.log'));
      const cli = (args: string[]): Promise<string> => run('redis-cli', ['-h', '127.0.0.1', '-p', String(port), ...args]).then(({ stdout }) => stdout.trim());
      const withPassword = (args: string[]): Promise<string> => cli(['--no-auth-warning', '-a', password, ...args]);
      await waitFor(
        'the bundled Redis to answer with its password',
        () =>
          withPassword(['PING']).then(
            (answer) => answer === 'PONG',
            () => false,
          ),
        10_000,
      );
      for (const [key, value] of [
        ['appendonly', 'yes'],
        ['appendfsync', 'everysec'],
        ['maxmemory-policy', 'noeviction'],
      ]) {
        expect(await withPassword(['CONFIG', 'GET', key as string])).toBe(`${key}\n${value}`);
      }
      expect(await cli(['PING'])).toMatch(/^NOAUTH/);
    } finally {
      await processes.stopAll();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
