import { readFileSync } from 'node:fs';
import { Redis, type RedisOptions } from 'ioredis';
import { InputError, errorMessage } from './errors.js';

/**
 * Redis connections. Two flavours, because the two sides want opposite things when Redis is
 * down: the HTTP intake must fail fast (answer 503 so Alertmanager retries), while workers must
 * wait and reconnect (BullMQ requires `maxRetriesPerRequest: null` for them). The API's other
 * requests fail fast as well, and also when Redis is connected but does not answer
 * (requestConnection).
 */

export type { Redis };

/** Where Redis is and how to authenticate: the config's `redis` section, or just a URL. */
export interface RedisSettings {
  /** redis://[user][:password]@host:port/db, or rediss:// for TLS. */
  readonly url: string;
  /** File holding the password, instead of one in the URL; a trailing newline is dropped. */
  readonly passwordFile?: string | undefined;
  readonly tls?: { readonly caFile?: string | undefined } | undefined;
  /** Sentinels to ask for the primary of group `name`; the URL's host and port are then unused. */
  readonly sentinels?: readonly { readonly host: string; readonly port: number }[] | undefined;
  readonly name?: string | undefined;
  readonly sentinelPasswordFile?: string | undefined;
}

function readSecretFile(path: string, what: string, field: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch (error) {
    throw new InputError(`redis.${field}: cannot read the ${what} file ${path}: ${errorMessage(error)}`, `redis.${field}`);
  }
}

function readPassword(path: string, field: string): string {
  const password = readSecretFile(path, 'password', field).replace(/\r?\n$/, '');
  if (password === '') throw new InputError(`redis.${field}: ${path} is empty`, `redis.${field}`);
  return password;
}

/**
 * What ioredis needs beyond the URL: the password from passwordFile, the CA from tls.caFile, and
 * the sentinels with their own password. Files are read here, once per connection, so a rotated
 * password is picked up by a restart. Throws InputError naming the field when a file cannot be
 * read or holds no password.
 */
export function redisConnectionOptions(settings: RedisSettings | string): { url: string; options: RedisOptions } {
  const { url, passwordFile, tls, sentinels, name, sentinelPasswordFile }: RedisSettings = typeof settings === 'string' ? { url: settings } : settings;
  const options: RedisOptions = {};
  let withPassword = url;
  if (passwordFile !== undefined) {
    // Into the URL, not the options: ioredis lets the URL's (empty) password win over an option.
    const parsed = new URL(url);
    parsed.password = encodeURIComponent(readPassword(passwordFile, 'passwordFile'));
    withPassword = parsed.href;
  }
  if (tls !== undefined) {
    options.tls = tls.caFile === undefined ? {} : { ca: readSecretFile(tls.caFile, 'CA', 'tls.caFile') };
  }
  if (sentinels !== undefined && name !== undefined) {
    options.sentinels = sentinels.map(({ host, port }) => ({ host, port }));
    options.name = name;
    // A demoted primary refuses writes; follow the sentinels to the new one instead.
    options.reconnectOnError = (error) => error.message.startsWith('READONLY');
    if (sentinelPasswordFile !== undefined) options.sentinelPassword = readPassword(sentinelPasswordFile, 'sentinelPasswordFile');
    if (url.startsWith('rediss://')) {
      // TLS to the data nodes and to the sentinels alike, with the same CA.
      options.enableTLSForSentinelMode = true;
      options.sentinelTLS = options.tls ?? {};
    }
  }
  return { url: withPassword, options };
}

/** Where the settings point, without secrets: the URL redacted, or the sentinels and group. */
export function describeRedis(settings: RedisSettings | string): string {
  if (typeof settings === 'string' || settings.sentinels === undefined) return redactedRedisUrl(typeof settings === 'string' ? settings : settings.url);
  return `primary of "${settings.name ?? ''}" from sentinels ${settings.sentinels.map(({ host, port }) => `${host}:${port}`).join(', ')}`;
}

/** The URL with any password replaced, for logs and error messages. */
export function redactedRedisUrl(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password !== '') parsed.password = '***';
    return parsed.href;
  } catch {
    return 'the configured Redis URL';
  }
}

export function intakeConnection(settings: RedisSettings | string, extra: RedisOptions = {}): Redis {
  const { url, options } = redisConnectionOptions(settings);
  return new Redis(url, {
    enableOfflineQueue: false,
    maxRetriesPerRequest: 1,
    // A command whose answer was lost with the connection fails (the request is answered 503)
    // and is not sent again after the reconnect, where it would store what the sender retries.
    autoResendUnfulfilledCommands: false,
    connectTimeout: 2000,
    retryStrategy: (attempt) => Math.min(attempt * 200, 2000),
    ...options,
    ...extra,
  });
}

/** How long a command on a request's connection (requestConnection) may wait for its answer. */
export const REQUEST_COMMAND_TIMEOUT_MS = 5000;

/**
 * The connection the API's requests read and write on: it fails fast as the intake's does, and a
 * command with no answer within REQUEST_COMMAND_TIMEOUT_MS fails as well, so that a Redis that is
 * connected but does not answer (stopped, swapping, wedged) gets its callers a 503 rather than
 * holding them. The intake's store keeps intakeConnection: it waits longer for a slow Redis on
 * purpose (controller/intake.ts), and has its own deadlines.
 */
export function requestConnection(settings: RedisSettings | string, extra: RedisOptions = {}): Redis {
  return intakeConnection(settings, { commandTimeout: REQUEST_COMMAND_TIMEOUT_MS, ...extra });
}

export function workerConnection(settings: RedisSettings | string, extra: RedisOptions = {}): Redis {
  const { url, options } = redisConnectionOptions(settings);
  return new Redis(url, {
    maxRetriesPerRequest: null,
    retryStrategy: (attempt) => Math.min(attempt * 200, 2000),
    ...options,
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
  /** Markers of entries already written (a sorted set by time, trimmed with the audit). */
  get auditWritten(): string {
    return `${this.prefix}:audit-written`;
  }
  /** The audit's index of type, node and ref (core/audit-index.ts), trimmed with the audit. */
  get auditIndex(): string {
    return `${this.prefix}:audit-index`;
  }
  /** The oldest audit id from which on every entry is in the index (`0-0`: all of them). */
  get auditIndexedFrom(): string {
    return `${this.prefix}:audit-indexed-from`;
  }
  /** Written before each WAIT for replicas, so that the WAIT covers every write before it. */
  get intakeReplicaMarker(): string {
    return `${this.prefix}:intake:replica-marker`;
  }
  /** Ids of the signals the intake stored, scored by when (controller/intake.ts): none is stored twice. */
  get intakeSeenSignals(): string {
    return `${this.prefix}:intake:seen`;
  }
  /** When an operator last returned each node to service (`steadfast resume`): faults reported before it are closed. */
  get nodeResumes(): string {
    return `${this.prefix}:node-resumes`;
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
  /** A node's remediation history, newest first, bounded (core/remedy.ts). */
  remediations(node: string): string {
    return `${this.prefix}:remediations:${node}`;
  }
  /** Operator holds (maintenance) by node: no actuator acts on a held node until it is released or expires. */
  get holds(): string {
    return `${this.prefix}:holds`;
  }
  /**
   * Occurrences of one Xid or SXid code on one node within its policy's window, scored by time
   * (controller/policy/xid-occurrences.ts): bounded, expiring with the window.
   */
  xidOccurrences(node: string, kind: 'xid' | 'sxid', code: number): string {
    return `${this.prefix}:xid-occurrences:${node}:${kind}:${code}`;
  }
  /** Set while an agent's report of this code on this node was counted within the window: its alert is then no new occurrence. */
  xidAgentCounted(node: string, kind: 'xid' | 'sxid', code: number): string {
    return `${this.prefix}:xid-agent-counted:${node}:${kind}:${code}`;
  }
  nodeLease(node: string): string {
    return `${this.prefix}:lease:node:${node}`;
  }
  /** The nodes steadfast took out of service, each with the decision that did (actuators/own-drains.ts). */
  get ownDrains(): string {
    return `${this.prefix}:own-drains`;
  }
  /** The nodes someone else holds out of service as last read, and when each was last scanned (actuators/foreign-holds.ts). */
  get foreignHolds(): string {
    return `${this.prefix}:foreign-holds`;
  }
  get foreignHoldsScanned(): string {
    return `${this.prefix}:foreign-holds:scanned`;
  }
  /** Each node's latest burn throughput, and a node's recent ones (actuators/node-validation.ts). */
  get validationThroughput(): string {
    return `${this.prefix}:validation:throughput`;
  }
  validationThroughputOf(node: string): string {
    return `${this.prefix}:validation:throughput:${node}`;
  }
  /** Rebooted nodes waiting for their validation, and the standbys validated (actuators/validation-upkeep.ts). */
  get validationAfterReboot(): string {
    return `${this.prefix}:validation:after-reboot`;
  }
  get validationStandbys(): string {
    return `${this.prefix}:validation:standbys`;
  }
  /** One controller validates a node at a time (core/locks.ts). */
  validationLease(node: string): string {
    return `${this.prefix}:validation:lease:${node}`;
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
  /** The agents' newest training_progress report per node (controller/progress.ts). */
  jobProgressReports(name: string): string {
    return `${this.prefix}:job:${name}:progress-reports`;
  }
  jobEvictions(name: string): string {
    return `${this.prefix}:job:${name}:evictions`;
  }
  jobLadder(name: string): string {
    return `${this.prefix}:job:${name}:ladder`;
  }
  /** The ladder as it was before its newest acting transition, to put back if the actuator refuses it. */
  jobLadderUndo(name: string): string {
    return `${this.prefix}:job:${name}:ladder-undo`;
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
  /** A hot-swap job's world: its recovery epoch, whether a swap is open, and its step times (controller/world-store.ts). */
  jobWorld(name: string): string {
    return `${this.prefix}:job:${name}:world`;
  }
  /** The ranks' reports in the world's current epoch, one per shard or spare. */
  jobWorldReports(name: string): string {
    return `${this.prefix}:job:${name}:world-reports`;
  }
  /** Held by the transition of steps that runs for the job now (actuators/steps/processor.ts). */
  jobStepsHold(name: string): string {
    return `${this.prefix}:job:${name}:steps-hold`;
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
  /**
   * The ledger of finished signal jobs kept in one state (controller/signal-retention.ts): their
   * ids by finish time, the bytes each takes, and the total.
   */
  signalsKept(state: 'completed' | 'failed'): { readonly order: string; readonly bytes: string; readonly total: string } {
    const base = `${this.prefix}:signals-kept:${state}`;
    return { order: `${base}:order`, bytes: `${base}:bytes`, total: `${base}:total` };
  }
}

/** How long a health check waits for PONG. */
export const REDIS_UP_TIMEOUT_MS = 2000;

/** True when `redis` answers PING within `timeoutMs`; false on an error, a wrong answer, or none in time. */
export async function isRedisUp(redis: Redis, timeoutMs = REDIS_UP_TIMEOUT_MS): Promise<boolean> {
  return redisProbe(redis, timeoutMs)();
}

/**
 * A health check of `redis` for many callers (every /healthz, every failed request): each gets
 * its answer within `timeoutMs`, and callers at the same time share one PING, so that a Redis
 * that does not answer collects one unanswered PING, not one per request.
 */
export function redisProbe(redis: Redis, timeoutMs = REDIS_UP_TIMEOUT_MS): () => Promise<boolean> {
  let pending: Promise<boolean> | undefined;
  return async () => {
    pending ??= redis
      .ping()
      .then(
        (reply) => reply === 'PONG',
        () => false,
      )
      .finally(() => (pending = undefined));
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), timeoutMs)));
    try {
      return await Promise.race([pending, late]);
    } finally {
      clearTimeout(timer);
    }
  };
}

type LuaArgument = string | number;

/**
 * A Lua script run by its SHA1 (EVALSHA): Redis neither receives nor hashes the script's text on
 * each call. ioredis loads it with EVAL when the server does not know it yet (first use, after a
 * restart or a failover to a replica that never saw it). One name per script and connection.
 */
export function luaScript(redis: Redis, name: string, numberOfKeys: number, lua: string): (...args: LuaArgument[]) => Promise<unknown> {
  const commands = redis as unknown as Record<string, ((...args: LuaArgument[]) => Promise<unknown>) | undefined>;
  if (typeof commands[name] !== 'function') redis.defineCommand(name, { numberOfKeys, lua });
  return (...args) => (commands[name] as (...args: LuaArgument[]) => Promise<unknown>).apply(redis, args);
}
