import { Command } from 'commander';
import { loadConfig } from '../core/config.js';
import { Keys, workerConnection } from '../core/redis.js';
import { JobStore } from '../controller/job-store.js';
import { runCommand } from './common.js';

/** `steadfast jobs`: the registered training jobs with their state and ETTR. */
export function jobsCommand(): Command {
  return new Command('jobs')
    .description('List registered training jobs with their state, code version, nodes and ETTR.')
    .option('-c, --config <file>', 'YAML config file', process.env.STEADFAST_CONFIG)
    .option('--json', 'print {"jobs": [...]} as JSON')
    .action(async (options: { config?: string; json?: boolean }) => {
      await runCommand(async () => {
        const config = loadConfig({ file: options.config });
        const redis = workerConnection(config.redis, { maxRetriesPerRequest: 1 });
        try {
          const store = new JobStore(redis, new Keys(config.redis.prefix));
          const jobs = await Promise.all((await store.list()).map(async (record) => ({ ...record, ettr: await store.ettr(record.spec.name) })));
          if (options.json) {
            process.stdout.write(`${JSON.stringify({ jobs }, null, 2)}\n`);
            return;
          }
          const percent = (value: number): string => `${(value * 100).toFixed(1)}%`;
          process.stdout.write(`${'JOB'.padEnd(24)} ${'STATE'.padEnd(18)} ${'VERSION'.padEnd(12)} ${'NODES'.padStart(5)} ${'ETTR'.padStart(7)} ${'ETTR 1h'.padStart(7)}  SINCE\n`);
          for (const job of jobs) {
            process.stdout.write(
              `${job.spec.name.padEnd(24)} ${job.state.padEnd(18)} ${job.spec.codeVersion.padEnd(12)} ${String(job.spec.nodes.length).padStart(5)} ${percent(job.ettr.cumulative).padStart(7)} ${percent(job.ettr.window1h).padStart(7)}  ${job.stateSince}\n`,
            );
          }
        } finally {
          redis.disconnect();
        }
      });
    });
}
