import { z } from 'zod';
import { isLabelKey, isLabelValue } from './kubernetes-names.js';
import { nodeNameSchema } from './names.js';
import { SLURM_PARTITION_PATTERN, type RemediesConfig } from './remedy-config.js';
import { configurationLayers, xidPolicyLayerSchema, type PolicyLayer, type XidPolicyLayer } from './xid-policy.js';

// Numbers are coerced so that environment overrides, which are always strings, validate too.
const int = () => z.coerce.number<unknown>().int();

/**
 * Profiles: settings per group of nodes (the `profiles:` section). One fleet holds groups that
 * want different behaviour — a training partition where a drain costs a job, an inference pool,
 * a burn-in rack whose faults should only be recorded — and one global dry-run, budget and set of
 * rungs fits none of them (NVSentinel's per-node-group policies, their ADR-060). A node belongs to
 * at most one profile; a node in none gets the global settings unchanged. A node that two
 * profiles match is a configuration error for that node: steadfast does nothing automatic on it,
 * rather than pick one of the two silently.
 *
 * A profile may also carry its own `xidPolicy`, laid over the configuration's for its nodes.
 */

export const profileNameSchema = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/, 'letters, digits, ".", "_" or "-", up to 63');

/** A Kubernetes node label key and the value it must have. */
const labelsSchema = z
  .record(
    z.string().refine(isLabelKey, 'a Kubernetes label key: [prefix/]name, the name up to 63 letters, digits, "-", "_" or "."'),
    z.string().refine(isLabelValue, 'a Kubernetes label value: up to 63 letters, digits, "-", "_" or ".", alphanumeric at both ends'),
  )
  .refine((labels) => Object.keys(labels).length > 0 && Object.keys(labels).length <= 32, 'name 1 to 32 labels');

export const profileMatchSchema = z
  .object({
    /** Nodes by name. A node named by two profiles is refused when the configuration loads. */
    nodes: z.array(nodeNameSchema).min(1).max(100_000).optional(),
    /** Slurm partitions: their nodes as the scheduler lists them, re-read every minute. */
    partitions: z
      .array(z.string().regex(SLURM_PARTITION_PATTERN, 'a Slurm partition name: letters, digits, ".", "_" or "-", up to 64'))
      .min(1)
      .max(1000)
      .optional(),
    /** Kubernetes node labels, every one of which the node must carry with that value. */
    nodeLabels: labelsSchema.optional(),
  })
  .strict()
  .refine((match) => match.nodes !== undefined || match.partitions !== undefined || match.nodeLabels !== undefined, {
    message: 'must name nodes, partitions or nodeLabels',
    path: ['nodes'],
  });

export const profileSchema = z
  .object({
    name: profileNameSchema,
    match: profileMatchSchema,
    /** Record this group's steps without carrying them out (as backend.kind dry-run does for every node). */
    dryRun: z.boolean().optional(),
    /** This group's own eviction budget, counted apart from every other group's; the global values where absent. */
    safety: z
      .object({
        maxDrainsPerWindow: int().min(0).optional(),
        windowSeconds: int().min(1).optional(),
      })
      .strict()
      .optional(),
    /** Which rungs this group's nodes may take; each overrides the global switch where given. */
    remedies: z
      .object({
        /** Overrides remedies.gpuReset.enabled. */
        gpuReset: z.boolean().optional(),
        /** Overrides remedies.reboot.enabled: false drains where the global ladder would reboot. */
        reboot: z.boolean().optional(),
        /** false: a node that would be handed off to people is drained instead (not held, no webhook). */
        handOff: z.boolean().optional(),
      })
      .strict()
      .optional(),
    /** What to do per Xid and SXid code on this group's nodes, over the configuration's own `xidPolicy` (core/xid-policy.ts). */
    xidPolicy: xidPolicyLayerSchema.optional(),
  })
  .strict();
export type Profile = z.output<typeof profileSchema>;

/** The source a profile's Xid rules carry in the effective table and the audit. */
export function profileSource(profile: Profile): string {
  return `profile ${profile.name}`;
}

/** The profile's Xid policy as a layer over the configuration's; undefined when it sets none. */
export function profileXidLayer(profile: Profile | undefined): PolicyLayer | undefined {
  return profile?.xidPolicy === undefined ? undefined : { source: profileSource(profile), policy: profile.xidPolicy };
}

export const profilesSchema = z
  .array(profileSchema)
  .max(1000)
  .superRefine((profiles, context) => {
    const names = new Map<string, number>();
    const owners = new Map<string, string>();
    for (const [index, profile] of profiles.entries()) {
      if (names.has(profile.name)) context.addIssue({ code: 'custom', message: `profile name "${profile.name}" is used twice`, path: [index, 'name'] });
      names.set(profile.name, index);
      for (const node of new Set(profile.match.nodes ?? [])) {
        const other = owners.get(node);
        if (other !== undefined && other !== profile.name)
          context.addIssue({ code: 'custom', message: `node "${node}" is in profiles "${other}" and "${profile.name}"`, path: [index, 'match', 'nodes'] });
        else owners.set(node, profile.name);
      }
    }
  })
  .default([]);

/** What steadfast knows of a node to match it: the partitions it is in (Slurm) and its labels (Kubernetes). */
export interface NodeFacts {
  readonly partitions?: ReadonlySet<string>;
  readonly labels?: Readonly<Record<string, string>>;
}

/** A node's profile: none, exactly one, or a conflict between the two or more that match it. */
export type ProfileMatch =
  { readonly kind: 'none' } | { readonly kind: 'profile'; readonly profile: Profile } | { readonly kind: 'conflict'; readonly profiles: readonly string[] };

/** Whether `profile` covers `node`: by name, by any of its partitions, or by all of its labels. */
export function profileMatches(profile: Profile, node: string, facts: NodeFacts): boolean {
  const { match } = profile;
  if (match.nodes?.includes(node)) return true;
  if (match.partitions?.some((partition) => facts.partitions?.has(partition))) return true;
  const labels = match.nodeLabels;
  if (labels !== undefined && facts.labels !== undefined) {
    const have = facts.labels;
    if (Object.entries(labels).every(([key, value]) => have[key] === value)) return true;
  }
  return false;
}

/** The profile of `node` among `profiles`, given what is known of it. */
export function matchProfile(profiles: readonly Profile[], node: string, facts: NodeFacts): ProfileMatch {
  const matched = profiles.filter((profile) => profileMatches(profile, node, facts));
  const [only] = matched;
  if (only === undefined) return { kind: 'none' };
  if (matched.length === 1) return { kind: 'profile', profile: only };
  return { kind: 'conflict', profiles: matched.map((profile) => profile.name) };
}

/** Why a conflicting node is left alone, in the words its audit entries and the log carry. */
export function conflictReason(node: string, profiles: readonly string[]): string {
  return `node ${node} is matched by profiles ${profiles.map((name) => `"${name}"`).join(' and ')}: a configuration error; no automatic action on it until one profile matches`;
}

/** The node's remedies: the global section with the profile's switches laid over it. */
export function profileRemedies(base: RemediesConfig, profile: Profile | undefined): RemediesConfig {
  const own = profile?.remedies;
  if (own === undefined || (own.gpuReset === undefined && own.reboot === undefined)) return base;
  return {
    ...base,
    gpuReset: { ...base.gpuReset, enabled: own.gpuReset ?? base.gpuReset.enabled },
    reboot: { ...base.reboot, enabled: own.reboot ?? base.reboot.enabled },
  };
}

/**
 * Resolves each node's profile (the controller's ProfileResolver): step actuators and the policy
 * worker ask it, so both see the same answer for a node.
 */
export interface NodeProfiles {
  /** The node's profile now; throws a RetryLaterError when what decides it cannot be read yet. */
  resolve(node: string): Promise<ProfileMatch>;
}

/** The Xid policy's stacks of layers a fleet has: the configuration's alone, and with each profile's over it. */
export function xidPolicyStacks(config: { readonly xidPolicy: XidPolicyLayer; readonly profiles: readonly Profile[] }): PolicyLayer[][] {
  const layers = configurationLayers(config.xidPolicy);
  return [layers, ...config.profiles.flatMap((profile) => profileXidLayer(profile) ?? []).map((own) => [...layers, own])];
}

/** The summary suffix an audit entry about a node in a profile carries; empty for a node in none. */
export function profileSuffix(profile: string | undefined): string {
  return profile === undefined ? '' : ` [profile ${profile}]`;
}
