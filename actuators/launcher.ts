import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { errorMessage } from '../core/errors.js';
import { launchArgv, launchNodes, type JobSpec } from '../core/job.js';
import type { Launcher, Launchers } from '../core/launcher.js';
import type { ClusterBackend } from './backend.js';

const run = promisify(execFile);
const LAUNCH_TIMEOUT_MS = 120_000;
/** What of a launcher's own words goes into the audit and the ladder. */
const SAID_MAX = 300;

/**
 * - launched: the scheduler accepted the job (whether it trains is decided later, from progress);
 * - failed: the launcher refused or broke; `reason` is what it said, for the ladder;
 * - needs_person: this backend has no way to start the workload, or the job's launcher is gone
 *   from the configuration.
 */
export type LaunchOutcome =
  | { readonly state: 'launched'; readonly detail: string }
  | { readonly state: 'failed'; readonly detail: string; readonly reason: string }
  | { readonly state: 'needs_person'; readonly detail: string };

/** The operator's launcher a job names, or undefined when the configuration no longer has it. */
export function launcherOf(launchers: Launchers, spec: JobSpec): Launcher | undefined {
  return typeof spec.launcher === 'string' && Object.hasOwn(launchers, spec.launcher) ? launchers[spec.launcher] : undefined;
}

/**
 * Starts a registered job again, on the nodes and code version its spec names now, through the
 * operator's launcher the job names:
 * - Slurm: runs the launcher's argv (e.g. `sbatch …`) with {job}, {nodes} and {version} filled
 *   in and checked (launchArgv), never through a shell, in the backend's environment;
 * - Kubernetes: deletes the workload's pods so that its own controller recreates them.
 * `recordOnly` (a job in dry-run) says what would run and runs nothing.
 */
export async function launchJob(spec: JobSpec, launchers: Launchers, backend: ClusterBackend, options: { recordOnly?: boolean } = {}): Promise<LaunchOutcome> {
  const launcher = launcherOf(launchers, spec);
  if (launcher === undefined) {
    return {
      state: 'needs_person',
      detail: `launcher ${JSON.stringify(spec.launcher)} is not in the controller's configuration (launchers:); restart the job by hand or configure it`,
    };
  }
  if (launcher.kind === 'slurm') {
    try {
      // Inside the try: a stored value launchArgv refuses is a failed restart on record, not a crashed step.
      // A hot-swap job's unused spares are part of its allocation: the relaunch starts their spare processes too.
      const argv = launchArgv(launcher, { job: spec.name, nodes: launchNodes(spec), version: spec.codeVersion });
      if (options.recordOnly) return { state: 'launched', detail: `dry-run: would run ${JSON.stringify(argv)}` };
      // The backend's environment (SLURM_CONF) so that sbatch reaches the cluster scontrol drains on.
      const env = backend.launchEnv ? { ...process.env, ...backend.launchEnv } : undefined;
      const { stdout } = await run(argv[0] as string, argv.slice(1), { timeout: LAUNCH_TIMEOUT_MS, maxBuffer: 1024 * 1024, env });
      return { state: 'launched', detail: `launched ${spec.codeVersion} on ${launchNodes(spec).join(',')}: ${stdout.trim().slice(0, 200) || 'ok'}` };
    } catch (error) {
      const said = ((error as { stderr?: string }).stderr?.trim() || errorMessage(error)).slice(0, SAID_MAX);
      return { state: 'failed', detail: `launcher failed: ${said}`, reason: said };
    }
  }
  if (!backend.relaunchWorkload) {
    return { state: 'needs_person', detail: `the ${backend.name} backend cannot relaunch Kubernetes workload ${launcher.workload}; restart it by hand` };
  }
  try {
    const deleted = await backend.relaunchWorkload(launcher.namespace, launcher.podSelector);
    return { state: 'launched', detail: `relaunched ${launcher.workload} in ${launcher.namespace}: ${deleted} pods deleted for its controller to recreate` };
  } catch (error) {
    const said = errorMessage(error).slice(0, SAID_MAX);
    return { state: 'failed', detail: `relaunch of ${launcher.workload} failed: ${said}`, reason: said };
  }
}
