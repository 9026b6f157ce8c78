import { z } from 'zod';
import { LabError, run, runQuietly } from './command.js';
import { ownedByPrefix, type LabLayout, type LabNode } from './layout.js';

/**
 * The lab's network: one bridge on the host holding `<subnet>.1`, and per node a network
 * namespace joined to it by a veth pair. The namespaces get no default route, so a node can
 * reach the bridge's /24 and nothing else: nothing the lab does leaves this machine.
 */

const linksSchema = z.array(z.object({ ifname: z.string() }).loose());
const netnsSchema = z.array(z.object({ name: z.string() }).loose());
const addressesSchema = z.array(z.object({ ifname: z.string(), addr_info: z.array(z.object({ local: z.string().optional() }).loose()).default([]) }).loose());

function parseJson<T>(schema: z.ZodType<T>, text: string, what: string): T {
  // `ip -j` prints nothing at all for an empty list on some versions.
  const parsed = schema.safeParse(text.trim() === '' ? [] : JSON.parse(text));
  if (!parsed.success) throw new LabError(`unexpected output from ip (${what}): ${text.slice(0, 200)}`);
  return parsed.data;
}

export async function listNetns(): Promise<string[]> {
  return parseJson(netnsSchema, await run('ip', ['-j', 'netns', 'list']), 'netns list').map((entry) => entry.name);
}

export async function listLinks(): Promise<string[]> {
  return parseJson(linksSchema, await run('ip', ['-j', 'link', 'show']), 'link show').map((entry) => entry.ifname);
}

/** Namespaces and host links carrying the lab's prefix: what `down` removes even without a state file. */
export async function labNetworkLeftovers(prefix: string): Promise<{ netns: string[]; links: string[] }> {
  const [netns, links] = await Promise.all([listNetns(), listLinks()]);
  return { netns: netns.filter((name) => ownedByPrefix(prefix, name)), links: links.filter((name) => ownedByPrefix(prefix, name)) };
}

/** The interface, other than the lab's own bridge, that already holds an address in `subnet`. */
export async function subnetUser(subnet: string, ownBridge: string): Promise<string | undefined> {
  const interfaces = parseJson(addressesSchema, await run('ip', ['-j', '-4', 'addr', 'show']), 'addr show');
  const taken = interfaces.find((entry) => entry.ifname !== ownBridge && entry.addr_info.some((info) => info.local?.startsWith(`${subnet}.`)));
  return taken?.ifname;
}

export async function createBridge(layout: LabLayout): Promise<void> {
  await run('ip', ['link', 'add', layout.bridge, 'type', 'bridge']);
  await run('ip', ['addr', 'add', `${layout.bridgeAddress}/${layout.prefixLength}`, 'dev', layout.bridge]);
  await run('ip', ['link', 'set', layout.bridge, 'up']);
}

export async function createNodeNetwork(layout: LabLayout, node: LabNode): Promise<void> {
  await run('ip', ['netns', 'add', node.netns]);
  await run('ip', ['link', 'add', node.hostLink, 'type', 'veth', 'peer', 'name', node.nodeLink]);
  await run('ip', ['link', 'set', node.nodeLink, 'netns', node.netns]);
  await run('ip', ['link', 'set', node.hostLink, 'master', layout.bridge]);
  await run('ip', ['link', 'set', node.hostLink, 'up']);
  await run('ip', ['-n', node.netns, 'link', 'set', node.nodeLink, 'name', 'eth0']);
  await run('ip', ['-n', node.netns, 'addr', 'add', `${node.address}/${layout.prefixLength}`, 'dev', 'eth0']);
  await run('ip', ['-n', node.netns, 'link', 'set', 'eth0', 'up']);
  // srun and gloo also talk to themselves over loopback.
  await run('ip', ['-n', node.netns, 'link', 'set', 'lo', 'up']);
}

/**
 * Makes a node's link slow: a token bucket (tc tbf) on the node's end of its veth holds what the
 * node sends to `rateMbit`, as a port that trained down to a lower speed or a degraded cable
 * would. A token bucket rather than netem's delay: it needs only sch_tbf, which kernels without
 * sch_netem (this lab's, often) have. Queued packets wait up to a second rather than being
 * dropped. The qdisc goes with the veth at lab down.
 */
export async function impairNodeLink(node: LabNode, impairment: { readonly rateMbit: number }): Promise<void> {
  const tbf = ['tbf', 'rate', `${impairment.rateMbit}mbit`, 'burst', '64kb', 'latency', '1000ms'];
  await run('tc', ['-n', node.netns, 'qdisc', 'replace', 'dev', 'eth0', 'root', ...tbf]);
}

/** Takes a node's link impairment away again; nothing to do when it has none. */
export async function clearNodeLink(node: LabNode): Promise<void> {
  await runQuietly('tc', ['-n', node.netns, 'qdisc', 'del', 'dev', 'eth0', 'root']);
}

/** The node link's root qdisc as tc shows it (`qdisc tbf 8001: root refcnt 2 rate 16Mbit burst 64Kb lat 1s`). */
export async function nodeLinkQdisc(node: LabNode): Promise<string> {
  return (await run('tc', ['-n', node.netns, 'qdisc', 'show', 'dev', 'eth0'])).trim();
}

/** Pids of every process inside a namespace (whoever entered it: slurmd, slurmstepd, ranks). */
export async function netnsPids(netns: string): Promise<number[]> {
  const out = await run('ip', ['netns', 'pids', netns]).catch(() => '');
  return out
    .split('\n')
    .map((line) => Number(line.trim()))
    .filter((pid) => Number.isInteger(pid) && pid > 0);
}

/**
 * Removes the namespaces and links: the layout's names and any others with the prefix. Deleting
 * a namespace destroys the veth end inside it and with it the pair; the host ends and the
 * bridge are deleted as well in case a namespace was never made. Returns what is still there.
 */
export async function removeLabNetwork(layout: LabLayout): Promise<{ netns: string[]; links: string[] }> {
  const prefix = layout.options.prefix;
  const found = await labNetworkLeftovers(prefix);
  const netns = new Set([...layout.nodes.map((node) => node.netns), ...found.netns]);
  const existingNetns = new Set(await listNetns());
  for (const name of netns) if (existingNetns.has(name)) await runQuietly('ip', ['netns', 'delete', name]);
  const links = await listLinks();
  for (const name of links.filter((link) => ownedByPrefix(prefix, link) && link !== layout.bridge)) await runQuietly('ip', ['link', 'delete', name]);
  if ((await listLinks()).includes(layout.bridge)) await runQuietly('ip', ['link', 'delete', layout.bridge]);
  return labNetworkLeftovers(prefix);
}

/** The preflight lab's slow link: the compute node at `slowNode` held to `rateMbit` (impairNodeLink); which node, and when. */
export async function slowLink(
  computeNodes: readonly LabNode[],
  option: { readonly slowNode: number; readonly rateMbit: number },
): Promise<{ readonly node: string; readonly at: number }> {
  const slow = computeNodes[option.slowNode];
  if (slow === undefined) throw new LabError(`preflight.slowNode ${option.slowNode} is not one of the ${computeNodes.length} compute nodes`);
  await impairNodeLink(slow, { rateMbit: option.rateMbit });
  return { node: slow.name, at: Date.now() };
}
