import { InputError } from '../core/errors.js';

/**
 * The collectors' own command-line settings, node_exporter style (`--<collector>.<setting>`), and
 * the one reader every collector takes them through. Apart from collector.ts so that what reads
 * them (gpu-source.ts, the CLI) does not import the collector framework, nor it them.
 *
 * One rule for every flag, whatever its type:
 * - absent: the reader's default (the CLI has already put the flag's own default, as --help shows
 *   it, in the settings; a collector built in code with no settings gets the reader's);
 * - given more than once where one value is expected (settings built in code: the CLI keeps the
 *   last): `--<flag>: give it once`;
 * - empty (or blank, for a path): `--<flag>: must not be empty`, as the agent's own path flags;
 * - otherwise read as its type, an InputError naming the flag when it is not one.
 */

/** A setting a collector takes from the command line, node_exporter style: `--<collector>.<setting>`. */
export interface CollectorFlag {
  /** Flag name without the dashes, starting with the collector's name: `training.log`. */
  readonly name: string;
  /** Placeholder shown in --help: `<file>`, `<url>`. */
  readonly value: string;
  readonly description: string;
  readonly default?: string | undefined;
  /** May be given more than once; the collector then receives every value, in order. */
  readonly repeatable?: boolean | undefined;
}

/** A collector's flag values, keyed by flag name (`training.log`). */
export type CollectorSettings = Readonly<Record<string, string | readonly string[] | undefined>>;

export type FlagType = 'string' | 'path' | 'number' | 'boolean';
type FlagValue<T extends FlagType> = T extends 'number' ? number : T extends 'boolean' ? boolean : string;

/** A number flag's range; out of it (or not a number) the error says `must be <rule>`. */
export interface NumberFlag {
  readonly type: 'number';
  readonly min: number;
  readonly max: number;
  /** Whole numbers only. */
  readonly whole?: boolean;
  /** What the number counts, for the message: `seconds`. */
  readonly unit?: string;
}

/** How a flag is read: its type, or a number's range. */
type FlagRead<T extends FlagType> = T | (NumberFlag & { type: T });

const DECIMAL = /^[+-]?(?:\d+(?:\.\d*)?|\.\d+)$/;

function numberRule(read: NumberFlag): string {
  return `a ${read.whole ? 'whole ' : ''}number${read.unit ? ` of ${read.unit}` : ''} from ${read.min} to ${read.max}`;
}

function single(settings: CollectorSettings, name: string): string | undefined {
  const value = settings[name];
  if (value === undefined || typeof value === 'string') return value;
  if (value.length > 1) throw new InputError(`--${name}: give it once`, `--${name}`);
  return value[0];
}

function typed(name: string, raw: string, read: FlagType | NumberFlag): string | number | boolean {
  const flag = `--${name}`;
  const type = typeof read === 'string' ? read : read.type;
  if (raw === '' || (type === 'path' && raw.trim() === '')) throw new InputError(`${flag}: must not be empty`, flag);
  switch (type) {
    case 'string':
      return raw;
    case 'path':
      if (raw.includes('\0')) throw new InputError(`${flag}: must be a path, got one with a NUL byte`, flag);
      return raw;
    case 'boolean':
      if (raw !== 'true' && raw !== 'false') throw new InputError(`${flag}: must be true or false, got "${raw}"`, flag);
      return raw === 'true';
    case 'number': {
      const value = DECIMAL.test(raw.trim()) ? Number(raw) : Number.NaN;
      if (typeof read === 'string') {
        if (!Number.isFinite(value)) throw new InputError(`${flag}: must be a number, got "${raw}"`, flag);
        return value;
      }
      if (!Number.isFinite(value) || (read.whole && !Number.isInteger(value)) || value < read.min || value > read.max) {
        throw new InputError(`${flag}: must be ${numberRule(read)}, got "${raw}"`, flag);
      }
      return value;
    }
  }
}

/**
 * A collector's setting by its flag, read as its type (see the rule above): `fallback` when the
 * flag is absent. Throws an InputError naming the flag.
 */
export function readFlag<T extends FlagType>(settings: CollectorSettings, name: string, read: FlagRead<T>): FlagValue<T> | undefined;
export function readFlag<T extends FlagType>(settings: CollectorSettings, name: string, read: FlagRead<T>, fallback: FlagValue<T>): FlagValue<T>;
export function readFlag(
  settings: CollectorSettings,
  name: string,
  read: FlagType | NumberFlag,
  fallback?: FlagValue<FlagType>,
): FlagValue<FlagType> | undefined {
  const raw = single(settings, name);
  return raw === undefined ? fallback : typed(name, raw, read);
}

/** Every value of a repeatable flag, in the order given (none when absent). */
export function readFlagList(settings: CollectorSettings, name: string): readonly string[] {
  const value = settings[name];
  return value === undefined ? [] : typeof value === 'string' ? [value] : value;
}
