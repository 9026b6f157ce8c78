import { randomBytes } from 'node:crypto';
import { InputError } from '../../core/errors.js';
import { ProtectedLab, SCENARIO_NAMES, runScenarios, scenarioLabs, type ProtectedLabOptions, type ScenarioName, type ScenarioReport } from '../lab/index.js';
import { EXIT_FAILURE, untilSignalled } from '../../cli/common.js';

/**
 * `steadfast demo --scenario training`: the lab under steadfast's protection (tryit/lab/protected.ts)
 * with the PyTorch example training, broken by each scenario in turn; exits 0 only if the job
 * recovered from every one. The scenarios that need a lab of their own (the hang: 3 ranks, a short
 * stalled-progress bound) run last, each on its own lab. `--json` prints `{"scenarios": [...]}` on stdout and the progress
 * on stderr.
 */

export interface TrainingDemoOptions {
  readonly json?: boolean;
  /** Comma-separated subset of SCENARIO_NAMES, in the order to run them. */
  readonly scenarios?: string;
  readonly keepRunning?: boolean;
  readonly verbose?: boolean;
}

export function parseScenarioList(value: string | undefined): ScenarioName[] {
  if (value === undefined) return [...SCENARIO_NAMES];
  const names = value
    .split(',')
    .map((name) => name.trim())
    .filter(Boolean);
  const unknown = names.filter((name) => !(SCENARIO_NAMES as readonly string[]).includes(name));
  if (names.length === 0 || unknown.length > 0) {
    throw new InputError(
      `--scenarios: ${unknown.length > 0 ? `unknown ${unknown.join(', ')}` : 'empty'}; choose from ${SCENARIO_NAMES.join(', ')}`,
      '--scenarios',
    );
  }
  return names as ScenarioName[];
}

function describeReport(report: ScenarioReport): string {
  const lines = [
    '',
    `${report.recovered ? '✓' : '✗'} ${report.name}: ${report.recovered ? `recovered in ${report.recoverySeconds ?? '?'} s` : 'NOT recovered'}; resumed from step ${report.resumedFromStep ?? '?'}, ${report.lostIterations ?? '?'} iteration${report.lostIterations === 1 ? '' : 's'} lost; Slurm runs ${report.slurmJobIds.join(' → ') || '(none)'}`,
    '  ms after the fault',
  ];
  let previous = 0;
  for (const step of report.timeline) {
    const at = step.afterMs === null ? '     —' : String(step.afterMs).padStart(6);
    const delta = step.afterMs === null ? '' : `(+${Math.max(0, step.afterMs - previous)})`;
    if (step.afterMs !== null) previous = Math.max(previous, step.afterMs);
    lines.push(`  ${at} ${delta.padEnd(9)} ${step.label}`);
    if (step.detail) lines.push(`  ${' '.repeat(16)} ${step.detail}`);
  }
  for (const problem of report.problems) lines.push(`  problem: ${problem}`);
  if (report.context !== undefined) lines.push('  the lab as the scenario was judged:', ...report.context.map((line) => `  | ${line}`));
  return `${lines.join('\n')}\n`;
}

export async function runTrainingDemo(options: TrainingDemoOptions): Promise<void> {
  const names = parseScenarioList(options.scenarios);
  if (process.getuid?.() !== 0) throw new InputError('--scenario training runs the lab (network namespaces, a bridge, slurmd), which needs root');
  // Progress goes where it does not mix with the JSON.
  const say = (text: string): void => void (options.json ? process.stderr : process.stdout).write(text);
  const reports: ScenarioReport[] = [];
  const labs = scenarioLabs(names);
  for (const [index, group] of labs.entries()) {
    const last = index === labs.length - 1;
    await onLab(group.options, group.names, { ...options, keepRunning: last && options.keepRunning === true }, say, reports);
  }
  if (options.json) {
    process.stdout.write(`${JSON.stringify({ scenarios: reports }, null, 2)}\n`);
  } else {
    const failed = reports.filter((report) => !report.recovered);
    say(failed.length === 0 ? `\nOK: the job recovered from every scenario.\n` : `\nFAILED: ${failed.map((report) => report.name).join(', ')}\n`);
  }
  if (reports.some((report) => !report.recovered)) process.exitCode = EXIT_FAILURE;
}

/** One lab: up, the job started, `names` run on it (their reports added to `reports`), down (after Ctrl-C with --keep-running). */
async function onLab(
  labOptions: ProtectedLabOptions,
  names: ScenarioName[],
  options: TrainingDemoOptions,
  say: (text: string) => void,
  reports: ScenarioReport[],
): Promise<void> {
  const lab = ProtectedLab.create({
    prefix: `sfd${randomBytes(2).toString('hex')}`,
    subnet: `10.203.${randomBytes(1)[0] ?? 0}`,
    verbose: options.verbose,
    keepDir: options.keepRunning,
    progress: (step, seconds) => say(`  ✓ ${step} (${seconds.toFixed(1)} s)\n`),
    ...labOptions,
  });
  say(`steadfast demo: a PyTorch job under steadfast's protection in the lab (${lab.root}); scenarios ${names.join(', ')}\n`);
  const interrupted = (signal: NodeJS.Signals): void => {
    say(`\n${signal}: taking the lab and every process the demo started down …\n`);
    void lab.down().finally(() => process.exit(130));
  };
  process.once('SIGINT', interrupted);
  process.once('SIGTERM', interrupted);
  try {
    await lab.up();
    const first = await lab.startTraining();
    say(
      `  ✓ job ${lab.job} registered with the controller and submitted with sbatch: Slurm job ${first} on ${lab.computeNodes.map((node) => node.name).join(', ')}\n`,
    );
    await runScenarios(lab, names, (report) => {
      reports.push(report);
      if (!options.json) say(describeReport(report));
      else say(`  ${report.recovered ? '✓' : '✗'} ${report.name}\n`);
    });
    if (options.keepRunning) {
      process.removeListener('SIGINT', interrupted);
      process.removeListener('SIGTERM', interrupted);
      say(
        `\nStill running (Ctrl-C takes it all down):\n  controller   ${lab.controllerUrl} (operator token in ${lab.credentials.operatorTokenFile})\n  Prometheus   ${lab.prometheus.url}\n  Alertmanager ${lab.alertmanager.url}\n  export SLURM_CONF=${lab.conf}\n  job log      ${lab.paths.logs}\n  files        ${lab.root}\n`,
      );
      await untilSignalled();
    }
  } finally {
    process.removeListener('SIGINT', interrupted);
    process.removeListener('SIGTERM', interrupted);
    say('\nTaking the lab and every process the demo started down …\n');
    const report = await lab.down();
    const left = report ? [...report.leftovers.processes.map((pid) => `pid ${pid}`), ...report.leftovers.netns, ...report.leftovers.links] : [];
    if (left.length > 0) {
      say(`could not remove: ${left.join(', ')} (steadfast lab down --dir ${lab.layout.dir} --prefix ${lab.layout.options.prefix})\n`);
      process.exitCode = EXIT_FAILURE;
    }
  }
}
