import { z } from 'zod';

/**
 * A cluster node name as Slurm and Kubernetes accept it. Anything that reaches a command line
 * or an API passes through this check first, so a name can never smuggle in an option or a
 * second argument.
 */
export const NODE_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

export const nodeNameSchema = z
  .string()
  .regex(NODE_NAME_PATTERN, 'must be 1-63 characters of letters, digits, ".", "_" or "-", starting with a letter or digit');

/**
 * A list of node names in which each node appears once: the first name listed twice is the
 * issue, at its index (a node listed twice would be launched, counted and drained twice).
 */
export function distinctNodeNames(max: number, min = 1) {
  return z
    .array(nodeNameSchema)
    .min(min)
    .max(max)
    .superRefine((nodes, ctx) => {
      const duplicate = firstDuplicate(nodes);
      if (duplicate !== undefined)
        ctx.addIssue({ code: 'custom', path: [duplicate.index], message: `${duplicate.name} is listed twice (first at index ${duplicate.first})` });
    });
}

/** The first name that appears a second time, where, and where it appeared first. */
export function firstDuplicate(names: readonly string[]): { name: string; index: number; first: number } | undefined {
  const seen = new Map<string, number>();
  for (const [index, name] of names.entries()) {
    const first = seen.get(name);
    if (first !== undefined) return { name, index, first };
    seen.set(name, index);
  }
  return undefined;
}

/**
 * A training job as the agents name it on training series and fast-path events: whatever the
 * launcher called it, so wider than the name of a job registered with the controller
 * (core/job.ts, JOB_NAME_PATTERN). The agent checks its inputs against these, so it never sends
 * the controller an event the controller would refuse.
 */
export const TRAINING_JOB_PATTERN = /^[A-Za-z0-9._-]{1,128}$/;
export const TRAINING_JOB_RULE = '1-128 letters, digits, ".", "_" or "-"';
/** The highest global rank a training series or event may carry. */
export const MAX_TRAINING_RANK = 10_000_000;

// PCI bus ids live in core/pci.ts (no zod: the agent's NVML thread reads them); re-exported here.
export { PCI_BUS_ID_PATTERN, normalizePciBusId } from './pci.js';
