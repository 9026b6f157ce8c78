import express, { type Request, type Response } from 'express';
import { z } from 'zod';
import type { AuditLog } from '../../core/audit.js';
import { StoreUnavailableError } from '../../core/errors.js';
import { codeVersionSchema, jobNameSchema } from '../../core/job.js';
import type { Launchers } from '../../core/launcher.js';
import { nodeNameSchema } from '../../core/names.js';
import { parseOrThrow } from '../../core/validate.js';
import type { ClusterBackend } from '../../actuators/backend.js';
import { planRestoreByStep } from '../../actuators/restore-plan.js';
import { parseJobSpec } from '../../core/job.js';
import { admitJob } from '../job-admission.js';
import { jobMembers, type JobRecord, type JobStore } from '../job-store.js';
import type { RecoveryDispatcher } from '../policy/recovery-dispatcher.js';
import type { StandbyPool } from '../../actuators/standby-pool.js';
import type { MicrobatchBoard } from '../microbatches.js';
import { identityOf } from './auth.js';
import { mayTrainFor } from './training-access.js';
import { answerTypedErrors } from './http-errors.js';
import { apiRoute } from './routes.js';

/**
 * The jobs API: register training jobs, read their state and ETTR, report checkpoint shards and
 * ask for a restore plan; and the standby endpoint a standby node's agent polls to learn its
 * assignment (ByteRobust §6.2). Mounted behind the controller's auth (scopes.ts); an agent's
 * node-bound credential reaches a job's training endpoints only for a job on its node.
 */
const codeUpdateSchema = z
  .object({
    version: codeVersionSchema,
    /** Urgent (a bug fix): stop and apply now; otherwise at the next failure or within 24 h (ByteRobust §6.1). */
    urgent: z.boolean().default(false),
  })
  .strict();

/** The operator's per-job policy, as `PUT /jobs/:id/policy` takes it: either field, or both. */
const policyChangeSchema = z
  .object({ recovery: z.boolean().optional(), dryRun: z.boolean().optional() })
  .strict()
  .refine((change) => change.recovery !== undefined || change.dryRun !== undefined, 'give recovery, dryRun or both');

const selfCheckSchema = z.object({ ok: z.boolean(), detail: z.string().max(2048).default('') }).strict();

export interface JobsRouterDeps {
  readonly jobs: JobStore;
  readonly backend: ClusterBackend;
  /** The operator's launchers; a registration must name one of them. */
  readonly launchers: Launchers;
  /** Where unregistrations and policy changes are recorded. */
  readonly audit: AuditLog;
  readonly dispatcher?: RecoveryDispatcher | undefined;
  readonly pool?: StandbyPool | undefined;
  readonly microbatches?: MicrobatchBoard | undefined;
}

export function jobsRouter(deps: JobsRouterDeps): express.Router {
  const { jobs, backend } = deps;
  const router = express.Router();

  // Typed errors answered with their status (http-errors.ts); any other goes to the app's handler.
  const handle = answerTypedErrors;

  const jobName = (req: Request): string => parseOrThrow(jobNameSchema, req.params.id, 'job name');

  // One restore plan of a job at a time: another request for it waits its turn, so that an agent
  // asking again and again holds one plan's reads and work, not many at once.
  const planning = new Map<string, Promise<void>>();
  const oneAtATime = async <T>(job: string, work: () => Promise<T>): Promise<T> => {
    const mine = (planning.get(job) ?? Promise.resolve()).then(work);
    const settled = mine.then(
      () => undefined,
      () => undefined,
    );
    planning.set(job, settled);
    try {
      return await mine;
    } finally {
      if (planning.get(job) === settled) planning.delete(job);
    }
  };

  /** A hot-swap job's world epoch and state, for listings. */
  const worldOf = async (record: JobRecord): Promise<{ world?: { epoch: number; state: string } }> =>
    record.spec.hotSwap ? { world: await jobs.world.summary(record.spec.name) } : {};

  /** The job's name, once the caller may act for it: any job for an operator, a job on its node (or spare) for an agent. */
  const trainingJob = async (req: Request, res: Response): Promise<string> => (await mayTrainFor(jobs, jobName(req), req, res)).spec.name;

  apiRoute(
    router,
    'post',
    '/jobs',
    handle(async (req, res) => {
      const record = await jobs.create(await admitJob(req.body, deps));
      const actor = identityOf(res);
      await deps.audit.append(
        {
          type: 'action',
          ref: `register-${record.spec.name}-${Date.parse(record.createdAt)}`,
          summary: `${record.spec.name}: registered on ${record.spec.nodes.join(', ')}, version ${record.spec.codeVersion}`,
          actor,
          data: { job: record.spec.name, verb: 'register', state: 'done', nodes: record.spec.nodes, codeVersion: record.spec.codeVersion },
        },
        `register:${record.spec.name}:${record.createdAt}`,
      );
      // A job is registered while it trains: its version has proven itself, so a later rollback
      // has somewhere to go.
      await deps.dispatcher?.apply({ job: record.spec.name, event: { type: 'restart_succeeded', time: Date.now() }, eventId: 'registered', origin: actor });
      res.status(201).json({ job: record, ettr: await jobs.ettr(record.spec.name) });
    }),
  );

  apiRoute(
    router,
    'get',
    '/jobs',
    handle(async (_req, res) => {
      const records = await jobs.list();
      res.json({
        jobs: await Promise.all(records.map(async (record) => ({ ...record, ettr: await jobs.ettr(record.spec.name), ...(await worldOf(record)) }))),
      });
    }),
  );

  apiRoute(
    router,
    'get',
    '/jobs/:id',
    handle(async (req, res) => {
      const name = jobName(req);
      const record = await jobs.get(name);
      res.json({ job: record, ettr: await jobs.ettr(name), ...(await worldOf(record)) });
    }),
  );

  // Unregisters the job: steadfast stops watching and recovering it (the workload itself runs on).
  apiRoute(
    router,
    'delete',
    '/jobs/:id',
    handle(async (req, res) => {
      const name = jobName(req);
      const record = await jobs.delete(name);
      await deps.audit.append(
        {
          type: 'action',
          ref: `unregister-${name}-${Date.now()}`,
          summary: `${name}: unregistered by an operator (was ${record.state}); ${record.spec.nodes.join(', ')} no longer belong to it`,
          actor: identityOf(res),
          data: { job: name, verb: 'unregister', state: 'done', previous: record.state, nodes: record.spec.nodes },
        },
        `unregister:${name}:${record.createdAt}`,
      );
      res.json({ deleted: name, was: record.state });
    }),
  );

  apiRoute(
    router,
    'put',
    '/jobs/:id/policy',
    handle(async (req, res) => {
      const name = jobName(req);
      const change = parseOrThrow(policyChangeSchema, req.body, 'job policy');
      const policy = await jobs.setPolicy(name, change);
      const said = `recovery ${policy.recovery ? 'on' : 'off'}, dry-run ${policy.dryRun ? 'on' : 'off'}`;
      await deps.audit.append(
        {
          type: 'action',
          ref: `policy-${name}-${Date.now()}`,
          summary: `${name}: job policy set by an operator: ${said}`,
          data: { job: name, verb: 'set_policy', state: 'done', policy },
          actor: identityOf(res),
        },
        `policy:${name}:${Date.now()}:${said}`,
      );
      res.json({ job: name, policy });
    }),
  );

  apiRoute(
    router,
    'post',
    '/jobs/:id/checkpoints',
    handle(async (req, res) => {
      res.status(202).json({ accepted: await jobs.addCheckpoints(await trainingJob(req, res), req.body) });
    }),
  );

  apiRoute(
    router,
    'get',
    '/jobs/:id/restore-plan',
    handle(async (req, res) => {
      const name = await trainingJob(req, res);
      const evictedParam = typeof req.query.evicted === 'string' ? req.query.evicted : '';
      const evicted = new Set(
        evictedParam
          .split(',')
          .filter(Boolean)
          .map((node) => parseOrThrow(nodeNameSchema, node, 'evicted')),
      );
      const plan = await oneAtATime(name, async () => {
        const record = await jobs.get(name);
        const { topology } = parseJobSpec(record.spec);
        const rankNodes = new Map(topology.ranks.map((rank) => [rank.rank, rank.node] as const));
        const members = new Set(jobMembers(record));
        // Copies on the evicted nodes are lost, and so are those on nodes that left the job (an evicted node replaced by a standby).
        return (
          await planRestoreByStep(jobs.checkpointSteps(name), { ranks: topology.ranks.length, rankNodes }, async (holders) =>
            holders.filter((holder) => evicted.has(holder) || !members.has(holder)),
          )
        ).plan;
      });
      if (!plan) {
        res.status(409).json({ error: `no checkpoint step of ${name} survives the evictions of ${[...evicted].join(', ') || 'no node'}` });
        return;
      }
      res.json(plan);
    }),
  );

  // The training loop polls this before each iteration and applies a new revision once (Greyhound §5.2, S2).
  apiRoute(
    router,
    'get',
    '/jobs/:id/microbatches',
    handle(async (req, res) => {
      if (!deps.microbatches) throw new StoreUnavailableError('this controller runs without fail-slow mitigation');
      res.json(await deps.microbatches.get(await trainingJob(req, res)));
    }),
  );

  apiRoute(
    router,
    'post',
    '/jobs/:id/code-updates',
    handle(async (req, res) => {
      const name = jobName(req);
      await jobs.get(name);
      const update = parseOrThrow(codeUpdateSchema, req.body, 'code update');
      if (!deps.dispatcher) throw new StoreUnavailableError('this controller runs without recovery');
      const steps = await deps.dispatcher.apply({
        job: name,
        event: { type: 'code_update', time: Date.now(), version: update.version, urgent: update.urgent },
        eventId: `update:${update.version}:${update.urgent ? 'urgent' : 'lazy'}`,
        origin: identityOf(res),
      });
      res.status(202).json({ job: name, version: update.version, urgent: update.urgent, steps: steps.map((step) => step.verb) });
    }),
  );

  apiRoute(
    router,
    'get',
    '/standby/:node',
    handle(async (req, res) => {
      const node = parseOrThrow(nodeNameSchema, req.params.node, 'node');
      const [standbys, job, member] = await Promise.all([backend.standbys(), jobs.jobOnNode(node), deps.pool?.member(node)]);
      const role = standbys.includes(node) ? 'standby' : job ? 'active' : 'unassigned';
      res.json({ node, role, job: role === 'active' ? job : undefined, state: member?.state });
    }),
  );

  // A standby's agent reports its self-check; a healthy one becomes ready for evictions.
  apiRoute(
    router,
    'post',
    '/standby/:node/self-check',
    handle(async (req, res) => {
      const node = parseOrThrow(nodeNameSchema, req.params.node, 'node');
      const report = parseOrThrow(selfCheckSchema, req.body, 'self-check');
      const member = await deps.pool?.selfCheck(node, report.ok, report.detail);
      if (!member) {
        res.status(404).json({ error: `${node} is not in the standby pool` });
        return;
      }
      res.json({ node, state: member.state });
    }),
  );

  return router;
}
