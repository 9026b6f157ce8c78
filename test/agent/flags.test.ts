import { describe, expect, it } from 'vitest';
import { InputError } from '../../core/errors.js';
import { readFlag, readFlagList } from '../../agent/flags.js';

describe('readFlag: one rule for every collector flag', () => {
  it('gives the default when the flag is absent, and the value when given once (or as a list of one)', () => {
    expect(readFlag({}, 'x.path', 'path', '/default')).toBe('/default');
    expect(readFlag({}, 'x.path', 'path')).toBeUndefined();
    expect(readFlag({ 'x.path': '/given' }, 'x.path', 'path', '/default')).toBe('/given');
    expect(readFlag({ 'x.name': ['only'] }, 'x.name', 'string')).toBe('only');
  });

  it('refuses a flag given more than once, and an empty (or, for a path, blank) value, naming the flag', () => {
    expect(() => readFlag({ 'x.name': ['a', 'b'] }, 'x.name', 'string')).toThrow('--x.name: give it once');
    expect(() => readFlag({ 'x.name': '' }, 'x.name', 'string', 'd')).toThrow('--x.name: must not be empty');
    expect(() => readFlag({ 'x.path': '  ' }, 'x.path', 'path')).toThrow('--x.path: must not be empty');
    expect(() => readFlag({ 'x.path': 'a\0b' }, 'x.path', 'path')).toThrow(InputError);
  });

  it('reads numbers in their range and booleans, refusing anything else with the rule', () => {
    const seconds = { type: 'number', whole: true, unit: 'seconds', min: 1, max: 600 } as const;
    expect(readFlag({ 't.s': '120' }, 't.s', seconds, 5)).toBe(120);
    expect(readFlag({}, 't.s', seconds, 5)).toBe(5);
    for (const bad of ['0', '601', '1.5', 'ten', '0x10']) {
      expect(() => readFlag({ 't.s': bad }, 't.s', seconds, 5)).toThrow(`--t.s: must be a whole number of seconds from 1 to 600, got "${bad}"`);
    }
    expect(readFlag({ 'n.x': '-2.5' }, 'n.x', 'number')).toBe(-2.5);
    expect(() => readFlag({ 'n.x': 'NaN' }, 'n.x', 'number')).toThrow('--n.x: must be a number');
    expect(readFlag({ 'b.x': 'false' }, 'b.x', 'boolean', true)).toBe(false);
    expect(() => readFlag({ 'b.x': 'yes' }, 'b.x', 'boolean')).toThrow('--b.x: must be true or false, got "yes"');
  });

  it('reads every value of a repeatable flag, none when absent', () => {
    expect(readFlagList({}, 'r.x')).toEqual([]);
    expect(readFlagList({ 'r.x': 'one' }, 'r.x')).toEqual(['one']);
    expect(readFlagList({ 'r.x': ['one', 'two'] }, 'r.x')).toEqual(['one', 'two']);
  });
});
