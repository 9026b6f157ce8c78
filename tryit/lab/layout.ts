import { resolve, join } from 'node:path';
import { z } from 'zod';
import { parseOrThrow } from '../../core/validate.js';

/**
 * Where everything of one lab lives: its names (namespaces, links, Slurm nodes), its addresses on
 * the private bridge, and its files. Pure: every other part of the lab asks this module, so `up`,
 * `down` and `status` always agree on the names, whether or not a state file survived.
 */

/** Private /24 networks only (RFC 1918), written as the first three octets, e.g. `10.201.0`. */
const SUBNET_PATTERN = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;

function isPrivateSubnet(value: string): boolean {
  const match = SUBNET_PATTERN.exec(value);
  if (!match) return false;
  const [a, b, c] = [Number(match[1]), Number(match[2]), Number(match[3])];
  if ([a, b, c].some((octet) => octet > 255)) return false;
  return a === 10 || (a === 172 && b >= 16 && b <= 31) || (a === 192 && b === 168);
}

/** At most this many nodes and standbys together: each slurmd is small, but a rank is ~240 MB. */
export const MAX_LAB_NODES = 64;

export const labOptionsSchema = z
  .object({
    /** Compute nodes: node-1 … node-N. */
    nodes: z.number().int().min(1).max(MAX_LAB_NODES).default(4),
    /** Warm standbys after them, held in the standby reservation. */
    standbys: z.number().int().min(0).max(MAX_LAB_NODES).default(2),
    /** State directory: slurm.conf, logs, spool, the state file. */
    dir: z.string().min(1).default('.run/lab'),
    /**
     * Prefix of every namespace and link the lab makes, so that `down` can find them by name
     * alone. Short: Linux limits interface names to 15 characters.
     */
    prefix: z
      .string()
      .regex(/^[a-z][a-z0-9]{1,7}$/, 'must be 2-8 lower-case letters or digits, starting with a letter')
      .default('sflab'),
    /** The private /24 the bridge and the nodes take their addresses from. */
    subnet: z
      .string()
      .refine(isPrivateSubnet, 'must be the first three octets of a private /24 (10.x.y, 172.16-31.x, 192.168.x), e.g. 10.201.0')
      .default('10.201.0'),
    /** Reservation holding the standbys, as the controller's Slurm backend names it. */
    reservation: z
      .string()
      .regex(/^[A-Za-z0-9_-]{1,64}$/)
      .default('steadfast-standby'),
  })
  .strict()
  .refine((options) => options.nodes + options.standbys <= MAX_LAB_NODES, {
    message: `nodes and standbys together at most ${MAX_LAB_NODES}`,
    path: ['standbys'],
  });

export type LabOptions = z.output<typeof labOptionsSchema>;
export type LabOptionsInput = z.input<typeof labOptionsSchema>;

export type NodeRole = 'compute' | 'standby';

export interface LabNode {
  /** Slurm node name and the node's hostname. */
  readonly name: string;
  readonly role: NodeRole;
  readonly index: number;
  readonly address: string;
  /** Network namespace, under /run/netns. */
  readonly netns: string;
  /** The veth end on the bridge (host side). */
  readonly hostLink: string;
  /** The veth end inside the namespace, before it is renamed eth0. */
  readonly nodeLink: string;
}

export interface LabLayout {
  readonly options: LabOptions;
  readonly dir: string;
  readonly stateFile: string;
  readonly conf: string;
  readonly hostsFile: string;
  readonly slurmStateDir: string;
  readonly spoolDir: string;
  readonly logDir: string;
  readonly jobsDir: string;
  readonly bridge: string;
  readonly bridgeAddress: string;
  /** `/24`, for `ip addr add`. */
  readonly prefixLength: 24;
  readonly nodes: readonly LabNode[];
}

/** Node addresses start here, after the bridge's `.1`. */
const FIRST_NODE_HOST = 11;

export function labLayout(input: LabOptionsInput = {}, cwd = process.cwd()): LabLayout {
  const options = parseOrThrow(labOptionsSchema, input, 'lab options');
  const dir = resolve(cwd, options.dir);
  const total = options.nodes + options.standbys;
  const nodes = Array.from({ length: total }, (_, offset): LabNode => {
    const index = offset + 1;
    const name = `node-${index}`;
    return {
      name,
      role: index <= options.nodes ? 'compute' : 'standby',
      index,
      address: `${options.subnet}.${FIRST_NODE_HOST + offset}`,
      netns: `${options.prefix}-${name}`,
      hostLink: `${options.prefix}-h${index}`,
      nodeLink: `${options.prefix}-n${index}`,
    };
  });
  return {
    options,
    dir,
    stateFile: join(dir, 'lab.json'),
    conf: join(dir, 'slurm.conf'),
    hostsFile: join(dir, 'hosts'),
    slurmStateDir: join(dir, 'slurmctld-state'),
    spoolDir: join(dir, 'spool'),
    logDir: join(dir, 'log'),
    jobsDir: join(dir, 'jobs'),
    bridge: `${options.prefix}-br`,
    bridgeAddress: `${options.subnet}.1`,
    prefixLength: 24,
    nodes,
  };
}

/** True for a namespace or link name this lab's prefix would make. */
export function ownedByPrefix(prefix: string, name: string): boolean {
  return name.startsWith(`${prefix}-`);
}
