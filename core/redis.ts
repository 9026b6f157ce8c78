import { Redis, type RedisOptions } from 'ioredis';

/**
 * Redis connections. Two flavours, because the two sides want opposite things when Redis is
 * down: the HTTP intake must fail fast (answer 503 so Alertmanager retries), while workers must
 * wait and reconnect (BullMQ requires `maxRetriesPerRequest: null` for them).
 */

export type { Redis };

export function intakeConnection(url: string, extra: RedisOptions = {}): Redis {
  return new Redis(url, {
    enableOfflineQueue: false,
    maxRetriesPerRequest: 1,
    connectTimeout: 2000,
    retryStrategy: (attempt) => Math.min(attempt * 200, 2000),
    ...extra,
  });
}

export function workerConnection(url: string, extra: RedisOptions = {}): Redis {
  return new Redis(url, {
    maxRetriesPerRequest: null,
    retryStrategy: (attempt) => Math.min(attempt * 200, 2000),
    ...extra,
  });
}

/** Names of every Redis key steadfast owns outside BullMQ's queues, under one prefix. */
export class Keys {
  constructor(readonly prefix: string) {}
  get audit(): string {
    return `${this.prefix}:audit`;
  }
  get paused(): string {
    return `${this.prefix}:paused`;
  }
  get drainBudget(): string {
    return `${this.prefix}:budget:drains`;
  }
  auditOnce(marker: string): string {
    return `${this.prefix}:audit-once:${marker}`;
  }
  nodeDrainClaim(node: string): string {
    return `${this.prefix}:claim:drain:${node}`;
  }
  decision(id: string): string {
    return `${this.prefix}:decision:${id}`;
  }
  action(decisionId: string): string {
    return `${this.prefix}:action:${decisionId}`;
  }
  nodeLease(node: string): string {
    return `${this.prefix}:lease:node:${node}`;
  }
  dryRunNodes(): string {
    return `${this.prefix}:dry-run:nodes`;
  }
  get jobs(): string {
    return `${this.prefix}:jobs`;
  }
  job(name: string): string {
    return `${this.prefix}:job:${name}`;
  }
  jobTransitions(name: string): string {
    return `${this.prefix}:job:${name}:transitions`;
  }
  jobCheckpoints(name: string): string {
    return `${this.prefix}:job:${name}:checkpoints`;
  }
  jobAwaitingProgress(name: string): string {
    return `${this.prefix}:job:${name}:awaiting-progress`;
  }
  jobEvictions(name: string): string {
    return `${this.prefix}:job:${name}:evictions`;
  }
  jobLadder(name: string): string {
    return `${this.prefix}:job:${name}:ladder`;
  }
  /** The job's current micro-batch assignment (fail-slow S2), served to its training loop. */
  jobMicrobatches(name: string): string {
    return `${this.prefix}:job:${name}:microbatches`;
  }
  /** Which controller replica runs the online analyzers (fail-slow, multi-signal): a lease. */
  get analysisLeader(): string {
    return `${this.prefix}:analysis-leader`;
  }
  /** The job's fail-slow mitigation state (Greyhound §5). */
  jobFailSlow(name: string): string {
    return `${this.prefix}:job:${name}:failslow`;
  }
  recoveryStep(transitionId: string, index: number): string {
    return `${this.prefix}:recovery-step:${transitionId}:${index}`;
  }
  get standbyPool(): string {
    return `${this.prefix}:standby-pool`;
  }
  nodeExclusions(node: string): string {
    return `${this.prefix}:exclusions:${node}`;
  }
  get quarantine(): string {
    return `${this.prefix}:quarantine`;
  }
  nodeJob(node: string): string {
    return `${this.prefix}:node-job:${node}`;
  }
  dryRunRelaunches(): string {
    return `${this.prefix}:dry-run:relaunches`;
  }
  dryRunStandbys(): string {
    return `${this.prefix}:dry-run:standbys`;
  }
}

export const QUEUE_NAMES = { signals: 'signals', actions: 'actions', recovery: 'recovery', analysis: 'analysis' } as const;

/** True when `redis` answers PING within its timeout. */
export async function isRedisUp(redis: Redis): Promise<boolean> {
  try {
    return (await redis.ping()) === 'PONG';
  } catch {
    return false;
  }
}
