import { Command } from 'commander';
import { loadConfig } from '../core/config.js';
import { createLogger } from '../core/log.js';
import { Controller } from '../controller/service.js';
import { parsePort, runCommand, untilSignalled } from './common.js';

export function controllerCommand(): Command {
  return new Command('controller')
    .description('Run the controller: the Alertmanager webhook and agent fast-path intake, the policy and actuator workers.')
    .option('-c, --config <file>', 'YAML config file (env STEADFAST_<SECTION>__<KEY> overrides it)', process.env.STEADFAST_CONFIG)
    .option('--port <port>', 'override controller.port', parsePort)
    .option('--dry-run', 'use the dry-run backend: record drains instead of doing them')
    .option('--no-workers', 'serve HTTP only; run workers elsewhere (steadfast controller --no-http)')
    .option('--no-http', 'run the workers only')
    .action(async (options: { config?: string; port?: number; dryRun?: boolean; workers: boolean; http: boolean }) => {
      let started = false;
      await runCommand(async () => {
        const config = loadConfig({ file: options.config });
        if (options.port !== undefined) config.controller.port = options.port;
        if (options.dryRun) config.backend.kind = 'dry-run';
        const logger = createLogger('steadfast-controller');
        const controller = new Controller({ config, logger, workers: options.workers, http: options.http });
        await controller.start();
        started = true;
        const signal = await untilSignalled();
        logger.info({ signal }, 'shutting down');
        await controller.close();
      });
      // A controller that could not start may have opened Redis connections that would retry for
      // ever (a backend that failed after them): it must exit, not stay up unseen and not listening.
      if (!started && process.exitCode !== undefined && process.exitCode !== 0) process.exit(process.exitCode);
    });
}
