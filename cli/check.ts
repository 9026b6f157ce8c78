import { hostname } from 'node:os';
import { Command } from 'commander';
import { SlurmBackend } from '../actuators/slurm.js';
import { createLogger } from '../core/log.js';
import { nodeNameSchema } from '../core/names.js';
import { parseOrThrow } from '../core/validate.js';
import { checkNodeHealth } from '../agent/health-check.js';
import { DEFAULT_NVML_LIBRARY, GPU_SOURCE_FLAG, NVML_LIBRARY_FLAG, gpuSourceSetting } from '../agent/gpu-source.js';
import { exitIfNvmlStuck } from '../agent/sources/nvml/client.js';
import { EXIT_FAILURE, parsePositiveInt, printable, runCommand } from './common.js';

/**
 * `steadfast check`: Slurm's HealthCheckProgram. Runs the agent's xid and gpu collectors once
 * against this node; exit 0 when healthy, 1 with the faults on stdout when not, and with
 * `--drain` drains the node itself (`scontrol update`, argument array, never a shell) with them
 * as the reason. docs/deploy-slurm.md has the slurm.conf lines.
 */

export const DEFAULT_CHECK_XID_STATE_FILE = '/var/lib/steadfast/check-xid-state.json';
const REASON_PREFIX = 'steadfast check: ';

interface CheckOptions {
  node: string;
  'path.sysfs': string;
  'path.procfs': string;
  'path.kmsg': string;
  'nvidiaSmi.path': string;
  'nvidiaSmi.xml'?: string;
  'gpu.source': string;
  'gpu.nvmlLibrary': string;
  'xid.stateFile': string;
  expectGpus?: number;
  drain?: boolean;
  scontrol: string;
  slurmConf?: string;
}

export function checkCommand(): Command {
  return new Command('check')
    .description(
      'Check this node once for fatal GPU faults (fatal Xid since boot, a lost GPU); exit 1 and optionally drain it in Slurm. For slurm.conf HealthCheckProgram.',
    )
    .option('--node <name>', 'this node as Slurm names it', hostname().split('.')[0])
    .option('--path.sysfs <dir>', 'sysfs mount point', '/sys')
    .option('--path.procfs <dir>', 'procfs mount point', '/proc')
    .option('--path.kmsg <file>', 'kernel log: /dev/kmsg, or a log file (another character device or a FIFO: at most 8 MiB or 2 s of it)', '/dev/kmsg')
    .option('--nvidia-smi.path <file>', 'nvidia-smi binary', 'nvidia-smi')
    .option('--nvidia-smi.xml <file>', 'read this captured `nvidia-smi -q -x` file instead of running nvidia-smi')
    .option('--gpu.source <source>', "where to read the GPUs: auto, nvml, nvidia-smi (as the agent's --gpu.source)", 'auto')
    .option('--gpu.nvml-library <file>', 'the NVML library to load', DEFAULT_NVML_LIBRARY)
    .option('--xid.state-file <file>', "where the fatal Xids this check reported are remembered (not the agent's file)", DEFAULT_CHECK_XID_STATE_FILE)
    .option('--expect-gpus <count>', 'GPUs this node has; fewer listed (or none readable) is a fault', parsePositiveInt)
    .option('--drain', 'drain this node in Slurm with the faults as the reason (scontrol update ... State=DRAIN)')
    .option('--scontrol <path>', 'scontrol binary, for --drain', 'scontrol')
    .option('--slurm-conf <file>', 'slurm.conf for --drain (default: scontrol’s own, or $SLURM_CONF)')
    .action(async (options: CheckOptions) => {
      await runCommand(async () => {
        const node = parseOrThrow(nodeNameSchema, options.node, '--node');
        const gpuSettings = { [GPU_SOURCE_FLAG]: options['gpu.source'], [NVML_LIBRARY_FLAG]: options['gpu.nvmlLibrary'] };
        gpuSourceSetting(gpuSettings);
        const logger = createLogger('steadfast-check', process.env.STEADFAST_LOG_LEVEL ?? 'warn');
        const verdict = await checkNodeHealth({
          node,
          paths: {
            sysfs: options['path.sysfs'],
            procfs: options['path.procfs'],
            kmsg: options['path.kmsg'],
            nvidiaSmi: options['nvidiaSmi.path'],
            nvidiaSmiXml: options['nvidiaSmi.xml'],
          },
          xidStateFile: options['xid.stateFile'],
          gpuSettings,
          expectGpus: options.expectGpus,
          logger,
          report: async (faults) => {
            const reason = `${REASON_PREFIX}${faults.join('; ')}`;
            if (options.drain) {
              const slurm = new SlurmBackend({
                scontrol: options.scontrol,
                sinfo: 'sinfo',
                env: options.slurmConf ? { SLURM_CONF: options.slurmConf } : {},
                timeoutMs: 30_000,
              });
              await slurm.drain(node, reason);
            }
            process.stdout.write(`${printable(`${node}: ${reason}`)}${options.drain ? ' (drained)' : ''}\n`);
          },
        });
        if (!verdict.healthy) process.exitCode = EXIT_FAILURE;
        else process.stdout.write(`${node}: healthy\n`);
        // A driver hung in an NVML call must not hold a prolog or HealthCheckProgram past its verdict.
        await exitIfNvmlStuck((message) => logger.warn(message));
      });
    });
}
