import { existsSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { z } from 'zod';
import { InputError, errorMessage } from '../../core/errors.js';
import { labOptionsSchema } from './layout.js';

/**
 * The lab's state file (`<dir>/lab.json`): what `up` made, written as it goes, so that `down`
 * and `status` find it later, and so that `down` can also undo an `up` that died half-way.
 */

const processSchema = z.object({
  pid: z.number().int().positive(),
  /** What the process must still be running for `down` to signal it: a pid may have been reused. */
  marker: z.string().min(1),
});

export const labStateSchema = z.object({
  version: z.literal(1),
  /** `starting` until `up` finished; a lab left `starting` was interrupted. */
  phase: z.enum(['starting', 'up']),
  options: labOptionsSchema,
  dir: z.string().min(1),
  conf: z.string().min(1),
  controllerHost: z.string().min(1),
  controllerPort: z.number().int().min(1).max(65535),
  createdAt: z.string(),
  slurmctld: processSchema.optional(),
  slurmd: z.record(z.string(), processSchema).default({}),
});

export type LabState = z.output<typeof labStateSchema>;
export type LabProcessRecord = z.output<typeof processSchema>;

export function readLabState(file: string): LabState | undefined {
  if (!existsSync(file)) return undefined;
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(file, 'utf8'));
  } catch (error) {
    throw new InputError(`${file} is not JSON: ${errorMessage(error)}`);
  }
  const parsed = labStateSchema.safeParse(raw);
  if (!parsed.success) throw new InputError(`${file} is not a lab state file: ${parsed.error.issues.map((issue) => issue.message).join('; ')}`);
  return parsed.data;
}

/** Write then rename, so a reader never sees half a file even if `up` is killed mid-write. */
export function writeLabState(file: string, state: LabState): void {
  const temporary = `${file}.tmp`;
  writeFileSync(temporary, `${JSON.stringify(state, null, 2)}\n`);
  renameSync(temporary, file);
}

export function removeLabState(file: string): void {
  rmSync(file, { force: true });
  rmSync(`${file}.tmp`, { force: true });
}
