/**
 * Which command started the agent: `steadfast agent` from the full CLI, or `steadfast-agent`, the
 * agent-only package's command. The loader (agent-bundle.ts) is given it by the bin script and
 * hands it to the bundled entry point (agent-main.ts), which builds that command's program. Its
 * own module so that the loader and the entry point, one of which loads the other at run time,
 * do not import each other.
 */
export type AgentEntry = 'steadfast' | 'steadfast-agent';
