import { hostname } from 'node:os';
import { gpuSourceSetting } from '../agent/gpu-source.js';
import { exitIfNvmlStuck } from '../agent/sources/nvml/client.js';
import { Command, Option } from 'commander';
import { z } from 'zod';
import { resolveToken } from '../core/token.js';
import { parseAgentToken } from '../core/credentials.js';
import { InputError } from '../core/errors.js';
import { createLogger, type Logger } from '../core/log.js';
import { nodeNameSchema } from '../core/names.js';
import type { CollectorFactory } from '../agent/collector.js';
import type { CollectorFlag, CollectorSettings } from '../agent/flags.js';
import { DEFAULT_AGENT_CONNECTIONS, DEFAULT_AGENT_RATE_LIMIT, createAgent, type AgentOptions } from '../agent/agent.js';
import type { TokenSource } from '../agent/fast-path-client.js';
import { DEFAULT_CODE_CACHE_DIR } from './agent-bundle.js';
import { applyAgentV8Flags } from './agent-v8.js';
import { EXIT_USAGE } from './common.js';
import { COLLECTOR_FACTORIES, enabledFactories } from '../agent/index.js';

/**
 * `steadfast agent`: the per-node exporter. Flags follow node_exporter's spelling
 * (`--web.listen-address`, `--path.sysfs`, `--collector.<name>` / `--no-collector.<name>`) so
 * that people who run node_exporter read them without a manual.
 */

export const AGENT_TOKEN_ENV = 'STEADFAST_AGENT_TOKEN';

/** What the flags resolve to: the agent's own options, less the logger, plus `--once`. */
export type AgentSettings = Omit<AgentOptions, 'logger' | 'listen'> & {
  readonly listen: { readonly host: string; readonly port: number };
  readonly once: boolean;
};

export interface AgentCommandIo {
  /** Where `--once` writes the exposition text. */
  readonly stdout: (text: string) => void;
  /** Logger to use; by default pino to stderr, so that stdout carries only metrics. */
  readonly logger?: Logger | undefined;
  readonly env: NodeJS.ProcessEnv;
  readonly factories: readonly CollectorFactory[];
  /**
   * Set the agent's V8 flags (cli/agent-v8.ts) before it starts: for the agent process itself,
   * not for a test that runs the command in its own process.
   */
  readonly setV8Flags: boolean;
}

/** `host:port`, `[v6]:port` or `:port` (all interfaces), as node_exporter accepts. */
const listenAddressSchema = z.string().transform((value, context) => {
  const match = /^(?:\[([^\]]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(value);
  const port = Number(match?.[3]);
  if (!match || port > 65535) {
    context.addIssue({ code: 'custom', message: `must be host:port, [ipv6]:port or :port, got "${value}"` });
    return z.NEVER;
  }
  return { host: match[1] ?? (match[2] || '0.0.0.0'), port };
});

const flagsSchema = z.object({
  'web.listenAddress': listenAddressSchema,
  node: nodeNameSchema,
  'path.sysfs': z.string().min(1, 'must not be empty'),
  'path.procfs': z.string().min(1, 'must not be empty'),
  'path.kmsg': z.string().min(1, 'must not be empty'),
  'nvidiaSmi.xml': z.string().min(1, 'must not be empty').optional(),
  'nvidiaSmi.path': z.string().min(1, 'must not be empty'),
  'gpu.pollInterval': z.coerce
    .number({ message: 'must be a number of seconds' })
    .min(0.1, 'must be at least 0.1 seconds')
    .max(3600, 'must be at most 3600 seconds'),
  'controller.url': z.url({ protocol: /^https?$/, message: 'must be an http:// or https:// URL' }).optional(),
  'controller.tokenFile': z.string().min(1, 'must not be empty').optional(),
  'controller.kubernetesTokenFile': z.string().min(1, 'must not be empty').optional(),
  'web.tokenFile': z.string().min(1, 'must not be empty').optional(),
  'web.insecure': z.boolean().default(false),
  'web.rateLimit': z.coerce
    .number({ message: 'must be a number of requests per second' })
    .min(0, 'must be at least 0 (0: no limit)')
    .max(100_000, 'must be at most 100000'),
  'web.rateBurst': z.coerce
    .number({ message: 'must be a whole number' })
    .int('must be a whole number')
    .min(1, 'must be at least 1')
    .max(100_000, 'must be at most 100000'),
  'web.maxConnectionsPerClient': z.coerce
    .number({ message: 'must be a whole number' })
    .int('must be a whole number')
    .min(0, 'must be at least 0 (0: no cap)')
    .max(100_000, 'must be at most 100000'),
  once: z.boolean().default(false),
});

/** commander's key for a collector flag: `--training.log-format` → `training.logFormat`. */
function flagKey(flag: CollectorFlag): string {
  return new Option(`--${flag.name} ${flag.value}`).attributeName();
}

function collectorSettings(flags: Record<string, unknown>, factories: readonly CollectorFactory[]): CollectorSettings {
  const settings: Record<string, string | readonly string[] | undefined> = {};
  for (const flag of factories.flatMap((factory) => factory.flags ?? [])) {
    const value = flags[flagKey(flag)];
    if (typeof value === 'string' || (Array.isArray(value) && value.every((item) => typeof item === 'string'))) {
      settings[flag.name] = value as string | string[];
    }
  }
  return settings;
}

/** The flag a parsed option key came from: `web.listenAddress` → `--web.listen-address`. */
function flagName(key: string): string {
  return `--${key.replace(/[A-Z]/g, (letter) => `-${letter.toLowerCase()}`)}`;
}

/** Validates the parsed flags; throws an InputError naming the flag at fault. */
export function agentSettingsFromFlags(
  flags: Record<string, unknown>,
  env: NodeJS.ProcessEnv,
  factories: readonly CollectorFactory[] = COLLECTOR_FACTORIES,
): AgentSettings {
  const parsed = flagsSchema.safeParse(flags);
  if (!parsed.success) {
    const message = parsed.error.issues.map((issue) => `${flagName(issue.path.map(String).join('.'))}: ${issue.message}`).join('; ');
    const first = parsed.error.issues[0];
    throw new InputError(message, first ? flagName(first.path.map(String).join('.')) : undefined);
  }
  const options = parsed.data;
  const choices: Record<string, boolean | undefined> = {};
  for (const factory of factories) {
    // commander keys `--collector.gpu-reset` as `collector.gpuReset`.
    const choice = flags[new Option(`--collector.${factory.name}`).attributeName()];
    if (typeof choice === 'boolean') choices[factory.name] = choice;
  }
  const controllerUrl = options['controller.url'];
  let controllerToken: TokenSource | undefined;
  const kubernetesTokenFile = options['controller.kubernetesTokenFile'];
  if (kubernetesTokenFile !== undefined && options['controller.tokenFile'] !== undefined) {
    throw new InputError('--controller.kubernetes-token-file: give it or --controller.token-file, not both', '--controller.kubernetes-token-file');
  }
  if (controllerUrl !== undefined && kubernetesTokenFile !== undefined) {
    // The kubelet rotates a projected token in place: read it at every request, and once now so
    // that a missing volume stops the start instead of the first fault.
    controllerToken = () => resolveToken({ tokenFile: kubernetesTokenFile }, '--controller.kubernetes-token-file');
    controllerToken();
  } else if (controllerUrl !== undefined) {
    const tokenFile = options['controller.tokenFile'];
    try {
      // The file named on the command line wins over the environment.
      controllerToken = resolveToken(tokenFile ? { tokenFile } : { token: env[AGENT_TOKEN_ENV] }, 'agent');
    } catch (error) {
      if (!(error instanceof InputError)) throw error;
      throw new InputError(`--controller.token-file / ${AGENT_TOKEN_ENV}: ${error.message}`, '--controller.token-file');
    }
    if (controllerToken.length < 16) {
      throw new InputError(`${AGENT_TOKEN_ENV}: token must be at least 16 characters`, AGENT_TOKEN_ENV);
    }
    // The controller takes only this node's reports from it; say so now rather than at the first fault.
    const bound = parseAgentToken(controllerToken);
    if (!bound) {
      throw new InputError(
        `--controller.token-file / ${AGENT_TOKEN_ENV}: not an agent token (NODE.HEX, as \`steadfast token agent --node ${options.node}\` prints it)`,
        '--controller.token-file',
      );
    }
    if (bound.node !== options.node) {
      throw new InputError(
        `--controller.token-file / ${AGENT_TOKEN_ENV}: the token is node ${bound.node}'s, but this agent runs as --node ${options.node}`,
        '--controller.token-file',
      );
    }
  }
  const webTokenFile = options['web.tokenFile'];
  if (webTokenFile !== undefined && options['web.insecure']) {
    throw new InputError('--web.insecure: give --web.token-file or --web.insecure, not both', '--web.insecure');
  }
  if (webTokenFile === undefined && !options['web.insecure'] && !options.once) {
    throw new InputError(
      "--web.token-file: the agent's POST endpoints (/api/v1/training, /api/v1/trace, /api/v1/diagnose) need a token; give --web.token-file FILE, or --web.insecure to leave them open on a trusted network",
      '--web.token-file',
    );
  }
  const settings = collectorSettings(flags, factories);
  // The GPU source's flags (--gpu.source, --gpu.dcgm-exporter-url, --gpu.nvml-library), checked before anything starts.
  gpuSourceSetting(settings);
  return {
    listen: options['web.listenAddress'],
    node: options.node,
    paths: {
      sysfs: options['path.sysfs'],
      procfs: options['path.procfs'],
      kmsg: options['path.kmsg'],
      nvidiaSmiXml: options['nvidiaSmi.xml'],
      nvidiaSmi: options['nvidiaSmi.path'],
    },
    pollIntervalSeconds: options['gpu.pollInterval'],
    collectors: enabledFactories(choices, factories),
    controllerUrl,
    controllerToken,
    apiToken: webTokenFile ? resolveToken({ tokenFile: webTokenFile }, '--web.token-file') : undefined,
    rateLimit: { requestsPerSecond: options['web.rateLimit'], burst: options['web.rateBurst'] },
    connections: { ...DEFAULT_AGENT_CONNECTIONS, maxPerClient: options['web.maxConnectionsPerClient'] },
    settings,
    once: options.once,
  };
}

export function agentCommand(io: Partial<AgentCommandIo> = {}): Command {
  const factories = io.factories ?? COLLECTOR_FACTORIES;
  const env = io.env ?? process.env;
  const command = new Command('agent')
    .description('Run the node agent: exports GPU and kernel-log (Xid) health on /metrics and sends fatal events to the controller.')
    .option('--web.listen-address <host:port>', 'address to serve /metrics and /healthz on', '0.0.0.0:9401')
    .option('--node <name>', 'this node as the scheduler names it', hostname())
    .option('--path.sysfs <dir>', 'sysfs mount point', '/sys')
    .option('--path.procfs <dir>', 'procfs mount point', '/proc')
    .option(
      '--path.kmsg <file>',
      'kernel log: /dev/kmsg, or a log file to follow (another character device or a FIFO is read in bounded passes: 8 MiB or 2 s)',
      '/dev/kmsg',
    )
    .option('--nvidia-smi.xml <file>', 'read this captured `nvidia-smi -q -x` file at every poll instead of running nvidia-smi')
    .option('--nvidia-smi.path <file>', 'nvidia-smi binary', 'nvidia-smi')
    .option('--gpu.poll-interval <seconds>', 'seconds between nvidia-smi polls', '5')
    .option('--controller.url <url>', 'controller base URL for fast-path events (none: no fast path)')
    .option('--controller.token-file <file>', `file holding this node's agent token, from \`steadfast token agent\` (default: $${AGENT_TOKEN_ENV})`)
    .option(
      '--controller.kubernetes-token-file <file>',
      "instead: the pod's projected service-account token for the controller's audience (controller.auth.kubernetesAgents), read at every request",
    )
    .option(
      '--web.token-file <file>',
      'bearer token required on every POST endpoint of the agent (/api/v1/training, /api/v1/trace, /api/v1/diagnose); required unless --web.insecure',
    )
    .option('--web.insecure', 'serve the POST endpoints without a token (a trusted network only)')
    .option(
      '--web.rate-limit <per-second>',
      'requests per second each client may send to the POST endpoints; more answer 429 (0: no limit)',
      String(DEFAULT_AGENT_RATE_LIMIT.requestsPerSecond),
    )
    .option('--web.rate-burst <requests>', 'requests a client may send at once before --web.rate-limit applies', String(DEFAULT_AGENT_RATE_LIMIT.burst))
    .option(
      '--web.max-connections-per-client <n>',
      'connections one client address may hold open at once; more are closed as they open (0: no cap, e.g. behind a proxy)',
      String(DEFAULT_AGENT_CONNECTIONS.maxPerClient),
    )
    .option('--once', 'print one scrape to stdout and exit')
    // Handled by the loader before this command runs (cli/agent-bundle.ts); listed for --help.
    .option(
      '--write-code-cache',
      `(root) write V8's code cache of the agent for this Node.js build into $STEADFAST_AGENT_CODE_CACHE_DIR (default ${DEFAULT_CODE_CACHE_DIR}) and exit; later starts compile from it`,
    )
    .option('--code-cache-status', 'print whether a start would compile from a code cache, and which file, and exit');
  for (const factory of factories) {
    command.option(
      `--collector.${factory.name}`,
      `enable the ${factory.name} collector: ${factory.help} (default: ${factory.defaultEnabled ? 'enabled' : 'disabled'})`,
    );
    command.option(`--no-collector.${factory.name}`, `disable the ${factory.name} collector`);
    for (const flag of factory.flags ?? []) {
      const option = new Option(`--${flag.name} ${flag.value}`, flag.description);
      if (flag.default !== undefined) option.default(flag.default);
      if (flag.repeatable) option.argParser((value: string, previous: string[] | undefined) => [...(previous ?? []), value]);
      command.addOption(option);
    }
  }
  command.action(async function (this: Command) {
    if (this.opts().writeCodeCache || this.opts().codeCacheStatus) {
      this.error(
        'error: --write-code-cache and --code-cache-status work on the agent bundle (dist/agent.cjs, made by npm run build), which this agent does not run from',
        { exitCode: EXIT_USAGE, code: 'steadfast.invalidFlag' },
      );
    }
    let settings: AgentSettings;
    try {
      settings = agentSettingsFromFlags(this.opts(), env, factories);
    } catch (error) {
      if (error instanceof InputError) this.error(`error: ${error.message}`, { exitCode: EXIT_USAGE, code: 'steadfast.invalidFlag' });
      throw error;
    }
    if (io.setV8Flags) applyAgentV8Flags();
    const logger = io.logger ?? createLogger('steadfast-agent');
    let agent: ReturnType<typeof createAgent>;
    try {
      agent = createAgent({ ...settings, logger });
    } catch (error) {
      // A collector that refuses its settings (a value only it can judge) is a usage error too.
      if (error instanceof InputError) this.error(`error: ${error.message}`, { exitCode: EXIT_USAGE, code: 'steadfast.invalidFlag' });
      throw error;
    }
    if (settings.once) {
      try {
        (io.stdout ?? ((text: string) => process.stdout.write(text)))(await agent.scrapeOnce());
      } finally {
        await agent.close();
      }
      await exitIfNvmlStuck((message) => logger.warn(message));
      return;
    }
    const address = await agent.start();
    const stop = (signal: NodeJS.Signals): void => {
      logger.info({ signal }, 'stopping');
      agent
        .close()
        .then(
          () => logger.info('stopped'),
          (error: unknown) => {
            logger.error({ err: error instanceof Error ? error.message : String(error) }, 'error while stopping');
            process.exitCode = 1;
          },
        )
        .then(() => exitIfNvmlStuck((message) => logger.warn(message)))
        .catch((error: unknown) => logger.error({ err: error instanceof Error ? error.message : String(error) }, 'error while stopping'));
    };
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
    // Said once a SIGTERM would be handled: a supervisor that reads this line may stop the agent at once.
    logger.info({ address: `${address.address}:${address.port}`, node: settings.node }, 'steadfast agent started');
  });
  return command;
}
