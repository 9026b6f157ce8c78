import type { Command } from 'commander';
import { loadTryit } from './tryit.js';

/**
 * Every `steadfast` subcommand, by name, with the line the top-level help shows for it and how
 * to load it. A command's module (and what it pulls in: BullMQ, the Kubernetes client, the
 * simulator) is imported only when that command runs, so `steadfast agent` and
 * `steadfast --version` start without the controller's dependencies.
 */
export interface CommandEntry {
  readonly name: string;
  /** One line for `steadfast --help`; the command's own description shows in `steadfast NAME --help`. */
  readonly summary: string;
  /** Imports the command's module and builds the command(s) it defines; the one named `name` is used. */
  readonly load: () => Promise<Command | readonly Command[]>;
}

export const COMMANDS: readonly CommandEntry[] = [
  {
    name: 'agent',
    summary: 'Run the node agent: GPU, kernel-log, network and storage health on /metrics, fatal events to the controller.',
    load: async () => (await import('./agent.js')).agentCommand({ setV8Flags: true }),
  },
  {
    name: 'controller',
    summary: 'Run the controller: Alertmanager webhook, agent fast path, policy and actuator workers.',
    load: async () => (await import('./controller.js')).controllerCommand(),
  },
  {
    name: 'audit',
    summary: 'Print the audit trail: every signal, decision and action with its reason.',
    load: async () => (await import('./audit.js')).auditCommand(),
  },
  { name: 'jobs', summary: 'List, unregister and set the policy of registered training jobs.', load: async () => (await import('./jobs.js')).jobsCommand() },
  { name: 'queues', summary: 'Show the steadfast queues and their newest failed jobs.', load: async () => (await import('./queues.js')).queuesCommand() },
  { name: 'pause', summary: 'Stop every actuator from acting.', load: async () => (await import('./pause.js')).pauseCommands() },
  { name: 'unpause', summary: 'Let actuators act again.', load: async () => (await import('./pause.js')).pauseCommands() },
  {
    name: 'hold',
    summary: 'Hold a node for maintenance: steadfast never acts on it until released.',
    load: async () => (await import('./holds.js')).holdCommands(),
  },
  { name: 'release', summary: "Release a node's hold.", load: async () => (await import('./holds.js')).holdCommands() },
  { name: 'holds', summary: 'List the nodes held for maintenance.', load: async () => (await import('./holds.js')).holdCommands() },
  {
    name: 'remediations',
    summary: "Show a node's remediation history: GPU resets, drains, reboots, hand-offs.",
    load: async () => (await import('./remediations.js')).remediationsCommand(),
  },
  { name: 'resume', summary: 'Return a drained node to service.', load: async () => (await import('./resume.js')).resumeCommand() },
  {
    name: 'policy',
    summary: 'Print what steadfast does about each Xid and SXid code, and who says so (catalogue or configuration).',
    load: async () => (await import('./policy.js')).policyCommand(),
  },
  {
    name: 'plan',
    summary: 'Planners: standby pool, checkpoint placement and interval, micro-batches, replay groups.',
    load: async () => (await import('./plan.js')).planCommand(),
  },
  {
    name: 'analyze',
    summary: 'Runtime analyzers on captured evidence (stack aggregation).',
    load: async () => (await import('./analyze.js')).analyzeCommand(),
  },
  {
    name: 'detect',
    summary: 'Detectors over recorded data: fail-slow iterations, multi-signal suspects.',
    load: async () => (await import('./detect.js')).detectCommand(),
  },
  {
    name: 'simulate',
    summary: "Simulations that put numbers on steadfast's recovery policy.",
    load: async () => ((await loadTryit('simulate')) as typeof import('../tryit/cli/simulate.js')).simulateCommand(),
  },
  {
    name: 'dashboards',
    summary: 'Write the Grafana dashboards and provisioning files.',
    load: async () => (await import('./dashboards.js')).dashboardsCommand(),
  },
  {
    name: 'rules',
    summary: 'Render the Prometheus alerting rules with your thresholds, selectors and runbook links.',
    load: async () => (await import('./rules.js')).rulesCommand(),
  },
  {
    name: 'alertmanager-config',
    summary: "Render the Alertmanager config: faults to the controller's webhook, the rest to people.",
    load: async () => (await import('./alertmanager-config.js')).alertmanagerConfigCommand(),
  },
  { name: 'sd', summary: 'Write Prometheus service-discovery targets for the agents.', load: async () => (await import('./sd.js')).sdCommand() },
  {
    name: 'check',
    summary: 'Check this node once for fatal GPU faults (Slurm HealthCheckProgram).',
    load: async () => (await import('./check.js')).checkCommand(),
  },
  {
    name: 'demo',
    summary: 'Run the whole pipeline on loopback and show a fatal Xid travel to a Slurm drain.',
    load: async () => ((await loadTryit('demo')) as typeof import('../tryit/cli/demo.js')).demoCommand(),
  },
  {
    name: 'lab',
    summary: 'A real Slurm cluster on this machine, one network namespace per node (root).',
    load: async () => ((await loadTryit('lab')) as typeof import('../tryit/cli/lab.js')).labCommand(),
  },
  { name: 'token', summary: 'Print credentials for provisioning (agent tokens).', load: async () => (await import('./token.js')).tokenCommand() },
];

/** The subcommand an argument list names: its first word that is not an option (`help NAME` names NAME). */
export function chosenCommand(args: readonly string[]): string | undefined {
  const words = args.filter((arg) => !arg.startsWith('-'));
  return words[0] === 'help' ? words[1] : words[0];
}

/** Loads the command `entry` names, throwing when its module does not define it (a wiring mistake). */
export async function loadCommand(entry: CommandEntry): Promise<Command> {
  const loaded = await entry.load();
  const command = (Array.isArray(loaded) ? loaded : [loaded]).find((candidate: Command) => candidate.name() === entry.name);
  if (!command) throw new Error(`steadfast ${entry.name}: its module defines no command of that name`);
  return command.summary(entry.summary);
}
