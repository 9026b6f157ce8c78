import type { Job } from 'bullmq';
import type { ClusterBackend } from '../../actuators/backend.js';
import { DryRunBackend } from '../../actuators/dry-run.js';
import type { StepJobs, StepProcessorDeps } from '../../actuators/steps/context.js';
import { createStepProcessor } from '../../actuators/steps/processor.js';
import { SafetyGates } from '../../actuators/safety.js';
import type { JobStore } from '../../controller/job-store.js';
import { AuditLog } from '../../core/audit.js';
import { DEFAULT_RECOVERY } from '../../core/config.js';
import { DoNotRetryError } from '../../core/errors.js';
import { silentLogger } from '../../core/log.js';
import { remediesSchema } from '../../core/remedy-config.js';
import { STEPS_JOB_VERSION, type StepsJob } from '../../core/queues.js';
import type { NodeVerb } from '../../core/steps.js';
import { TEST_LAUNCHERS } from './controller.js';
import type { testRedis } from './redis.js';

/** A node ladder's transition of one step, as the policy worker queues it. */
export function nodeTransition(verb: NodeVerb, options: { id?: string; node?: string; gpu?: string; reason?: string } = {}): StepsJob {
  const node = options.node ?? 'node-1';
  const gpu = options.gpu ?? (verb === 'reset_gpu' ? '0000:3a:00' : undefined);
  return {
    v: STEPS_JOB_VERSION,
    transitionId: options.id ?? `d-${verb}`,
    node,
    steps: [
      {
        verb,
        nodes: [node],
        ...(gpu ? { gpu } : {}),
        reason: options.reason ?? 'fatal Xid 48 (uncorrectable double-bit ECC error) on GPU 0000:3a:00',
        citation: 'test',
      },
    ],
    fault: { signalId: 's-1', fingerprint: `xid/${node}/0000:3a:00/48`, time: new Date().toISOString() },
  };
}

/** A queue job as BullMQ hands it to the processor: its delivery count and its tries. */
export function queued<T>(data: T, attemptsMade = 0, attempts = 3): Job {
  return { id: 'job-1', data, attemptsMade, opts: { attempts } } as unknown as Job;
}

/** Each action entry of `ref`, oldest first, as `state: detail`. */
export async function actionStates(audit: AuditLog, ref?: string): Promise<string[]> {
  return (await audit.read({ type: 'action', limit: 1000, ...(ref ? { ref } : {}) })).map(
    (entry) => `${String(entry.data.state)}: ${String(entry.data.detail)}`,
  );
}

/** The newest action entry's state and detail for `ref`. */
export async function lastAction(audit: AuditLog, ref: string): Promise<{ state: string; detail: string }> {
  const entries = await audit.read({ type: 'action', limit: 1000, ref });
  const last = entries.at(-1);
  return { state: String(last?.data.state), detail: String(last?.data.detail) };
}

/**
 * The step processor alone, on a test Redis: a generous budget, the test launchers, the shipped
 * quarantine policy, no ladder behind it (feedback goes nowhere) unless `extra` says. Without a
 * job store, a job's steps find no job.
 */
export function testStepProcessor(
  store: ReturnType<typeof testRedis>,
  parts: { readonly backend: ClusterBackend; readonly jobs?: JobStore; readonly audit?: AuditLog; readonly gates?: SafetyGates },
  extra: Partial<StepProcessorDeps> = {},
): ReturnType<typeof createStepProcessor> {
  return createStepProcessor({
    redis: store.redis,
    keys: store.keys,
    audit: parts.audit ?? new AuditLog(store.redis, store.keys),
    backend: parts.backend,
    gates: parts.gates ?? new SafetyGates(store.redis, store.keys, { maxPerWindow: 10, windowSeconds: 600 }, 30),
    jobs: parts.jobs ?? NO_JOBS,
    launchers: TEST_LAUNCHERS,
    logger: silentLogger(),
    feedback: async () => undefined,
    quarantine: { afterEvictions: DEFAULT_RECOVERY.quarantineAfterEvictions, windowMs: DEFAULT_RECOVERY.quarantineWindowSeconds * 1000 },
    remedies: remediesSchema.parse({}),
    ...extra,
  });
}

const NO_JOBS: StepJobs = {
  get: async (job) => {
    throw new DoNotRetryError(`job ${job} is not registered`);
  },
  replaceNode: async () => undefined,
  useSpare: async () => undefined,
  addSpare: async () => undefined,
  vacate: async () => undefined,
  setVersion: async () => undefined,
  checkpointSteps: async function* () {},
};

/**
 * The dry-run backend under another name: it records drains as dry-run does, but the step
 * processor treats it as a real scheduler (a dry-run controller asks no agent to reset a GPU).
 */
export function recordingBackend(store: ReturnType<typeof testRedis>): DryRunBackend {
  return Object.assign(Object.create(new DryRunBackend(store.redis, store.keys)) as DryRunBackend, { name: 'recorder' });
}

/** The job most recovery tests register: four nodes, two pipeline stages of two replicas, the `accept` launcher. */
export const LLAMA = {
  name: 'llama',
  nodes: ['n00', 'n01', 'n02', 'n03'],
  ranksPerNode: 1,
  topology: { pp: 2, dp: 2, order: 'tp-dp-pp' },
  // The `accept` launcher stands in for sbatch: it accepts the job.
  launcher: 'accept',
  codeVersion: 'v1',
};
