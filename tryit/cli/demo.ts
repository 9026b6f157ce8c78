import { join, relative, resolve } from 'node:path';
import { Command } from 'commander';
import { writeDashboards } from '../../dashboards/index.js';
import { SimEnvironment } from '../environment.js';
import { runRecoveryScenario } from '../recovery-scenario.js';
import { runFallenOffBus, type ScenarioResult } from '../scenario.js';
import { InputError } from '../../core/errors.js';
import { SCENARIO_NAMES } from '../lab/index.js';
import { EXIT_FAILURE, parsePositiveInt, printable, runCommand } from '../../cli/common.js';
import { runTrainingDemo } from './demo-training.js';

/** Writes the dashboards and provisioning for the demo's Prometheus, and says in two lines how to load them. */
function writeGrafanaFiles(outDir: string, prometheusUrl: string, keepRunning: boolean): void {
  const written = writeDashboards(outDir, { prometheusUrl });
  const shown = relative(process.cwd(), outDir).startsWith('..') ? outDir : `./${relative(process.cwd(), outDir)}`;
  const dashboards = written.filter((path) => path.endsWith('.json')).length;
  process.stdout.write(
    `\nGrafana: ${dashboards} dashboards and provisioning in ${shown} (datasource ${prometheusUrl}${keepRunning ? '' : ', up only with --keep-running'}). Load them by copying\n` +
      `  ${join(shown, 'provisioning')}/* into /etc/grafana/provisioning/ and restarting Grafana, or import ${join(shown, 'dashboards')}/*.json (Dashboards > New > Import).\n`,
  );
}

function printTimeline(result: ScenarioResult): void {
  const out = process.stdout;
  out.write('\nTimeline (ms after the injection)\n');
  let previous = 0;
  for (const step of result.timeline) {
    const at = step.afterMs === undefined ? '     —' : String(step.afterMs).padStart(6);
    const delta = step.afterMs === undefined ? '' : `(+${Math.max(0, step.afterMs - previous)})`;
    if (step.afterMs !== undefined) previous = Math.max(previous, step.afterMs);
    out.write(`  ${at} ${delta.padEnd(9)} ${printable(step.label)}\n           ${' '.repeat(9)} ${printable(step.detail)}\n`);
  }
  out.write(`\nsinfo: ${printable(`${result.node} ${result.slurmState} "${result.slurmReason}"`)}\n`);
  out.write(`drains recorded by slurmctld: ${result.slurmDrains}; drain calls by steadfast: ${result.backendDrains}\n`);
}

export function demoCommand(): Command {
  return new Command('demo')
    .description(
      'Start Redis, Prometheus, Alertmanager, slurmctld, the controller and N simulated nodes on loopback; inject a fatal Xid 79 and show it travel to a Slurm drain.',
    )
    .option(
      '--scenario <name>',
      'spine (a fatal Xid to one Slurm drain), recovery (the recovery ladder: evict onto standbys, NIC flaps, rollback) or training (a real PyTorch job in the lab, broken and recovered; root)',
      'spine',
    )
    .option('--scenarios <list>', `with --scenario training: which of ${SCENARIO_NAMES.join(', ')} to run, in that order (default: all)`)
    .option('--json', 'with --scenario training: print {"scenarios": [...]} on stdout, progress on stderr')
    .option('--nodes <count>', 'simulated nodes', parsePositiveInt, 8)
    .option('--node <name>', 'node to break (default: node-3)')
    .option('--gpu <index>', 'GPU index to break', (value) => parsePositiveInt(String(Number(value) + 1)) - 1, 2)
    .option('--no-fast-path', 'agents do not report to the controller directly; only the Prometheus path acts')
    .option('--keep-running', 'leave everything running after the scenario, until Ctrl-C')
    .option('--verbose', 'log the controller and agents to stderr')
    .option('--grafana-out <dir>', 'where to write the Grafana dashboards and provisioning files for the demo', 'steadfast-grafana')
    .action(
      async (options: {
        scenario: string;
        nodes: number;
        node?: string;
        gpu: number;
        fastPath: boolean;
        keepRunning?: boolean;
        verbose?: boolean;
        grafanaOut: string;
        scenarios?: string;
        json?: boolean;
      }) => {
        await runCommand(async () => {
          if (options.scenario === 'training') {
            await runTrainingDemo({ json: options.json, scenarios: options.scenarios, keepRunning: options.keepRunning, verbose: options.verbose });
            return;
          }
          if (options.scenario !== 'spine' && options.scenario !== 'recovery')
            throw new InputError(`--scenario: must be spine, recovery or training, got "${options.scenario}"`);
          if (options.json || options.scenarios !== undefined) throw new InputError('--json and --scenarios go with --scenario training');
          const recovery = options.scenario === 'recovery';
          if (recovery && options.nodes < 7) throw new InputError('--nodes: the recovery scenario needs at least 7 nodes (4 for the job, 3 standbys)');
          const node = options.node ?? `node-${Math.min(3, options.nodes)}`;
          process.stdout.write(
            recovery
              ? `steadfast demo: the recovery ladder on ${options.nodes} simulated nodes\n`
              : `steadfast demo: ${options.nodes} simulated nodes, fault on ${node} GPU ${options.gpu}\n`,
          );
          const env = SimEnvironment.create({
            // The ladder needs room for a few evictions.
            maxDrainsPerWindow: recovery ? 8 : undefined,
            maxJobEvictionPercent: recovery ? 75 : undefined,
            nodes: options.nodes,
            fastPath: options.fastPath,
            verbose: options.verbose,
            keepDir: options.keepRunning,
            progress: (step, seconds) => process.stdout.write(`  ✓ ${step} (${seconds.toFixed(2)} s)\n`),
          });
          // Interrupted at any point: stop every process started so far, then exit.
          const interrupted = (signal: NodeJS.Signals): void => {
            process.stdout.write(`\n${signal}: stopping every process the demo started …\n`);
            void env.stop().finally(() => process.exit(130));
          };
          process.once('SIGINT', interrupted);
          process.once('SIGTERM', interrupted);
          try {
            await env.up();
            if (recovery) {
              const steps = await runRecoveryScenario(env);
              for (const step of steps) {
                process.stdout.write(
                  `\n${step.ok ? '✓' : '✗'} ${step.title}\n${step.lines.map((line) => `    ${printable(line)}`).join('\n')}${step.lines.length ? '\n' : ''}`,
                );
              }
              const failed = steps.filter((step) => !step.ok);
              process.stdout.write(
                failed.length === 0 ? '\nOK: every rung of the ladder ran on the real parts.\n' : `\nFAILED: ${failed.map((step) => step.title).join('; ')}\n`,
              );
              if (failed.length > 0) process.exitCode = EXIT_FAILURE;
            } else {
              process.stdout.write(`\nInjecting Xid 79 (GPU has fallen off the bus) on ${node} …\n`);
              const result = await runFallenOffBus(env, { node, gpuIndex: options.gpu });
              printTimeline(result);
              if (result.ok) {
                process.stdout.write(`\nOK: ${node} drained exactly once, and every later report was recognised as the same fault.\n`);
              } else {
                process.stdout.write(`\nFAILED:\n${result.problems.map((problem) => `  - ${problem}`).join('\n')}\n`);
                process.exitCode = EXIT_FAILURE;
              }
            }
            writeGrafanaFiles(resolve(options.grafanaOut), env.prometheus.url, options.keepRunning === true);
            if (options.keepRunning) {
              process.stdout.write(
                `\nStill running (Ctrl-C stops everything):\n  Prometheus   ${env.prometheus.url}\n  Alertmanager ${env.alertmanager.url}\n  controller   ${env.controllerUrl} (operator token in ${env.credentials.operatorTokenFile})\n  Redis        ${env.redis.url}\n  SLURM_CONF=${env.slurm.conf}\n  files        ${env.root}\n`,
              );
              // The signal handler above stops everything and exits.
              await new Promise<never>(() => undefined);
            }
          } finally {
            process.stdout.write('\nStopping every process the demo started …\n');
            await env.stop();
          }
        });
      },
    );
}
