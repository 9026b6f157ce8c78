import { Command } from 'commander';
import { loadConfig, type Config } from '../core/config.js';
import { Keys, workerConnection } from '../core/redis.js';
import { SafetyGates, drainBudget } from '../actuators/safety.js';
import { runCommand } from './common.js';

async function withGates(configFile: string | undefined, work: (gates: SafetyGates, config: Config) => Promise<void>): Promise<void> {
  const config = loadConfig({ file: configFile });
  const redis = workerConnection(config.redis, { maxRetriesPerRequest: 1 });
  try {
    const gates = new SafetyGates(
      redis,
      new Keys(config.redis.prefix),
      { maxPerWindow: drainBudget(config.safety), windowSeconds: config.safety.windowSeconds },
      config.safety.nodeLeaseSeconds,
    );
    await work(gates, config);
  } finally {
    redis.disconnect();
  }
}

/** `steadfast pause` and `steadfast unpause`: the first safety gate, shared by every actuator. */
export function pauseCommands(): Command[] {
  const pause = new Command('pause')
    .description('Stop every actuator from acting (signals and decisions are still recorded; actions are refused with the reason).')
    .option('-c, --config <file>', 'YAML config file', process.env.STEADFAST_CONFIG)
    .option('-r, --reason <text>', 'why, shown in every refusal', 'paused by operator')
    .action(async (options: { config?: string; reason: string }) => {
      await runCommand(() =>
        withGates(options.config, async (gates) => {
          await gates.pause(options.reason);
          process.stdout.write(`paused: ${options.reason}\n`);
        }),
      );
    });
  const unpause = new Command('unpause')
    .description('Let actuators act again; shows the eviction budget used in the current window.')
    .option('-c, --config <file>', 'YAML config file', process.env.STEADFAST_CONFIG)
    .action(async (options: { config?: string }) => {
      await runCommand(() =>
        withGates(options.config, async (gates, config) => {
          await gates.unpause();
          const used = await gates.budgetUsed();
          process.stdout.write(`unpaused; drains in the last ${config.safety.windowSeconds} s: ${used} of ${drainBudget(config.safety)}\n`);
        }),
      );
    });
  return [pause, unpause];
}
