import {
  ApiException,
  CoreV1Api,
  CustomObjectsApi,
  KubeConfig,
  PatchStrategy,
  ServerConfiguration,
  createConfiguration,
  setHeaderOptions,
  type Configuration,
  type ConfigurationOptions,
  type V1Eviction,
  type V1Node,
  type V1Pod,
  type V1Taint,
} from '@kubernetes/client-node';
import { DoNotRetryError, RetryLaterError } from '../core/errors.js';
import { EQUALITY_SELECTOR_RULE, isEqualityLabelSelector, isLabelValue, isNamespace } from '../core/kubernetes-names.js';
import { NODE_NAME_PATTERN } from '../core/names.js';
import type { Launcher } from '../core/launcher.js';
import type { ClusterBackend, NodeState, ResumeOptions, WorkloadState } from './backend.js';
import { apiError, serverMessage, statusCode } from './kubernetes-errors.js';
import { KubernetesWorkloads } from './kubernetes-workload.js';

/** Everything steadfast writes on a Node carries this prefix, so its own marks are told apart from an operator's. */
export const DRAINED_TAINT = 'steadfast.dev/drained';
export const DRAIN_REASON_ANNOTATION = 'steadfast.dev/drain-reason';
export const STANDBY_TAINT = 'steadfast.dev/standby';
export const ROLE_LABEL = 'steadfast.dev/role';
export const JOB_LABEL = 'steadfast.dev/job';
/**
 * Set when steadfast cordons a node someone else had cordoned already: their cordon stays when
 * steadfast's is lifted (NVIDIA/NVSentinel#1424). A cordon without steadfast's taint is theirs.
 */
export const FOREIGN_CORDON_ANNOTATION = 'steadfast.dev/cordoned-before';

/** The kubelet's own conditions; any other with status True comes from node-problem-detector or a similar tool. */
const KUBELET_CONDITIONS = new Set(['Ready', 'MemoryPressure', 'DiskPressure', 'PIDPressure', 'NetworkUnavailable']);

/** Where the backend finds the API server and its credentials. */
export type KubernetesConnection =
  /** The pod's service account (KUBERNETES_SERVICE_HOST and the mounted token). */
  | { readonly kind: 'in-cluster' }
  /** A kubeconfig file; without `path`, $KUBECONFIG or ~/.kube/config. */
  | { readonly kind: 'kubeconfig'; readonly path?: string; readonly context?: string }
  /** A bearer token for one server; plain http only with `skipTlsVerify` (tests). */
  | { readonly kind: 'token'; readonly server: string; readonly token: string; readonly caFile?: string; readonly skipTlsVerify?: boolean };

export interface KubernetesBackendOptions {
  readonly connection: KubernetesConnection;
  /** Per request: the API server answers in milliseconds, so a request past this is a network fault. */
  readonly timeoutMs: number;
}

/** Kubernetes node names are lower-case DNS subdomains (RFC 1123), stricter than core/names.ts. */
const KUBERNETES_NODE_NAME = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
/** Annotations may hold 256 KiB in all; a reason is for people reading `kubectl describe node`. */
const MAX_REASON_LENGTH = 1024;
/** The kubelet marks the API copy of a static pod with this; evicting it does nothing. */
const MIRROR_POD_ANNOTATION = 'kubernetes.io/config.mirror';
const SCHEDULE_EFFECTS = new Set(['NoSchedule', 'NoExecute']);
const FINISHED_PHASES = new Set(['Succeeded', 'Failed']);

/** A JSON merge patch (RFC 7386) of a Node: `null` removes a key, lists are replaced whole. */
interface NodeMergePatch {
  metadata?: {
    resourceVersion?: string;
    labels?: Record<string, string | null>;
    annotations?: Record<string, string | null>;
  };
  spec?: { unschedulable?: boolean; taints?: TaintJson[] };
}

/** A taint as the API server writes it; timeAdded kept in its RFC 3339 seconds form. */
interface TaintJson {
  key: string;
  value?: string;
  effect: string;
  timeAdded?: string;
}

function cleanReason(reason: string): string {
  return reason.replace(/[^\x20-\x7e]/g, ' ').slice(0, MAX_REASON_LENGTH);
}

function taintJson(taint: V1Taint): TaintJson {
  return {
    key: taint.key,
    ...(taint.value !== undefined ? { value: taint.value } : {}),
    effect: taint.effect,
    ...(taint.timeAdded ? { timeAdded: taint.timeAdded.toISOString().replace(/\.\d{3}Z$/, 'Z') } : {}),
  };
}

function hasTaint(node: V1Node, key: string): boolean {
  return (node.spec?.taints ?? []).some((taint) => taint.key === key && SCHEDULE_EFFECTS.has(taint.effect));
}

/** Someone else's cordon on the node, if any: a cordon without steadfast's taint, or one steadfast found there when it cordoned. */
function foreignCordon(node: V1Node): string | undefined {
  if (!(node.spec?.unschedulable ?? false)) return undefined;
  if (!hasTaint(node, DRAINED_TAINT)) return 'cordoned by someone else';
  if (node.metadata?.annotations?.[FOREIGN_CORDON_ANNOTATION] !== undefined) return 'cordoned by someone else before steadfast';
  return undefined;
}

function isEmpty(patch: NodeMergePatch): boolean {
  return patch.metadata === undefined && patch.spec === undefined;
}

/**
 * Builds the patch that moves `node` to the wanted marks, containing only what differs. A taint
 * change replaces the whole list, so it carries the resourceVersion it was computed from: the
 * API server refuses it with 409 if anybody changed the node in between, instead of letting us
 * drop their taint.
 */
function nodePatch(
  node: V1Node,
  want: {
    unschedulable?: boolean;
    addTaint?: TaintJson;
    removeTaint?: string;
    labels?: Record<string, string | null>;
    annotations?: Record<string, string | null>;
  },
): NodeMergePatch {
  const patch: NodeMergePatch = {};
  const metadata: NonNullable<NodeMergePatch['metadata']> = {};
  const spec: NonNullable<NodeMergePatch['spec']> = {};
  const differing = (current: Record<string, string> | undefined, wanted: Record<string, string | null> | undefined) =>
    Object.fromEntries(Object.entries(wanted ?? {}).filter(([key, value]) => (current?.[key] ?? null) !== value));

  const labels = differing(node.metadata?.labels, want.labels);
  if (Object.keys(labels).length > 0) metadata.labels = labels;
  const annotations = differing(node.metadata?.annotations, want.annotations);
  if (Object.keys(annotations).length > 0) metadata.annotations = annotations;
  if (want.unschedulable !== undefined && (node.spec?.unschedulable ?? false) !== want.unschedulable) spec.unschedulable = want.unschedulable;

  const taints = node.spec?.taints ?? [];
  if (want.addTaint && !hasTaint(node, want.addTaint.key)) {
    spec.taints = [...taints.map(taintJson), want.addTaint];
  } else if (want.removeTaint && taints.some((taint) => taint.key === want.removeTaint)) {
    spec.taints = taints.filter((taint) => taint.key !== want.removeTaint).map(taintJson);
  }
  if (spec.taints) metadata.resourceVersion = node.metadata?.resourceVersion ?? '';

  if (Object.keys(metadata).length > 0) patch.metadata = metadata;
  if (Object.keys(spec).length > 0) patch.spec = spec;
  return patch;
}

/** Pods a drain has to move: not DaemonSet-owned (the controller ignores cordons), not mirror pods, not already gone. */
function needsEviction(pod: V1Pod): boolean {
  if (pod.metadata?.annotations?.[MIRROR_POD_ANNOTATION] !== undefined) return false;
  if ((pod.metadata?.ownerReferences ?? []).some((owner) => owner.kind === 'DaemonSet' && owner.controller === true)) return false;
  if (pod.metadata?.deletionTimestamp) return false;
  return !FINISHED_PHASES.has(pod.status?.phase ?? '');
}

function loadKubeConfig(connection: KubernetesConnection): KubeConfig {
  const config = new KubeConfig();
  switch (connection.kind) {
    case 'in-cluster':
      config.loadFromCluster();
      break;
    case 'kubeconfig':
      if (connection.path) config.loadFromFile(connection.path);
      else config.loadFromDefault();
      if (connection.context) config.setCurrentContext(connection.context);
      break;
    case 'token':
      config.loadFromClusterAndUser(
        {
          name: 'steadfast',
          server: connection.server,
          skipTLSVerify: connection.skipTlsVerify ?? false,
          ...(connection.caFile ? { caFile: connection.caFile } : {}),
        },
        { name: 'steadfast', token: connection.token },
      );
      break;
  }
  return config;
}

/**
 * Cordons, taints and evicts through the API server (after node-healthcheck-operator):
 * every method reads the Node first and writes only the difference, so a retry or a second
 * worker finds its work done and writes nothing.
 */
export class KubernetesBackend implements ClusterBackend {
  readonly name = 'kubernetes';

  constructor(
    private readonly api: CoreV1Api,
    private readonly workloads: KubernetesWorkloads,
  ) {}

  private checkNode(node: string): void {
    if (!NODE_NAME_PATTERN.test(node) || !KUBERNETES_NODE_NAME.test(node)) {
      throw new DoNotRetryError(`refusing to send invalid node name ${JSON.stringify(node.slice(0, 80))} to Kubernetes (lower-case DNS name expected)`);
    }
  }

  /** Undefined when the API server does not know the node. */
  private async readNode(node: string): Promise<V1Node | undefined> {
    try {
      return await this.api.readNode({ name: node });
    } catch (error) {
      if (statusCode(error) === 404) return undefined;
      throw apiError(error, `get node ${node}`, 'get nodes');
    }
  }

  private async existingNode(node: string): Promise<V1Node> {
    const current = await this.readNode(node);
    if (!current) throw new DoNotRetryError(`node ${node} does not exist in the Kubernetes cluster`);
    return current;
  }

  private async patchNode(node: string, patch: NodeMergePatch, action: string): Promise<void> {
    if (isEmpty(patch)) return;
    // The generated client defaults to JSON Patch; this patch is a merge patch.
    const asMergePatch: ConfigurationOptions = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);
    try {
      await this.api.patchNode({ name: node, body: patch }, asMergePatch);
    } catch (error) {
      throw apiError(error, `${action} node ${node}`, 'patch nodes');
    }
  }

  async nodeState(node: string): Promise<NodeState> {
    this.checkNode(node);
    const current = await this.readNode(node);
    if (!current) return { node, exists: false, drained: false, raw: 'unknown to kubernetes' };
    const unschedulable = current.spec?.unschedulable ?? false;
    const ready = current.status?.conditions?.find((condition) => condition.type === 'Ready')?.status ?? 'Unknown';
    const conditions = (current.status?.conditions ?? [])
      .filter((condition) => !KUBELET_CONDITIONS.has(condition.type) && condition.status === 'True')
      .map((condition) => cleanReason(`${condition.type}${condition.reason ? ` (${condition.reason})` : ''}`).slice(0, 120));
    return {
      node,
      exists: true,
      drained: unschedulable || hasTaint(current, DRAINED_TAINT),
      reason: current.metadata?.annotations?.[DRAIN_REASON_ANNOTATION],
      raw: `Ready=${ready}, unschedulable=${unschedulable}`,
      foreign: foreignCordon(current),
      ...(conditions.length > 0 ? { conditions } : {}),
    };
  }

  /**
   * Cordon, taint and annotate in one patch, then evict. The first reason stays: a later drain
   * of a node already drained does not overwrite why it was taken out. Evictions are re-tried
   * on every call, so a drain stopped by a PodDisruptionBudget finishes on a later attempt.
   */
  /** The node's labels, read for profiles that match by label (config `profiles[].match.nodeLabels`): a plain `get nodes`. */
  async nodeLabels(node: string): Promise<Readonly<Record<string, string>>> {
    this.checkNode(node);
    return (await this.readNode(node))?.metadata?.labels ?? {};
  }

  async drain(node: string, reason: string): Promise<void> {
    await this.cordon(node, reason);
    await this.evictPods(node);
  }

  /** Cordon and taint, without evicting: the cordon-only mode of a GPU reset. */
  async cordon(node: string, reason: string): Promise<void> {
    this.checkNode(node);
    const current = await this.existingNode(node);
    const hasReason = current.metadata?.annotations?.[DRAIN_REASON_ANNOTATION] !== undefined;
    // Someone else's cordon (no taint of ours on it) is remembered, so lifting ours leaves theirs.
    const theirs = (current.spec?.unschedulable ?? false) && !hasTaint(current, DRAINED_TAINT);
    const patch = nodePatch(current, {
      unschedulable: true,
      addTaint: { key: DRAINED_TAINT, value: 'true', effect: 'NoSchedule' },
      annotations: {
        ...(hasReason ? {} : { [DRAIN_REASON_ANNOTATION]: cleanReason(reason) }),
        ...(theirs ? { [FOREIGN_CORDON_ANNOTATION]: 'true' } : {}),
      },
    });
    await this.patchNode(node, patch, 'cordon and taint');
  }

  private async evictPods(node: string): Promise<void> {
    let pods: V1Pod[];
    try {
      pods = (await this.api.listPodForAllNamespaces({ fieldSelector: `spec.nodeName=${node}` })).items;
    } catch (error) {
      throw apiError(error, `list pods on node ${node}`, 'list pods');
    }
    const blocked: string[] = [];
    for (const pod of pods.filter(needsEviction)) {
      const name = pod.metadata?.name ?? '';
      const namespace = pod.metadata?.namespace ?? '';
      const eviction: V1Eviction = { apiVersion: 'policy/v1', kind: 'Eviction', metadata: { name, namespace } };
      try {
        await this.api.createNamespacedPodEviction({ name, namespace, body: eviction });
      } catch (error) {
        const code = statusCode(error);
        if (code === 404) continue; // gone between the list and the eviction: what we wanted
        // 429: a PodDisruptionBudget says not now; evict the rest, then report.
        if (code === 429 && error instanceof ApiException) blocked.push(`${namespace}/${name} (${serverMessage(error)})`);
        else throw apiError(error, `evict pod ${namespace}/${name} from node ${node}`, 'create pods/eviction');
      }
    }
    if (blocked.length > 0) {
      throw new RetryLaterError(`node ${node} is cordoned but a PodDisruptionBudget blocks evicting ${blocked.join(', ')}`);
    }
  }

  /**
   * Uncordons only a cordon steadfast made and no one else shares (or with `force`); otherwise
   * takes away steadfast's taint and annotations and leaves their cordon.
   */
  async resume(node: string, options: ResumeOptions = {}): Promise<void> {
    this.checkNode(node);
    const current = await this.existingNode(node);
    const keepTheirs = options.force !== true && foreignCordon(current) !== undefined;
    const patch = nodePatch(current, {
      ...(keepTheirs ? {} : { unschedulable: false }),
      removeTaint: DRAINED_TAINT,
      annotations: { [DRAIN_REASON_ANNOTATION]: null, [FOREIGN_CORDON_ANNOTATION]: null },
    });
    await this.patchNode(node, patch, keepTheirs ? "untaint (someone else's cordon kept)" : 'uncordon and untaint');
  }

  async holdStandby(node: string): Promise<void> {
    this.checkNode(node);
    const current = await this.existingNode(node);
    const patch = nodePatch(current, {
      addTaint: { key: STANDBY_TAINT, value: 'true', effect: 'NoSchedule' },
      labels: { [ROLE_LABEL]: 'standby', [JOB_LABEL]: null },
    });
    await this.patchNode(node, patch, 'hold as standby');
  }

  async activateStandby(node: string, job: string): Promise<void> {
    this.checkNode(node);
    if (!isLabelValue(job)) {
      throw new DoNotRetryError(
        `job ${JSON.stringify(job)} cannot be a Kubernetes label value: 1-63 letters, digits, "-", "_" or ".", alphanumeric at both ends`,
      );
    }
    const current = await this.existingNode(node);
    const labels = current.metadata?.labels ?? {};
    const owner = labels[JOB_LABEL];
    // Owner check: a node already serving another job is not ours to hand out again.
    if (labels[ROLE_LABEL] === 'active' && owner !== undefined && owner !== job) {
      throw new DoNotRetryError(`node ${node} is already active for job ${owner}; not activating it for ${job}`);
    }
    const patch = nodePatch(current, {
      removeTaint: STANDBY_TAINT,
      labels: { [ROLE_LABEL]: 'active', [JOB_LABEL]: job },
    });
    await this.patchNode(node, patch, `activate standby for job ${job} on`);
  }

  /**
   * Relaunches a training workload in place: deletes its pods (selected by label) and lets its
   * controller (Job, PyTorchJob, JobSet …) recreate them on the nodes now in service.
   */
  async relaunchWorkload(namespace: string, podSelector: string): Promise<number> {
    if (!isNamespace(namespace)) throw new DoNotRetryError(`refusing invalid namespace ${JSON.stringify(namespace.slice(0, 80))}`);
    if (!isEqualityLabelSelector(podSelector)) {
      throw new DoNotRetryError(`refusing pod selector ${JSON.stringify(podSelector.slice(0, 200))}: ${EQUALITY_SELECTOR_RULE}`);
    }
    let pods: number;
    try {
      pods = (await this.api.listNamespacedPod({ namespace, labelSelector: podSelector })).items.length;
    } catch (error) {
      throw apiError(error, `list pods ${podSelector} in ${namespace}`, 'list pods');
    }
    try {
      await this.api.deleteCollectionNamespacedPod({ namespace, labelSelector: podSelector });
    } catch (error) {
      throw apiError(error, `delete pods ${podSelector} in ${namespace}`, 'deletecollection pods');
    }
    return pods;
  }

  /** The state of the workload the job's Kubernetes launcher names (kubernetes-workload.ts). */
  async workloadState(name: string, launcher?: Launcher, seenBefore = false): Promise<WorkloadState> {
    return this.workloads.state(name, launcher, seenBefore);
  }

  async standbys(): Promise<string[]> {
    try {
      const nodes = await this.api.listNode({ labelSelector: `${ROLE_LABEL}=standby` });
      return nodes.items
        .map((item) => item.metadata?.name ?? '')
        .filter((name) => name !== '')
        .sort();
    } catch (error) {
      throw apiError(error, 'list standby nodes', 'list nodes');
    }
  }
}

/** Builds the backend from its connection. */
export function kubernetesBackend(options: KubernetesBackendOptions): KubernetesBackend {
  const configuration = kubernetesApiConfiguration(options);
  return new KubernetesBackend(new CoreV1Api(configuration), new KubernetesWorkloads(new CustomObjectsApi(configuration)));
}

/** The API clients' configuration for a connection, each request bounded by timeoutMs; the only place a KubeConfig is read. */
export function kubernetesApiConfiguration(options: KubernetesBackendOptions): Configuration {
  const config = loadKubeConfig(options.connection);
  const cluster = config.getCurrentCluster();
  if (!cluster) throw new DoNotRetryError(`no current cluster in the ${options.connection.kind} Kubernetes configuration`);
  const timeoutMs = options.timeoutMs;
  return createConfiguration({
    baseServer: new ServerConfiguration(cluster.server, {}),
    authMethods: { default: config },
    promiseMiddleware: [
      {
        pre: async (request) => {
          request.setSignal(AbortSignal.timeout(timeoutMs));
          return request;
        },
        post: async (response) => response,
      },
    ],
  });
}
