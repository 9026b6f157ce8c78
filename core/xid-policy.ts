import { z } from 'zod';
import { catalogueXids, xidDecidedByMessage, type XidClass } from './xid.js';

/**
 * What steadfast does about each Xid (GPU) and SXid (NVSwitch) code, where an operator wants
 * otherwise than the catalogue (core/xid.ts): the catalogue's verdict is one fleet's view, and
 * operators of other fleets asked to ignore a code their workloads raise harmlessly, to act on a
 * non-fatal one that precedes their failures, or to act only on the n-th occurrence within a
 * window (the questions behind eks-node-monitoring-agent#272, NVSentinel#270 and DCGM#235).
 *
 * A policy is a stack of layers, each `{ source, policy }`: the catalogue first, then the
 * configuration's `xidPolicy`, then (later) a node group's profile. Per code the last layer that
 * names it wins, and the row it yields says which layer that was, so every decision can name why.
 * The controller alone applies it (controller/policy/xid-rule.ts); the agent only learns from it
 * which codes to send on its fast path (GET /api/v1/xid-policy).
 */

/**
 * ignore    no action, audited as ignored by the policy
 * observe   no action, audited
 * reset     reset the GPU (the node ladder's reset rung; drains when resets are off)
 * drain     take the node out of service (outside a job) or evict it (in a job)
 * reboot    reboot the node (the reboot rung; drains when reboots are off)
 * hand_off  hand the node to people at once (outside a job; in a job the node is evicted)
 */
export const XID_ACTIONS = ['ignore', 'observe', 'reset', 'drain', 'reboot', 'hand_off'] as const;
export type XidAction = (typeof XID_ACTIONS)[number];

/** The kinds of code a policy names: an Xid of a GPU, an SXid of an NVSwitch. */
export type XidKind = 'xid' | 'sxid';

export const MAX_XID_CODE = 100_000;
export const MAX_SXID_CODE = 100_000;
export const MAX_RULE_COUNT = 1000;
export const MAX_RULE_WINDOW_SECONDS = 30 * 24 * 3600;

const ruleShape = z
  .object({
    action: z.enum(XID_ACTIONS),
    /** Act on the count-th occurrence on one node within windowSeconds; 1 (the default): on every one. */
    count: z.number().int().min(1).max(MAX_RULE_COUNT).default(1),
    windowSeconds: z.number().int().min(1).max(MAX_RULE_WINDOW_SECONDS).optional(),
  })
  .strict()
  .refine((rule) => rule.count === 1 || rule.windowSeconds !== undefined, {
    message: 'windowSeconds is required when count is more than 1',
    path: ['windowSeconds'],
  });

export const xidRuleSchema = ruleShape;

/** An SXid names an NVSwitch, not a GPU: there is no GPU to reset. */
export const sxidRuleSchema = ruleShape.refine((rule) => rule.action !== 'reset', {
  message: 'reset is not an SXid action: an SXid names an NVSwitch, not a GPU (use drain, reboot or hand_off)',
  path: ['action'],
});

export type XidRule = z.output<typeof xidRuleSchema>;

/** A table keyed by code: keys are whole numbers written in decimal, as YAML and JSON keys are strings. */
function codeTable<T extends z.ZodType>(noun: string, max: number, rule: T) {
  const keyRule = `must be a whole-number ${noun} code from 0 to ${max}`;
  const key = z
    .string()
    .regex(/^(0|[1-9]\d{0,5})$/, keyRule)
    .refine((text) => Number(text) <= max, keyRule);
  return z.record(key, rule, { error: (issue) => (issue.code === 'invalid_key' ? keyRule : undefined) });
}

/**
 * One layer's table: the configuration's `xidPolicy`, and the same shape in a node group's
 * profile. Codes it does not name fall through to the layer below.
 */
export const xidPolicyLayerSchema = z
  .object({
    xid: codeTable('Xid', MAX_XID_CODE, xidRuleSchema).default({}),
    sxid: codeTable('SXid', MAX_SXID_CODE, sxidRuleSchema).default({}),
  })
  .strict();

export type XidPolicyLayer = z.output<typeof xidPolicyLayerSchema>;

/** A layer with the name its rows carry: 'configuration', 'profile <name>'. */
export interface PolicyLayer {
  readonly source: string;
  readonly policy: XidPolicyLayer;
}

export const CATALOGUE_SOURCE = 'catalogue';
export const CONFIGURATION_SOURCE = 'configuration';

/** The layers of a configuration with no profiles: its own `xidPolicy` over the catalogue. */
export function configurationLayers(policy: XidPolicyLayer): PolicyLayer[] {
  return [{ source: CONFIGURATION_SOURCE, policy }];
}

/** What the catalogue does about a code whose class its code decides; "by message" where the message decides. */
export type EffectiveAction = XidAction | 'by message';

export interface EffectiveRow {
  readonly kind: XidKind;
  readonly code: number;
  readonly meaning: string;
  readonly action: EffectiveAction;
  readonly count: number;
  readonly windowSeconds?: number;
  /** The layer that decided this row: 'catalogue', 'configuration', 'profile <name>'. */
  readonly source: string;
}

/** The catalogue's verdict as a policy action: its remedy where it is fatal, else only observed. */
export function catalogueAction(xidClass: XidClass): XidAction {
  if (xidClass.severity !== 'fatal') return 'observe';
  if (xidClass.remedy === 'reset_gpu') return 'reset';
  if (xidClass.remedy === 'reboot_node') return 'reboot';
  return 'drain';
}

/** What an SXid is when no layer names it: the kernel line says Fatal (drained) or Non-fatal (observed). */
export const SXID_CATALOGUE_MEANING = 'NVSwitch error, fatal or non-fatal as the kernel line says';

/** The layer that names `code`, the last one winning, with its rule; undefined when only the catalogue speaks. */
export function configuredRule(layers: readonly PolicyLayer[], kind: XidKind, code: number): { readonly rule: XidRule; readonly source: string } | undefined {
  for (let index = layers.length - 1; index >= 0; index -= 1) {
    const layer = layers[index];
    const rule = layer?.policy[kind][String(code)];
    if (layer !== undefined && rule !== undefined) return { rule, source: layer.source };
  }
  return undefined;
}

function catalogueRow(kind: XidKind, code: number): EffectiveRow {
  if (kind === 'sxid') return { kind, code, meaning: SXID_CATALOGUE_MEANING, action: 'by message', count: 1, source: CATALOGUE_SOURCE };
  const entry = catalogueXids().find((candidate) => candidate.code === code);
  const meaning = entry?.xidClass.meaning ?? 'Xid not in the catalogue';
  const action: EffectiveAction = xidDecidedByMessage(code) ? 'by message' : entry === undefined ? 'observe' : catalogueAction(entry.xidClass);
  return { kind, code, meaning, action, count: 1, source: CATALOGUE_SOURCE };
}

/** The row that decides `code`: the last layer naming it, else the catalogue. */
export function effectiveRule(layers: readonly PolicyLayer[], kind: XidKind, code: number): EffectiveRow {
  const base = catalogueRow(kind, code);
  const configured = configuredRule(layers, kind, code);
  if (configured === undefined) return base;
  const { rule, source } = configured;
  return { ...base, action: rule.action, count: rule.count, ...(rule.windowSeconds === undefined ? {} : { windowSeconds: rule.windowSeconds }), source };
}

function configuredCodes(layers: readonly PolicyLayer[], kind: XidKind): number[] {
  return layers.flatMap((layer) => Object.keys(layer.policy[kind]).map(Number));
}

/**
 * Every catalogued Xid and every code a layer names, each with the row that decides it, ascending
 * by code. SXids have no catalogue by code: their table lists the codes a layer names.
 */
export function effectiveTable(layers: readonly PolicyLayer[]): { readonly xid: EffectiveRow[]; readonly sxid: EffectiveRow[] } {
  const table = (kind: XidKind, catalogued: readonly number[]): EffectiveRow[] =>
    [...new Set([...catalogued, ...configuredCodes(layers, kind)])].sort((a, b) => a - b).map((code) => effectiveRule(layers, kind, code));
  return {
    xid: table(
      'xid',
      catalogueXids().map((entry) => entry.code),
    ),
    sxid: table('sxid', []),
  };
}

/** Whether a rule needs the controller to hear of every occurrence: it acts, or counts. */
function wantsReports(rule: XidRule): boolean {
  return (rule.action !== 'ignore' && rule.action !== 'observe') || rule.count > 1;
}

/**
 * The codes the controller wants on the agent's fast path beyond what the agent sends anyway (the
 * Xids the catalogue calls fatal by their code): every code a layer names that acts or counts.
 * Nothing here is secret: it is the configuration's view of which codes matter.
 */
export function fastPathCodes(layers: readonly PolicyLayer[]): { readonly xid: number[]; readonly sxid: number[] } {
  const fatalByCode = new Set(
    catalogueXids()
      .filter((entry) => entry.xidClass.severity === 'fatal' && !xidDecidedByMessage(entry.code))
      .map((entry) => entry.code),
  );
  const wanted = (kind: XidKind): number[] =>
    [...new Set(configuredCodes(layers, kind))]
      .filter((code) => {
        const configured = configuredRule(layers, kind, code);
        return configured !== undefined && wantsReports(configured.rule) && !(kind === 'xid' && fatalByCode.has(code));
      })
      .sort((a, b) => a - b);
  return { xid: wanted('xid'), sxid: wanted('sxid') };
}

/**
 * fastPathCodes over several stacks of layers (the configuration's alone, and the configuration's
 * with each profile's over it): every code some group of nodes acts on or counts.
 */
export function fastPathCodesOf(stacks: readonly (readonly PolicyLayer[])[]): { readonly xid: number[]; readonly sxid: number[] } {
  const each = stacks.map((layers) => fastPathCodes(layers));
  const union = (kind: XidKind): number[] => [...new Set(each.flatMap((codes) => codes[kind]))].sort((a, b) => a - b);
  return { xid: union('xid'), sxid: union('sxid') };
}

/** GET /api/v1/xid-policy's answer (version 1), read by agents at start and every few minutes. */
export const xidPolicyAnswerSchema = z.object({
  version: z.literal(1),
  fastPath: z.object({
    xid: z.array(z.number().int().min(0).max(MAX_XID_CODE)).max(10_000),
    sxid: z.array(z.number().int().min(0).max(MAX_SXID_CODE)).max(10_000),
  }),
});

export type XidPolicyAnswer = z.infer<typeof xidPolicyAnswerSchema>;
