import { Command } from 'commander';
import { callController, controllerConnection, withControllerOptions } from './controller-client.js';
import { printable, runCommand } from './common.js';

interface PauseAnswer {
  readonly paused: boolean;
  readonly reason?: string;
  readonly drainsInWindow: number;
  readonly maxPerWindow: number;
  readonly windowSeconds: number;
}

/** `steadfast pause` and `steadfast unpause`: the first safety gate, shared by every actuator, set over the controller's API. */
export function pauseCommands(): Command[] {
  const pause = withControllerOptions(
    new Command('pause').description('Stop every actuator from acting (signals and decisions are still recorded; actions are refused with the reason).'),
  )
    .option('-r, --reason <text>', 'why, shown in every refusal', 'paused by operator')
    .action(async (options: Record<string, unknown>) => {
      await runCommand(async () => {
        const answer = await callController<PauseAnswer>(controllerConnection(options), 'POST', '/api/v1/pause', { reason: options.reason });
        process.stdout.write(`paused: ${printable(answer.reason ?? '')}\n`);
      });
    });
  const unpause = withControllerOptions(
    new Command('unpause').description('Let actuators act again; shows the eviction budget used in the current window.'),
  ).action(async (options: Record<string, unknown>) => {
    await runCommand(async () => {
      const answer = await callController<PauseAnswer>(controllerConnection(options), 'DELETE', '/api/v1/pause');
      process.stdout.write(`unpaused; drains in the last ${answer.windowSeconds} s: ${answer.drainsInWindow} of ${answer.maxPerWindow}\n`);
    });
  });
  return [pause, unpause];
}
