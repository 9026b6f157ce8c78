import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { parseDcgmExporterText } from '../../../agent/sources/dcgm-exporter.js';
import { parseExpositionText } from '../../../agent/sources/exposition-text.js';

describe('Prometheus text parser', () => {
  it('reads names, labels with every escape, values of every spelling and optional timestamps', () => {
    const text = [
      '# HELP up Whether it is up.',
      '# TYPE up gauge',
      'up 1',
      'a{x="quote \\" backslash \\\\ newline \\n end",y="",} -1.5e3 1700000000000',
      'b{ x = "1" , y="2" } +Inf',
      'c NaN',
      'd{} 0.000131\r',
      '',
      '# just a comment',
    ].join('\n');
    const parsed = parseExpositionText(text);
    expect(parsed.errors).toEqual([]);
    expect(parsed.types.get('up')).toBe('gauge');
    expect(parsed.samples).toEqual([
      { name: 'up', labels: {}, value: 1, timestampMs: undefined },
      { name: 'a', labels: { x: 'quote " backslash \\ newline \n end', y: '' }, value: -1500, timestampMs: 1700000000000 },
      { name: 'b', labels: { x: '1', y: '2' }, value: Number.POSITIVE_INFINITY, timestampMs: undefined },
      { name: 'c', labels: {}, value: Number.NaN, timestampMs: undefined },
      { name: 'd', labels: {}, value: 0.000131, timestampMs: undefined },
    ]);
  });

  it('skips each malformed line with its line number and keeps the good lines around it', () => {
    const parsed = parseExpositionText(
      ['good 1', 'bad{x="unterminated} 1', 'bad{x="1"}1', 'bad{x="1",x="2"} 1', 'bad 1 2 3', 'bad one', 'bad{x="\\q"} 1', '9bad 1', 'also_good{a="b"} 2'].join(
        '\n',
      ),
    );
    expect(parsed.samples.map((line) => line.name)).toEqual(['good', 'also_good']);
    expect(parsed.errors.map((error) => error.line)).toEqual([2, 3, 4, 5, 6, 7, 8]);
    expect(parsed.errorCount).toBe(7);
  });

  it('keeps only the first twenty errors of a body that is all garbage, but counts them all', () => {
    const parsed = parseExpositionText('<html>\n'.repeat(1000));
    expect(parsed.errors).toHaveLength(20);
    expect(parsed.errorCount).toBe(1000);
    expect(parsed.samples).toEqual([]);
  });

  it('never throws and always terminates, whatever the input', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 400 }), (input) => {
        const parsed = parseExpositionText(input);
        expect(parsed.samples.length + parsed.errorCount).toBeLessThanOrEqual(input.split('\n').length);
        parseDcgmExporterText(input);
      }),
      { numRuns: 200 },
    );
  });

  it('never throws on exposition-shaped lines built from the tokens the format uses', () => {
    const token = fc.constantFrom(
      'DCGM_FI_DEV_GPU_TEMP',
      'gpu',
      'pci_bus_id',
      '{',
      '}',
      '=',
      '"',
      '\\',
      ',',
      ' ',
      '\t',
      '0',
      '1e9',
      'NaN',
      '-Inf',
      '#',
      'TYPE',
      '\n',
      '0000:3b:00.0',
    );
    fc.assert(
      fc.property(fc.array(fc.oneof(token, fc.string({ maxLength: 4 })), { maxLength: 80 }), (tokens) => {
        const report = parseDcgmExporterText(tokens.join(''));
        expect(Array.isArray(report.gpus)).toBe(true);
      }),
      { numRuns: 300 },
    );
  });
});
