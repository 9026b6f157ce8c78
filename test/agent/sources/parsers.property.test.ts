import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { parseDcgmExporterText } from '../../../agent/sources/dcgm-exporter.js';
import { parseCounter, parsePortState, parseRate } from '../../../agent/sources/infiniband.js';
import { KernelLogParser, parseKernelLog } from '../../../agent/sources/kernel-log.js';
import { parseIterationLine } from '../../../agent/sources/megatron-log.js';
import { TrainingErrorParser } from '../../../agent/sources/training-log-failures.js';
import { parseMountstats } from '../../../agent/sources/mountstats.js';
import { readNvidiaSmiXml } from '../../../agent/sources/nvidia-smi-xml.js';
import { parseRankEnvironment, parseResidentBytes, parseStatLine } from '../../../agent/sources/proc-tree.js';

/**
 * Every source the agent parses can hold garbage: a truncated file, a driver bug, a binary
 * blob. No parser may throw or hang on any byte sequence; each returns nothing or an error value.
 */
const PARSERS: Record<string, (text: string) => unknown> = {
  'kernel log (Xid lines)': (text) => parseKernelLog(text),
  'kernel log, line by line': (text) => {
    const parser = new KernelLogParser();
    return text.split('\n').flatMap((line) => parser.push(line));
  },
  'nvidia-smi -q -x': (text) => readNvidiaSmiXml(text),
  'dcgm-exporter text': (text) => parseDcgmExporterText(text),
  mountstats: (text) => parseMountstats(text),
  'Megatron iteration line': (text) => text.split('\n').map((line) => parseIterationLine(line)),
  'training error reports': (text) => {
    const parser = new TrainingErrorParser();
    return text.split('\n').flatMap((line) => parser.push(line));
  },
  'InfiniBand attributes': (text) => [parseCounter(text), parsePortState(text), parseRate(text)],
  '/proc/<pid>/stat, status, environ': (text) => [parseStatLine(text), parseResidentBytes(text), parseRankEnvironment(text)],
};

/** Arbitrary bytes, read the two ways a file reaches a parser. */
const anyBytes = fc
  .uint8Array({ maxLength: 4096 })
  .chain((bytes) => fc.constantFrom(Buffer.from(bytes).toString('utf8'), Buffer.from(bytes).toString('latin1')));

/** Text made of the tokens the parsers look for, so the search reaches their inner branches. */
const tokens = fc.constantFrom(
  'NVRM: Xid (PCI:0000:3b:00): ',
  '79, ',
  "pid='<unknown>', ",
  'device ',
  ' mounted on ',
  ' with fstype nfs4 statvers=1.1',
  '\txprt:\ttcp ',
  '\tper-op statistics',
  ' READ: ',
  'iteration ',
  '/ ',
  ' | elapsed time per iteration (ms): ',
  'lm loss: ',
  'nan',
  'Watchdog caught collective operation timeout',
  'ChildFailedError',
  '<gpu id="',
  '</gpu>',
  '<nvidia_smi_log>',
  'DCGM_FI_DEV_GPU_TEMP{gpu="0"',
  '} ',
  '# TYPE ',
  '4: ACTIVE',
  '400 Gb/sec',
  '(',
  ')',
  ' ',
  '\n',
  '\t',
  '1',
  '18446744073709551615',
  '-',
);
const tokenText = fc.array(tokens, { maxLength: 200 }).map((parts) => parts.join(''));

describe('every parser on arbitrary input', () => {
  it.each(Object.entries(PARSERS))('the %s parser never throws on arbitrary bytes', (_name, parse) => {
    fc.assert(
      fc.property(anyBytes, (text) => {
        expect(() => parse(text)).not.toThrow();
      }),
      { numRuns: 300 },
    );
  });

  it.each(Object.entries(PARSERS))('the %s parser never throws on text built from its own tokens', (_name, parse) => {
    fc.assert(
      fc.property(tokenText, (text) => {
        expect(() => parse(text)).not.toThrow();
      }),
      { numRuns: 300 },
    );
  });

  it.each(Object.entries(PARSERS))('the %s parser finishes a 1 MiB line quickly enough to serve a scrape', (_name, parse) => {
    const started = Date.now();
    parse(`${'NVRM: Xid (PCI:0000:3b:00): 79, '.repeat(16)}${'x'.repeat(1024 * 1024)}`);
    // Not a speed target: a guard against catastrophic backtracking, which takes minutes.
    expect(Date.now() - started).toBeLessThan(5000);
  });
});
