import type { Config } from '../core/config.js';
import { resolveToken } from '../core/config.js';
import type { Keys, Redis } from '../core/redis.js';
import type { ClusterBackend } from './backend.js';
import { DryRunBackend } from './dry-run.js';
import { kubernetesBackend, type KubernetesConnection } from './kubernetes.js';
import { SlurmRestClient } from './slurm-rest.js';
import { SlurmBackend } from './slurm.js';

/** The cluster backend the config's `backend:` section names, with its credentials read now. */
export function createBackend(config: Config, redis: Redis, keys: Keys): ClusterBackend {
  switch (config.backend.kind) {
    case 'slurm': {
      const { rest, ...slurm } = config.backend.slurm;
      return new SlurmBackend({ ...slurm, rest: rest && new SlurmRestClient({ ...rest, timeoutMs: slurm.timeoutMs }) });
    }
    case 'kubernetes':
      return kubernetesBackend({ connection: kubernetesConnection(config.backend.kubernetes), timeoutMs: config.backend.kubernetes.timeoutMs });
    case 'dry-run':
      return new DryRunBackend(redis, keys, config.backend.dryRun.nodes && new Set(config.backend.dryRun.nodes));
  }
}

/** How `backend.kubernetes` reaches the API server, its token read now (also the agents' token reviews, controller/kubernetes-agents.ts). */
export function kubernetesConnection(k8s: Config['backend']['kubernetes']): KubernetesConnection {
  switch (k8s.connection) {
    case 'token':
      return { kind: 'token', server: k8s.server ?? '', token: resolveToken({ tokenFile: k8s.tokenFile }, 'backend.kubernetes'), caFile: k8s.caFile };
    case 'kubeconfig':
      return { kind: 'kubeconfig', path: k8s.kubeconfig, context: k8s.context };
    case 'in-cluster':
      return { kind: 'in-cluster' };
  }
}
