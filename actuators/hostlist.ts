import { DoNotRetryError } from '../core/errors.js';

/**
 * Expands a Slurm hostlist (`gpu-[01-03,07],login1`) into node names, as `scontrol show
 * hostnames` does, for answers that come over slurmrestd and for the standby reservation's list
 * (one command fewer on the way from a fault to the relaunch). Ranges
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
    if (depth < 0) throw new DoNotRetryError(`hostlist ${JSON.stringify(list.slice(0, 80))} has an unmatched "]"`);
    if (char === ',' && depth === 0) {
      items.push(current.trim());
      current = '';
    } else {
      current += char;
    }
  }
  if (depth !== 0) throw new DoNotRetryError(`hostlist ${JSON.stringify(list.slice(0, 80))} has an unmatched "["`);
  items.push(current.trim());
  return items;
}

/** Expands one item's bracket groups left to right; the first group varies slowest, as Slurm prints them. */
function expandItem(item: string): string[] {
  let names = [''];
  let rest = item;
  while (rest !== '') {
    const open = rest.indexOf('[');
    if (open === -1) {
      const tail = rest;
      names = names.map((name) => `${name}${tail}`);
      break;
    }
    const close = rest.indexOf(']', open);
    if (close === -1) throw new DoNotRetryError(`hostlist item ${JSON.stringify(item.slice(0, 80))} has an unmatched "["`);
    const prefix = rest.slice(0, open);
    const values = expandGroup(rest.slice(open + 1, close), item);
    // Groups multiply: check the product before building it (n[0-99999][0-99999] is 10^10 names).
    if (names.length * values.length > MAX_NAMES)
      throw new DoNotRetryError(`hostlist item ${JSON.stringify(item.slice(0, 80))} expands to more than ${MAX_NAMES} names`);
    const next: string[] = [];
    for (const name of names) {
      for (const value of values) next.push(`${name}${prefix}${value}`);
    }
    names = next;
    rest = rest.slice(close + 1);
  }
  return names;
}

/** The values of one bracket group (`01-03,07`), at most MAX_NAMES of them. */
function expandGroup(group: string, item: string): string[] {
  const values: string[] = [];
  for (const part of group.split(',')) {
    const range = part.trim();
    const match = /^(\d+)(?:-(\d+))?$/.exec(range);
    if (!match) throw new DoNotRetryError(`hostlist item ${JSON.stringify(item.slice(0, 80))} has a bad range ${JSON.stringify(range.slice(0, 80))}`);
    const [, low = '', high = low] = match;
    const [from, to] = [Number(low), Number(high)];
    // Past 2^53 `value += 1` stops changing the number, and the loop below would never end.
    if (!Number.isSafeInteger(from) || !Number.isSafeInteger(to))
      throw new DoNotRetryError(`hostlist item ${JSON.stringify(item.slice(0, 80))} has a number too large in ${JSON.stringify(range.slice(0, 80))}`);
    if (to < from) throw new DoNotRetryError(`hostlist item ${JSON.stringify(item.slice(0, 80))} has a descending range ${range.slice(0, 80)}`);
    if (values.length + (to - from + 1) > MAX_NAMES)
      throw new DoNotRetryError(`hostlist item ${JSON.stringify(item.slice(0, 80))} has ranges wider than ${MAX_NAMES}`);
    for (let value = from; value <= to; value += 1) values.push(String(value).padStart(low.length, '0'));
  }
  return values;
}
