import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { InputError, errorMessage } from './errors.js';
import { authSchema } from './auth-config.js';
import { checkNameSchema } from './diagnostics.js';
import { detectorLabelsSchema } from './detector-labels.js';
import { nodeNameSchema } from './names.js';
import { launcherNameSchema, launcherSchema } from './launcher.js';
import { queueTimingSchema } from './queues.js';
import { parseOrThrow } from './validate.js';
// resolveToken lives apart so that the agent reads its token without loading the config schema.
export { resolveToken } from './token.js';
import { recoverySchema } from './recovery-config.js';
import { redisConfigSchema } from './redis-config.js';
import { remediesSchema } from './remedy-config.js';
import { profilesSchema } from './profiles.js';
import { xidPolicyLayerSchema } from './xid-policy.js';
import { validationSchema } from './validation-config.js';

export { DEFAULT_RECOVERY, recoverySchema, type RecoveryConfig } from './recovery-config.js';

/**
 * steadfast's configuration: a YAML file, then environment overrides, validated as one object.
 * An override names its field with double underscores between levels:
 * `STEADFAST_CONTROLLER__PORT=9500` sets `controller.port`.
 */

const hostSchema = z.string().min(1).max(255);
// Numbers are coerced so that environment overrides, which are always strings, validate too.
const int = () => z.coerce.number<unknown>().int();
const portSchema = int().min(0).max(65535);

export const configSchema = z
  .object({
    redis: redisConfigSchema.prefault({}),
    controller: z
      .object({
        host: hostSchema.default('127.0.0.1'),
        port: portSchema.default(9400),
        /**
         * Largest request body accepted, in bytes; larger answers 413, which Alertmanager does not
         * retry. The default holds a webhook of the shipped `max_alerts` (1,000) alerts of up to
         * 4 KiB each (docs/limits.md, "Webhook size").
         */
        bodyLimitBytes: int()
          .min(1024)
          .max(64 * 1024 * 1024)
          .default(4 * 1024 * 1024),
        /**
         * Request bodies held in memory at once, all requests together: past it a request is
         * answered 503 with Retry-After before its body is read. Bounds the controller's memory
         * under a burst of big webhooks. At least bodyLimitBytes.
         */
        inFlightBodyBytes: int()
          .min(1024)
          .max(1024 * 1024 * 1024)
          .default(16 * 1024 * 1024),
        /**
         * Where /metrics is served: its own listener, so scrapes (unauthenticated) can be kept to
         * Prometheus by a firewall and never share a port with the intake. Host defaults to
         * controller.host; port 0 picks a free one.
         */
        metrics: z
          .object({
            host: hostSchema.optional(),
            port: portSchema.default(9402),
          })
          .strict()
          .prefault({}),
        /** One credential per role (core/auth-config.ts); with none the controller refuses to start. */
        auth: authSchema.prefault({}),
        /** Approximate length the audit stream is trimmed to. */
        auditMaxLength: int().min(100).default(100_000),
        /**
         * Per-client (remote address) token bucket on the write endpoints: a client past it gets
         * 429 with Retry-After. requestsPerSecond 0 turns it off (behind a proxy every client is the
         * proxy). The burst is wide because Alertmanager sends one webhook per alert group at once
         * and does not retry a 429 (only a 5xx): a rack-wide fault must fit in it.
         */
        rateLimit: z
          .object({
            requestsPerSecond: z.coerce.number<unknown>().min(0).max(100_000).default(50),
            burst: int().min(1).max(100_000).default(500),
          })
          .strict()
          .prefault({}),
        /**
         * Bounds on connections, before any token is checked: a client that sends its headers
         * slowly, or opens connection after connection, would otherwise hold a file descriptor
         * each until legitimate requests find none.
         */
        connections: z
          .object({
            /** Longest a client may take to send a request's headers. */
            headersTimeoutSeconds: int().min(1).max(300).default(10),
            /** Longest a whole request, body included, may take to arrive. */
            requestTimeoutSeconds: int().min(1).max(3600).default(30),
            /** Connections one client address may hold open at once; more are closed at once. 0: no cap (behind a load balancer). */
            maxPerClient: int().min(0).max(100_000).default(64),
          })
          .strict()
          .refine((connections) => connections.requestTimeoutSeconds >= connections.headersTimeoutSeconds, {
            message: 'must be at least headersTimeoutSeconds',
            path: ['requestTimeoutSeconds'],
          })
          .prefault({}),
      })
      .strict()
      .refine((controller) => controller.inFlightBodyBytes >= controller.bodyLimitBytes, {
        message: 'must be at least bodyLimitBytes',
        path: ['inFlightBodyBytes'],
      })
      .refine(
        (controller) =>
          controller.port === 0 || controller.metrics.port !== controller.port || (controller.metrics.host ?? controller.host) !== controller.host,
        {
          message: 'must differ from controller.port: /metrics has its own listener',
          path: ['metrics', 'port'],
        },
      )
      .prefault({}),
    backend: z
      .object({
        kind: z.enum(['slurm', 'kubernetes', 'dry-run']).default('dry-run'),
        dryRun: z
          .object({
            /**
             * The nodes the dry-run backend knows (it has no scheduler to ask). A job naming
             * another is refused, and no agent URL is built for one. Absent: every well-formed
             * node name is known (a trial against a cluster whose nodes steadfast may reach).
             */
            nodes: z.array(nodeNameSchema).max(100_000).optional(),
          })
          .strict()
          .prefault({}),
        slurm: z
          .object({
            scontrol: z.string().min(1).default('scontrol'),
            sinfo: z.string().min(1).default('sinfo'),
            /** For stopping a registered job's Slurm jobs (the ladder's stop step, and before each relaunch). */
            squeue: z.string().min(1).default('squeue'),
            scancel: z.string().min(1).default('scancel'),
            /** Extra environment for the Slurm commands and the job launcher, e.g. SLURM_CONF. */
            env: z.record(z.string(), z.string()).default({}),
            timeoutMs: int().min(100).default(10_000),
            /** Reservation that holds warm standbys. */
            standbyReservation: z
              .string()
              .regex(/^[A-Za-z0-9_-]{1,64}$/)
              .default('steadfast-standby'),
            /** slurmrestd (optional): reads over REST, node updates too where the daemon offers them (Slurm 23.02+). */
            rest: z
              .object({
                url: z.url({ protocol: /^https?$/ }),
                /** The Slurm user the JWT names; updating nodes needs an operator or SlurmUser. */
                user: z.string().regex(/^[A-Za-z0-9._-]{1,64}$/),
                token: z.string().min(1).optional(),
                /** File with the JWT or `scontrol token` output, re-read on each call (rotate it freely). */
                tokenFile: z.string().min(1).optional(),
              })
              .strict()
              .refine((value) => value.token !== undefined || value.tokenFile !== undefined, { message: 'needs token or tokenFile', path: ['token'] })
              .optional(),
          })
          .strict()
          .prefault({}),
        kubernetes: z
          .object({
            /** in-cluster (the pod's service account), kubeconfig (a file and context), or token (server + token file). */
            connection: z.enum(['in-cluster', 'kubeconfig', 'token']).default('in-cluster'),
            kubeconfig: z.string().min(1).optional(),
            context: z.string().min(1).optional(),
            server: z.url({ protocol: /^https?$/ }).optional(),
            tokenFile: z.string().min(1).optional(),
            caFile: z.string().min(1).optional(),
            timeoutMs: int().min(100).default(10_000),
          })
          .strict()
          .refine((value) => value.connection !== 'token' || (value.server !== undefined && value.tokenFile !== undefined), {
            message: 'connection "token" needs server and tokenFile',
            path: ['server'],
          })
          .prefault({}),
      })
      .strict()
      .prefault({}),
    policy: z
      .object({
        /**
         * Reports of a fault on a node already being drained, within this window, join the first
         * decision. It only has to outlast the race between the fast path and the alert (seconds);
         * a later report makes a decision the actuator finds already carried out.
         * `steadfast resume NODE` ends the window early.
         */
        drainDedupeSeconds: int().min(1).default(900),
      })
      .strict()
      .prefault({}),
    progress: z
      .object({
        /**
         * Prometheus to ask whether a restarted job trains again (its steadfast_training_iteration
         * grows). Unset: a restart counts as successful once the launcher accepts it.
         */
        prometheusUrl: z.url({ protocol: /^https?$/ }).optional(),
        /** A restart that shows no new iteration within this long has failed (ByteRobust §4.2). */
        timeoutSeconds: int().min(10).default(900),
      })
      .strict()
      .prefault({}),
    standby: z
      .object({
        /** Spare nodes the pool may provision as warm standbys; empty: standbys are held by hand. */
        candidates: z.array(nodeNameSchema).default([]),
        /** Per-machine daily failure rate; the pool holds the P99 of Binomial(job nodes, rate) (ByteRobust §6.2). */
        dailyFailureRate: z.coerce.number<unknown>().min(0).max(1).default(0.001),
        quantile: z.coerce.number<unknown>().gt(0).lt(1).default(0.99),
      })
      .strict()
      .prefault({}),
    agents: z
      .object({
        /**
         * Where the controller reaches a node's agent for stack dumps (POST /api/v1/trace) and
         * stop-time diagnostics (POST /api/v1/diagnose); `{node}` becomes the node name.
         */
        urlTemplate: z
          .string()
          .regex(/^https?:\/\/.*\{node\}/, 'must be an http(s) URL containing {node}')
          .default('http://{node}:9401'),
        /** Per-node URLs that override the template (agents on non-default ports, the sim). */
        urls: z.record(nodeNameSchema, z.url({ protocol: /^https?$/ })).default({}),
        /**
         * A secret from which each node's web token is derived (`steadfast token agent --node N
         * --secret-file F` prints it; that node's --web.token-file holds it), so a node that leaks
         * its token opens no other agent. Preferred over one token for every agent (token, tokenFile).
         */
        secretFile: z.string().min(1).optional(),
        /** One bearer token every agent requires on its POST endpoints (the agent's --web.token-file). */
        token: z.string().min(1).optional(),
        tokenFile: z.string().min(1).optional(),
        /** Longest a stack dump may take per node; the agent takes at most 60 (POST /api/v1/trace). */
        traceTimeoutSeconds: int().min(1).max(60).default(30),
        /** Longest the stop-time diagnostics may take per node (dcgmi diag -r 2 takes minutes). */
        diagnoseTimeoutSeconds: int().min(1).max(7200).default(900),
      })
      .strict()
      .refine((agents) => agents.secretFile === undefined || (agents.token === undefined && agents.tokenFile === undefined), {
        message: 'give secretFile (a token per node) or token/tokenFile (one token for every agent), not both',
        path: ['secretFile'],
      })
      .prefault({}),
    analysis: z
      .object({
        /** Stack aggregation's fail-slow mode: rounds and seconds between them (ByteRobust §5.2). */
        stackRounds: int().min(1).max(50).default(5),
        stackRoundSeconds: int().min(0).max(600).default(10),
        /** Longest one dual-phase replay group may run (the job's launcher.replay command). */
        replayTimeoutSeconds: int().min(10).max(86_400).default(1800),
        /**
         * Prometheus the online analyzers read: multi-signal detection (every node's metrics,
         * the 504-GPU report) and fail-slow detection (every rank's iteration time, Greyhound §4).
         * Defaults to progress.prometheusUrl; with neither, they do not run.
         */
        prometheusUrl: z.url({ protocol: /^https?$/ }).optional(),
        /** The label names multi-signal detection's queries use (core/detector-labels.ts). */
        labels: detectorLabelsSchema.prefault({}),
        detectorIntervalSeconds: int().min(5).max(3600).default(60),
        /**
         * Seconds between fail-slow checks: each reads every rank's latest iteration time from
         * Prometheus and feeds the new ones to its tracker, so detection takes a few checks
         * (Greyhound §4.2's verification) and the mitigation steps once per check.
         */
        failSlowIntervalSeconds: z.coerce.number<unknown>().min(0.5).max(3600).default(5),
        /**
         * How much a rank's time must move, relatively, for a fail-slow change to be verified
         * (Greyhound §4.2 verifies at 10 %). Raise it where healthy ranks' times move more than
         * that with each other's load (ranks sharing CPU cores, as in the lab).
         */
        failSlowThreshold: z.coerce.number<unknown>().gt(0).lt(1).default(0.1),
        /**
         * ByteRobust §4.2's hierarchy of stop-time checks, walked one stage per call to the agents
         * (analyzers/diagnosis/staged.ts): machine-local checks (EUD) first, then NCCL within a
         * machine, then across machines. Each stage names the agents' checks it runs (the names
         * in their --diagnose.config). Empty: one call with every configured check.
         */
        diagnoseStages: z
          .array(
            z
              .object({
                name: checkNameSchema,
                checks: z.array(checkNameSchema).min(1).max(64),
                /** Per node for this stage; agents.diagnoseTimeoutSeconds when absent. */
                timeoutSeconds: int().min(1).max(7200).optional(),
              })
              .strict(),
          )
          .max(8)
          .default([])
          .superRefine((stages, context) => {
            const names = new Set<string>();
            const checks = new Map<string, string>();
            for (const [index, stage] of stages.entries()) {
              if (names.has(stage.name)) context.addIssue({ code: 'custom', message: `stage name "${stage.name}" is used twice`, path: [index, 'name'] });
              names.add(stage.name);
              for (const check of stage.checks) {
                const other = checks.get(check);
                if (other !== undefined)
                  context.addIssue({ code: 'custom', message: `check "${check}" is already in stage "${other}"`, path: [index, 'checks'] });
                checks.set(check, stage.name);
              }
            }
          }),
        /** Seconds of training each fail-slow mitigation costs to apply, for the ski-rental switch (Greyhound §5.1). */
        failSlowCostSeconds: z
          .object({
            S2: z.coerce.number<unknown>().positive().default(30),
            S3: z.coerce.number<unknown>().positive().default(600),
            S4: z.coerce.number<unknown>().positive().default(1800),
          })
          .strict()
          .prefault({}),
      })
      .strict()
      .prefault({}),
    recovery: recoverySchema.prefault({}),
    /** Remedies short of a drain, their escalation, hand-off and maintenance windows (core/remedy-config.ts). */
    remedies: remediesSchema.prefault({}),
    /** Settings per group of nodes (dry-run, eviction budget, rungs), matched by name, Slurm partition or Kubernetes label (core/profiles.ts). */
    profiles: profilesSchema,
    /** What to do per Xid and SXid code, over the catalogue (core/xid-policy.ts, docs/configuration.md#xid-policy). */
    xidPolicy: xidPolicyLayerSchema.prefault({}),
    /** A burn under load (and DCGM's level 2) before a node returns to service (core/validation-config.ts). */
    validation: validationSchema.prefault({}),
    /**
     * How registered jobs are (re)started, by name: the operator writes every command here; a
     * job registration only names one and fills its {job}, {nodes} and {version} placeholders.
     */
    launchers: z.record(launcherNameSchema, launcherSchema).default({}),
    /** How soon a dead worker's jobs (a killed controller's recovery) go to another worker (core/queues.ts). */
    queues: queueTimingSchema.prefault({}),
    safety: z
      .object({
        /** Eviction budget (after node-healthcheck-operator's max-unhealthy). */
        maxDrainsPerWindow: int().min(0).default(4),
        windowSeconds: int().min(1).default(3600),
        /** Seconds a per-node lease is held while an actuator works on it. */
        nodeLeaseSeconds: int().min(1).default(60),
        /** Nodes in the cluster; with maxDrainPercent, bounds drains per window as a share of it. */
        clusterNodes: int().min(1).optional(),
        maxDrainPercent: z.coerce.number<unknown>().min(0).max(100).optional(),
        /** Most of a job's nodes that may be evicted within windowSeconds, in percent (a min-healthy bound). */
        maxJobEvictionPercent: z.coerce.number<unknown>().min(0).max(100).default(50),
        /** How long an operator's hold on a node lasts when the request names no end, and the longest one may last. */
        holdDefaultSeconds: int().min(60).default(86_400),
        holdMaxSeconds: int()
          .min(60)
          .default(30 * 86_400),
      })
      .strict()
      .prefault({}),
    /**
     * Optional: post every action that reaches a final state (done, refused, failed) to Grafana
     * as an annotation tagged `steadfast`, which every steadfast dashboard shows. A Grafana
     * outage is logged and counted, never fails the action.
     */
    grafana: z
      .object({
        /** Grafana's base URL, e.g. https://grafana.example.com or http://host:3000/grafana. */
        url: z.url({ protocol: /^https?$/, error: 'must be an http:// or https:// URL' }),
        /** A service-account token with annotations:write; here, in tokenFile, or the section is refused. */
        token: z.string().min(16, 'must be at least 16 characters').optional(),
        tokenFile: z.string().min(1).optional(),
        /** Attach the annotations to this dashboard; without it they are organisation-wide (every dashboard's tag query shows them). */
        dashboardUid: z
          .string()
          .regex(/^[A-Za-z0-9_-]{1,40}$/, 'a Grafana dashboard uid: up to 40 letters, digits, "_" or "-"')
          .optional(),
        /** Per request; a slower Grafana counts as a failed post. */
        timeoutMs: int().min(100).max(60_000).default(5000),
      })
      .strict()
      .refine((grafana) => grafana.token !== undefined || grafana.tokenFile !== undefined, { error: 'set token or tokenFile', path: ['token'] })
      .optional(),
  })
  .strict();

export type Config = z.output<typeof configSchema>;

const ENV_PREFIX = 'STEADFAST_';

/** Builds a nested object from `STEADFAST_A__B=value` variables; values stay strings (the schema coerces numbers). */
export function envOverrides(env: NodeJS.ProcessEnv): Record<string, unknown> {
  const result: Record<string, unknown> = {};
  for (const [name, raw] of Object.entries(env)) {
    if (!name.startsWith(ENV_PREFIX) || raw === undefined || !name.includes('__')) continue;
    const path = name
      .slice(ENV_PREFIX.length)
      .split('__')
      .map((part) => part.toLowerCase().replace(/_([a-z])/g, (_, letter: string) => letter.toUpperCase()));
    let cursor = result;
    path.slice(0, -1).forEach((part) => {
      const next = cursor[part];
      cursor[part] = typeof next === 'object' && next !== null ? next : {};
      cursor = cursor[part] as Record<string, unknown>;
    });
    cursor[path.at(-1) as string] = raw;
  }
  return result;
}

function deepMerge(base: Record<string, unknown>, over: Record<string, unknown>): Record<string, unknown> {
  const merged: Record<string, unknown> = { ...base };
  for (const [key, value] of Object.entries(over)) {
    const current = merged[key];
    merged[key] = isPlainObject(current) && isPlainObject(value) ? deepMerge(current, value) : value;
  }
  return merged;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Loads the config file (optional), applies env overrides and validates the result. */
export function loadConfig(options: { file?: string | undefined; env?: NodeJS.ProcessEnv } = {}): Config {
  let fromFile: unknown = {};
  if (options.file) {
    let text: string;
    try {
      text = readFileSync(options.file, 'utf8');
    } catch (error) {
      throw new InputError(`cannot read config file ${options.file}: ${errorMessage(error)}`);
    }
    try {
      fromFile = parseYaml(text) ?? {};
    } catch (error) {
      throw new InputError(`config file ${options.file} is not valid YAML: ${errorMessage(error)}`);
    }
    if (!isPlainObject(fromFile)) throw new InputError(`config file ${options.file}: top level must be a mapping`);
  }
  const merged = deepMerge(fromFile as Record<string, unknown>, envOverrides(options.env ?? process.env));
  return parseOrThrow(configSchema, merged, 'config');
}
