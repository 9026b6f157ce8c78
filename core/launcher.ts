import { z } from 'zod';
import { InputError } from './errors.js';
import { EQUALITY_SELECTOR_RULE, isEqualityLabelSelector, isNamespace } from './kubernetes-names.js';

/**
 * How a registered job is (re)started. Launchers are written by the operator in the controller's
 * configuration (`launchers:`), each under a name; a job registration only names one. Nothing
 * that arrives over the API ever becomes a command: the API can fill a launcher's placeholders
 * ({job}, {nodes}, {nodeCount}, {version}) from the job's own validated fields, and that is all.
 */

export const LAUNCHER_NAME_PATTERN = /^[a-z0-9][a-z0-9_-]{0,62}$/;
export const launcherNameSchema = z
  .string({ error: 'must name a launcher from the controller configuration (launchers:); a registration carries no command' })
  .regex(LAUNCHER_NAME_PATTERN, 'must be a launcher name: 1-63 lower-case letters, digits, "_" or "-"');

/** Placeholders a Slurm launcher's argv may use; each becomes exactly one argument. */
export const LAUNCHER_PLACEHOLDERS = ['{job}', '{nodes}', '{nodeCount}', '{version}'] as const;

/**
 * Left as written, for the job itself to fill on each node: the Python training client replaces
 * `{node}` in its token files' paths (STEADFAST_TOKEN_FILE, STEADFAST_AGENT_TOKEN_FILE) with
 * the node it runs on, so one launch serves every node with that node's own token.
 */
export const JOB_SIDE_PLACEHOLDERS = ['{node}'] as const;
const ALLOWED_PLACEHOLDERS: readonly string[] = [...LAUNCHER_PLACEHOLDERS, ...JOB_SIDE_PLACEHOLDERS];

/** One argv element as written by the operator: no NUL (execve cannot pass it) and no other control character. */
export const launcherArgSchema = z
  .string()
  .min(1)
  .max(1024)
  .regex(/^[^\u0000-\u001f\u007f]*$/, 'must not contain control characters (NUL, newline, …)')
  .refine(
    (arg) => (arg.match(/\{[^}]*\}/g) ?? []).every((placeholder) => ALLOWED_PLACEHOLDERS.includes(placeholder)),
    `may use only the placeholders ${LAUNCHER_PLACEHOLDERS.join(', ')} (filled by the controller) and ${JOB_SIDE_PLACEHOLDERS.join(', ')} (left for the training client)`,
  );

const argvSchema = z.array(launcherArgSchema).min(1).max(64);

export const launcherSchema = z.discriminatedUnion('kind', [
  z
    .object({
      kind: z.literal('slurm'),
      /** argv run to (re)start the job, e.g. ["sbatch", "--nodelist={nodes}", "train.sh", "{version}"]; never a shell string. */
      command: argvSchema,
      /**
       * Optional argv that runs a short replay of the job on one group of machines ({nodes})
       * and exits 0 when it trains correctly there; dual-phase replay (ByteRobust §4.2,
       * Algorithm 1) runs it on horizontal then vertical groups. Without it, replay is skipped.
       */
      replay: argvSchema.optional(),
    })
    .strict(),
  z
    .object({
      kind: z.literal('kubernetes'),
      namespace: z.string().refine(isNamespace, 'must be a Kubernetes namespace name (1-63 lower-case letters, digits or "-")'),
      /** The workload that runs the job, e.g. `jobs.batch/llama` or `pytorchjobs.kubeflow.org/llama`. */
      workload: z
        .string()
        .max(512)
        .regex(/^[a-z0-9.-]+\/[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, 'must be <resource>/<name>'),
      /** Label selector of the workload's pods; a relaunch deletes them and their controller recreates them. */
      podSelector: z.string().refine(isEqualityLabelSelector, EQUALITY_SELECTOR_RULE),
    })
    .strict(),
]);

export type Launcher = z.infer<typeof launcherSchema>;
export type SlurmLauncher = Extract<Launcher, { kind: 'slurm' }>;

/** The operator's launchers by name (the config's `launchers:` section). */
export type Launchers = Readonly<Record<string, Launcher>>;

/** The launcher `name` names; InputError naming the configured ones when there is none. */
export function resolveLauncher(launchers: Launchers, name: string): Launcher {
  const launcher = Object.hasOwn(launchers, name) ? launchers[name] : undefined;
  if (launcher !== undefined) return launcher;
  const known = Object.keys(launchers).sort();
  throw new InputError(
    `job.launcher: "${name}" is not a launcher of this controller (${known.length > 0 ? `configured: ${known.join(', ')}` : 'none configured; add one under launchers: in its configuration'})`,
    'launcher',
  );
}
