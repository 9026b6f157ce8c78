import { setFlagsFromString } from 'node:v8';

/**
 * V8 settings the agent chooses for itself, so that every way of starting it (the npm package's
 * `steadfast`, the Debian unit, the Kubernetes DaemonSet, `node bin/steadfast.js`) runs in the
 * same small footprint without a wrapper passing node flags. V8 reads each of them when it
 * collects garbage or considers optimising a function, so they take effect when set at run time
 * (Node.js 20 leaves V8's flags writable):
 *   --semi-space-growth-factor=1  the young generation keeps its initial 1 MB semi-spaces instead
 *                                 of growing to 16 MB under a steady scrape load;
 *   --optimize-for-size           the old generation grows in small steps over what is live;
 *   --no-opt                      no TurboFan: its compiler's memory and the optimised code stay
 *                                 out, for some more CPU per scrape (Sparkplug still compiles).
 * bench/startup.ts prints the memory and CPU per scrape they give, next to node_exporter's.
 * A flag the operator gave node (STEADFAST_NODE_FLAGS, NODE_OPTIONS) on the same setting wins.
 */

interface AgentV8Flag {
  /** What setFlagsFromString receives. */
  readonly flag: string;
  /** Node or V8 flags that set the same thing; any of them among the operator's leaves ours out. */
  readonly sameSetting: readonly string[];
}

export const AGENT_V8_FLAGS: readonly AgentV8Flag[] = [
  { flag: '--semi-space-growth-factor=1', sameSetting: ['--semi-space-growth-factor', '--max-semi-space-size', '--min-semi-space-size'] },
  { flag: '--optimize-for-size', sameSetting: ['--optimize-for-size', '--no-optimize-for-size'] },
  { flag: '--no-opt', sameSetting: ['--opt', '--no-opt', '--turbofan', '--no-turbofan', '--lite-mode', '--no-lite-mode', '--jitless'] },
];

/** The flag names in a list of node arguments: `--max-semi-space-size=1` → `--max-semi-space-size`, `_` read as `-`. */
function flagNames(nodeArgs: readonly string[]): Set<string> {
  return new Set(nodeArgs.map((arg) => (arg.split('=')[0] ?? arg).replace(/_/g, '-')));
}

/** The flags of AGENT_V8_FLAGS that none of the operator's node arguments already decides. */
export function agentV8Flags(nodeArgs: readonly string[]): string[] {
  const given = flagNames(nodeArgs);
  return AGENT_V8_FLAGS.filter((entry) => !entry.sameSetting.some((name) => given.has(name))).map((entry) => entry.flag);
}

/** Sets the agent's V8 flags; call before the agent's modules load, so that loading them runs under them too. */
export function applyAgentV8Flags(
  nodeArgs: readonly string[] = [...process.execArgv, ...(process.env.NODE_OPTIONS ?? '').split(/\s+/).filter(Boolean)],
): string[] {
  const flags = agentV8Flags(nodeArgs);
  for (const flag of flags) setFlagsFromString(flag);
  return flags;
}
