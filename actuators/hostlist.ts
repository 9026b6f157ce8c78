import { DoNotRetryError } from '../core/errors.js';

/**
 * Expands a Slurm hostlist (`gpu-[01-03,07],login1`) into node names, as `scontrol show
 * hostnames` does, for answers that come over slurmrestd where no scontrol is at hand. Ranges
 * keep their zero padding; several bracket groups in one name multiply out.
 */

/** Refuses lists that would expand into more names than any cluster has. */
const MAX_NAMES = 100_000;

export function expandHostlist(list: string): string[] {
  const names: string[] = [];
  for (const item of splitTopLevel(list)) {
    if (item === '' || item === '(null)') continue;
    for (const name of expandItem(item)) {
      names.push(name);
      if (names.length > MAX_NAMES) throw new DoNotRetryError(`hostlist ${JSON.stringify(list.slice(0, 80))} expands to more than ${MAX_NAMES} names`);
    }
  }
  return names;
}

/** Splits on commas outside brackets. */
function splitTopLevel(list: string): string[] {
  const items: string[] = [];
  let depth = 0;
  let current = '';
  for (const char of list.trim()) {
    if (char === '[') depth += 1;
    if (char === ']') depth -= 1;
    if (depth < 0) throw new DoNotRetryError(`hostlist ${JSON.stringify(list)} has an unmatched "]"`);
    if (char === ',' && depth === 0) {
      items.push(current.trim());
      current = '';
    } else {
      current += char;
    }
  }
  if (depth !== 0) throw new DoNotRetryError(`hostlist ${JSON.stringify(list)} has an unmatched "["`);
  items.push(current.trim());
  return items;
}

function expandItem(item: string): string[] {
  const open = item.indexOf('[');
  if (open === -1) return [item];
  const close = item.indexOf(']', open);
  const prefix = item.slice(0, open);
  const rests = expandItem(item.slice(close + 1));
  const out: string[] = [];
  for (const part of item.slice(open + 1, close).split(',')) {
    for (const value of expandRange(part.trim(), item)) {
      for (const rest of rests) out.push(`${prefix}${value}${rest}`);
    }
  }
  return out;
}

function expandRange(range: string, item: string): string[] {
  const match = /^(\d+)(?:-(\d+))?$/.exec(range);
  if (!match) throw new DoNotRetryError(`hostlist item ${JSON.stringify(item)} has a bad range ${JSON.stringify(range)}`);
  const [, low = '', high = low] = match;
  const [from, to] = [Number(low), Number(high)];
  if (to < from) throw new DoNotRetryError(`hostlist item ${JSON.stringify(item)} has a descending range ${range}`);
  if (to - from > MAX_NAMES) throw new DoNotRetryError(`hostlist item ${JSON.stringify(item)} has a range wider than ${MAX_NAMES}`);
  const width = low.length;
  const values: string[] = [];
  for (let value = from; value <= to; value += 1) values.push(String(value).padStart(width, '0'));
  return values;
}
