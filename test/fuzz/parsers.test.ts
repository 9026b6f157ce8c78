import { cpSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import fc from 'fast-check';
import { afterAll, describe, expect, it } from 'vitest';
import { selectTrainingThread, normaliseFrame, parsePySpyDump } from '../../analyzers/stacks/pyspy.js';
import { parseStackDump } from '../../analyzers/stacks/faulthandler.js';
import { analyzeFlightRecorder, splitRankKeyedDumps } from '../../analyzers/flight-recorder-analysis.js';
import { expandHostlist } from '../../actuators/hostlist.js';
import { parseIterationCsv } from '../../cli/detect.js';
import { DoNotRetryError, InputError } from '../../core/errors.js';
import { parseJobSpec } from '../../core/job.js';
import { MAX_RANKS, Topology } from '../../core/topology.js';
import { parseDcgmExporterText } from '../../agent/sources/dcgm-exporter.js';
import { parseCounter, parsePortState, parseRate, readInfinibandClass } from '../../agent/sources/infiniband.js';
import { KernelLogParser, parseKernelLog } from '../../agent/sources/kernel-log.js';
import { parseIterationLine } from '../../agent/sources/megatron-log.js';
import { TrainingErrorParser } from '../../agent/sources/training-log-failures.js';
import { parseMountstats } from '../../agent/sources/mountstats.js';
import { parseNvidiaSmiXml, readNvidiaSmiXml } from '../../agent/sources/nvidia-smi-xml.js';
import { classifyTrainingTree, parseRankEnvironment, parseResidentBytes, parseStatLine, type ProcessEntry } from '../../agent/sources/proc-tree.js';
import { REALWORLD } from '../agent/helpers.js';
import { hostileString } from '../support/hostile.js';
import { FuzzReport, budget, fuzz } from './harness.js';
import { mutationsOf } from './inputs.js';

/**
 * Fuzzes every parser with real samples mutated (cut, repeated, spliced with the tokens the
 * parser looks for and with hostile text) and with inputs built from each format's grammar.
 * A parser documented never to throw must not throw; the others may throw only their own
 * error class (InputError, or DoNotRetryError for Slurm hostlists). Each input must also be
 * handled quickly: a parser that backtracks or loops would stall a scrape or a worker.
 */

const REPORT = new FuzzReport('parsers');
/** Far above any honest input here, far below a hang. */
const SLOW_MS = 2000;

afterAll(() => REPORT.print());

function samples(dir: string, pattern: RegExp = /./): string[] {
  const root = join(REALWORLD, dir);
  return readdirSync(root)
    .filter((name) => pattern.test(name) && name !== 'README.md' && statSync(join(root, name)).isFile())
    .map((name) => readFileSync(join(root, name), 'utf8'));
}

type Edit = { at: number; span: number; kind: 'delete' | 'duplicate' | 'insert' | 'replace' | 'truncate'; token: string };

function applyEdit(text: string, edit: Edit): string {
  const at = Math.floor(edit.at * text.length);
  switch (edit.kind) {
    case 'delete':
      return text.slice(0, at) + text.slice(at + edit.span);
    case 'duplicate':
      return text.slice(0, at + edit.span) + text.slice(at, at + edit.span) + text.slice(at + edit.span);
    case 'insert':
      return text.slice(0, at) + edit.token + text.slice(at);
    case 'replace':
      return text.slice(0, at) + edit.token + text.slice(at + edit.span);
    case 'truncate':
      return text.slice(0, at);
  }
}

/** A real sample with one to four edits: cuts, repeats, and the format's own tokens or hostile text spliced in. */
function mutatedText(texts: readonly string[], tokens: readonly string[]): fc.Arbitrary<string> {
  const edit = fc.record({
    at: fc.double({ min: 0, max: 1, noNaN: true, maxExcluded: true }),
    span: fc.integer({ min: 0, max: 400 }),
    kind: fc.constantFrom<Edit['kind']>('delete', 'duplicate', 'insert', 'insert', 'replace', 'replace', 'truncate'),
    token: fc.oneof(
      { weight: 4, arbitrary: fc.constantFrom(...tokens) },
      { weight: 1, arbitrary: hostileString.map((text) => text.slice(0, 2000)) },
      { weight: 1, arbitrary: fc.string({ maxLength: 20 }) },
    ),
  });
  return fc
    .record({ text: fc.constantFrom(...texts), edits: fc.array(edit, { minLength: 1, maxLength: 4 }) })
    .map(({ text, edits }) => edits.reduce(applyEdit, text));
}

/** Arbitrary bytes, decoded the two ways a file reaches a parser. */
const anyBytes = fc
  .uint8Array({ maxLength: 2048 })
  .chain((bytes) => fc.constantFrom(Buffer.from(bytes).toString('utf8'), Buffer.from(bytes).toString('latin1')));

/** Mutated samples mostly, arbitrary bytes sometimes, and one line long enough to expose backtracking. */
function textInputs(texts: readonly string[], tokens: readonly string[]): fc.Arbitrary<string> {
  return fc.oneof(
    { weight: 8, arbitrary: mutatedText(texts, tokens) },
    { weight: 2, arbitrary: anyBytes },
    { weight: 1, arbitrary: fc.constantFrom(...tokens).map((token) => token.repeat(20_000)) },
  );
}

/** Runs `parse`, timing it; returns the outcome label, rethrowing any error that is not `allowed`. */
function outcomeOf(parse: () => unknown, allowed?: abstract new (...args: never[]) => Error): string {
  const started = performance.now();
  let outcome = 'parsed';
  try {
    parse();
  } catch (error) {
    if (allowed === undefined || !(error instanceof allowed)) throw error;
    outcome = `refused (${allowed.name})`;
  }
  expect(performance.now() - started, 'one input took too long').toBeLessThan(SLOW_MS);
  return outcome;
}

describe('parsers under fuzzing', () => {
  it('nvidia-smi XML: readNvidiaSmiXml never throws and parseNvidiaSmiXml throws only InputError', async () => {
    const tokens = [
      '<gpu id="00000000:3B:00.0">',
      '</gpu>',
      '<nvidia_smi_log>',
      '</nvidia_smi_log>',
      '<fb_memory_usage>',
      '<total>80 MiB</total>',
      'N/A',
      '[N/A]',
      '<![CDATA[x]]>',
      '<!DOCTYPE x [<!ENTITY a "aaaaaaaaaa">]>',
      '&a;',
      '&#0;',
      '&#x110000;',
      '&lt;',
      '<?xml version="1.0"?>',
      '-1',
      '1e309',
      '18446744073709551615',
      '<temperature><gpu_temp>85 C</gpu_temp></temperature>',
      '<retired_pages>',
      '<ecc_errors><volatile>',
      '<minor_number>',
      '<attached_gpus>9999999</attached_gpus>',
      '<',
      '>',
      '/>',
    ];
    await fuzz(
      REPORT,
      'agent/sources/nvidia-smi-xml',
      textInputs(samples('nvidia-smi-xml', /\.xml$/), tokens),
      (text) => {
        const read = readNvidiaSmiXml(text);
        if (!read.ok) expect(read.error).toBeInstanceOf(InputError);
        return outcomeOf(() => parseNvidiaSmiXml(text), InputError);
      },
      budget(250, 4),
    );
  });

  it('dcgm-exporter text never throws', async () => {
    const tokens = [
      'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",pci_bus_id="00000000:3B:00.0"} ',
      '# TYPE x gauge\n',
      '# HELP ',
      '{',
      '}',
      '="',
      '\\"',
      '\\',
      ',',
      ' 1e999',
      ' NaN',
      ' -Inf',
      ' 1 9999999999999999999',
      'GPU_I_ID="1"',
      '\n',
    ];
    await fuzz(
      REPORT,
      'agent/sources/dcgm-exporter',
      textInputs(samples('dcgm-exporter', /\.prom$/), tokens),
      (text) => outcomeOf(() => parseDcgmExporterText(text)),
      budget(300, 2),
    );
  });

  it('kernel log (Xid) never throws, whole or line by line', async () => {
    const tokens = [
      'NVRM: Xid (PCI:0000:3b:00): ',
      '79, ',
      "pid='<unknown>', name=<unknown>, ",
      'GPU has fallen off the bus.',
      'NVRM: GPU at PCI:0000:3b:00: GPU-',
      '[12345.678901] ',
      '<3>',
      '6,1234,5678,-;',
      '\n',
      'Xid',
      '(PCI:',
      ':',
      'ffffffff',
    ];
    await fuzz(
      REPORT,
      'agent/sources/kernel-log',
      textInputs(samples('xid-kernel-logs'), tokens),
      (text) =>
        outcomeOf(() => {
          parseKernelLog(text);
          const parser = new KernelLogParser();
          for (const line of text.split('\n')) parser.push(line);
        }),
      budget(300, 2),
    );
  });

  it('InfiniBand attributes never throw, and a sysfs tree with garbage in its files still reads', async () => {
    const tokens = [
      '4: ACTIVE',
      '5: LinkUp',
      '400 Gb/sec (4X NDR)',
      '2.5 Gb/sec (1X SDR)',
      'N/A (no PMA)',
      '18446744073709551615',
      '-1',
      '1.5',
      '0x10',
      ':',
      ' Gb/sec',
      'Tb/sec',
      '\n',
      '\0',
    ];
    const attributes = [...tokens, ...samples(join('procfs-nfs-infiniband', 'sys-class-infiniband', 'procfs_fixtures', 'hfi1_0', 'ports', '1')).slice(0, 4)];
    await fuzz(
      REPORT,
      'agent/sources/infiniband attributes',
      textInputs(attributes, tokens),
      (text) => outcomeOf(() => [parseCounter(text), parsePortState(text), parseRate(text)]),
      budget(400, 1.5),
    );

    const dir = mkdtempSync(join(tmpdir(), 'steadfast-fuzz-ib-'));
    try {
      const source = join(REALWORLD, 'procfs-nfs-infiniband', 'sys-class-infiniband', 'procfs_fixtures');
      cpSync(source, dir, { recursive: true });
      const files = listFiles(dir);
      await fuzz(
        REPORT,
        'agent/sources/infiniband sysfs tree',
        fc.tuple(fc.constantFrom(...files), textInputs(tokens, tokens)),
        async ([file, content]) => {
          writeFileSync(file, content);
          const read = await readInfinibandClass(dir);
          expect(read.devices.length, relative(dir, file)).toBeGreaterThan(0);
          return 'read';
        },
        budget(100, 2),
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('mountstats never throws', async () => {
    const tokens = [
      'device ',
      ' mounted on ',
      ' with fstype nfs4 statvers=1.1\n',
      '\txprt:\ttcp ',
      '\txprt:\trdma ',
      '\tper-op statistics\n',
      '\t        READ: ',
      '\tbytes:\t',
      '\tevents:\t',
      'age:\t',
      '18446744073709551615 ',
      '-1 ',
      '\n',
      ' ',
    ];
    await fuzz(
      REPORT,
      'agent/sources/mountstats',
      textInputs(samples(join('procfs-nfs-infiniband', 'mountstats')), tokens),
      (text) => outcomeOf(() => parseMountstats(text)),
      budget(300, 2),
    );
  });

  it('Megatron logs (iteration lines and training errors) never throw', async () => {
    const tokens = [
      ' iteration      100/  500000 | ',
      'consumed samples: ',
      'elapsed time per iteration (ms): ',
      'lm loss: ',
      'nan',
      'inf',
      ' | ',
      'loss scale: ',
      'grad norm: ',
      'number of skipped iterations: ',
      'Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600011 milliseconds before timing out.',
      'torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ',
      'Failures:',
      '  [1]:',
      '    rank      : 3 (local_rank: 3)',
      'exitcode  : -6 (pid: 1234)',
      'NCCL error in: ',
      'CUDA error: ',
      '[default0]:',
      '\n',
      '=====',
    ];
    const texts = [...samples('megatron-logs', /\.(out|txt)$/), ...samples('nccl-torch-errors', /\.txt$/)].map((text) => text.slice(0, 60_000));
    await fuzz(
      REPORT,
      'agent/sources/megatron-log and training-log-failures',
      textInputs(texts, tokens),
      (text) =>
        outcomeOf(() => {
          const parser = new TrainingErrorParser();
          for (const line of text.split('\n')) {
            parseIterationLine(line);
            parser.push(line);
          }
          parser.flush();
        }),
      budget(250, 2),
    );
  });

  it('/proc parsers never throw, and the training tree classifies any process table', async () => {
    const stat =
      '1234 (python3 (x)) S 1 1234 1234 0 -1 4194560 81234 0 12 0 100 20 0 0 20 0 8 0 1235801 1000 10 18446744073709551615 1 1 0 0 0 0 0 16781312 17642 0 0 0 17 3 0 0 0 0 0 0 0 0 0 0 0 0 0\n';
    const tokens = [
      '(',
      ')',
      ') ',
      ' Z ',
      ' -1 ',
      ' 99999999999999999999 ',
      'VmRSS:\t 1234 kB\n',
      'RANK=3\0',
      'LOCAL_RANK=1\0',
      'SLURM_PROCID=7\0',
      '=\0',
      '\0',
      'torchrun',
      '--nproc-per-node=8',
    ];
    await fuzz(
      REPORT,
      'agent/sources/proc-tree parsers',
      textInputs([stat, 'Name:\tpython3\nVmRSS:\t  2048 kB\n', 'RANK=0\0LOCAL_RANK=0\0PATH=/usr/bin\0'], tokens),
      (text) => outcomeOf(() => [parseStatLine(text), parseResidentBytes(text), parseRankEnvironment(text)]),
      budget(400, 1.5),
    );

    const pid = fc.oneof(fc.integer({ min: 1, max: 12 }), fc.integer({ min: -2, max: 2 ** 31 }));
    const entry: fc.Arbitrary<ProcessEntry> = fc.record({
      pid,
      ppid: pid,
      comm: fc.oneof(fc.constantFrom('python3', 'torchrun', 'pt_data_worker', 'python', 'pt_autotune', 'srun', 'bash'), fc.string({ maxLength: 16 })),
      state: fc.constantFrom('R', 'S', 'D', 'Z', 'T', 'I', 'X'),
      utimeTicks: fc.nat(),
      stimeTicks: fc.nat(),
      numThreads: fc.nat({ max: 4096 }),
      startTimeTicks: fc.nat(),
      argv: fc.array(
        fc.oneof(
          fc.constantFrom('python3', '-m', 'torch.distributed.run', 'torchrun', '--nproc-per-node=8', 'pretrain_gpt.py', '-u', 'deepspeed', 'srun'),
          fc.string({ maxLength: 12 }),
        ),
        { maxLength: 6 },
      ),
      residentBytes: fc.option(fc.nat(), { nil: undefined }),
      environment: fc.option(
        fc.record({
          rank: fc.option(fc.nat({ max: 64 }), { nil: undefined }),
          localRank: fc.option(fc.nat({ max: 8 }), { nil: undefined }),
          slurmProcId: fc.option(fc.nat({ max: 64 }), { nil: undefined }),
        }),
        { nil: undefined },
      ),
    });
    await fuzz(
      REPORT,
      'agent/sources/proc-tree classify',
      fc.array(entry, { maxLength: 40 }),
      (table) => outcomeOf(() => classifyTrainingTree(table)),
      budget(300, 1.5),
    );
  });

  it('py-spy dumps never throw, nor does picking the training thread and normalising its frames', async () => {
    const tokens = [
      'Process 1234: /usr/bin/python3 -u pretrain_gpt.py\n',
      'Python v3.8.12 (/usr/bin/python3.8)\n',
      'Thread 688510 (active): "MainThread"\n',
      'Thread 0x7F (idle)\n',
      '    broadcast (torch/distributed/distributed_c10d.py:1191)\n',
      '        Arguments:\n',
      '            tensor: <Tensor at 0x7f>\n',
      '    0x7caaa50b1a9b (?)\n',
      '    <module> (pretrain_gpt.py:249)\n',
      ' (',
      ':',
      ')',
      '\n',
      '    ',
    ];
    await fuzz(
      REPORT,
      'analyzers/stacks/pyspy',
      textInputs(samples('py-spy', /\.txt$/), tokens),
      (text) =>
        outcomeOf(() => {
          const parse = parsePySpyDump(text);
          selectTrainingThread(parse);
          for (const process of parse.processes) for (const thread of process.threads) for (const frame of thread.frames) normaliseFrame(frame);
        }),
      budget(300, 2),
    );
  });

  it('faulthandler dumps never throw, nor does picking the training thread and normalising its frames', async () => {
    const tokens = [
      'Thread 0x00007fab84efd6c0 (most recent call first):\n',
      'Current thread 0x00007fab86bc4040 (most recent call first):\n',
      'Stack (most recent call first):\n',
      '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n',
      '  File ???, line ??? in ???\n',
      '  File "',
      '", line ',
      ' in ',
      '  <no Python frame>\n',
      '  ...\n',
      '...\n',
      'Fatal Python error: Segmentation fault\n',
      '# steadfast: job llama-7b rank 3 pid 2679 node gpu-node-07; one dump per signal 10\n',
      '\n',
      '  ',
      '"',
    ];
    await fuzz(
      REPORT,
      'analyzers/stacks/faulthandler',
      textInputs(samples('python-faulthandler', /\.stacks$/), tokens),
      (text) =>
        outcomeOf(() => {
          const parse = parseStackDump(text);
          selectTrainingThread(parse);
          for (const process of parse.processes) for (const thread of process.threads) for (const frame of thread.frames) normaliseFrame(frame);
        }),
      budget(300, 2),
    );
  });

  it('NCCL flight-recorder analysis never throws on a mutated dump', async () => {
    const decoded = JSON.parse(readFileSync(join(REALWORLD, 'pytorch-flight-recorder', 'lock_gil_2nd_all16ranks_decoded.json'), 'utf8')) as Record<
      string,
      unknown
    >;
    // Two ranks keep each run fast; the mutation reaches into any of their fields.
    const subset = Object.fromEntries(Object.entries(decoded).slice(0, 2));
    await fuzz(
      REPORT,
      'analyzers/flight-recorder-analysis',
      fc.oneof({ weight: 6, arbitrary: mutationsOf(subset) }, { weight: 1, arbitrary: fc.jsonValue({ maxDepth: 4 }) }),
      (value) => outcomeOf(() => analyzeFlightRecorder(splitRankKeyedDumps(value))),
      budget(150, 4),
    );
  });

  it('topologies throw only InputError, and a huge one is refused before anything is allocated', async () => {
    const sizes = { nodes: ['n0', 'n1', 'n2', 'n3'], ranksPerNode: 2, tp: 2, pp: 2, dp: 2, order: 'tp-dp-pp' };
    const table = { ranks: [0, 1, 2, 3].map((rank) => ({ rank, node: `n${rank >> 1}`, tp: rank & 1, dp: rank >> 1 })) };
    const huge = fc
      .record({ dp: fc.constantFrom(MAX_RANKS + 1, 2 ** 31, 2 ** 53, 1e308), ranksPerNode: fc.constantFrom(1, 1024, 2 ** 40) })
      .map(({ dp, ranksPerNode }) => ({ ...sizes, ranksPerNode, dp, tp: 1, pp: 1 }));
    await fuzz(
      REPORT,
      'core/topology',
      fc.oneof(mutationsOf(sizes), mutationsOf(table), huge),
      (spec) => outcomeOf(() => Topology.from(spec), InputError),
      budget(400, 2),
    );
  });

  it('job specs throw only InputError', async () => {
    const job = {
      name: 'llama',
      nodes: ['n00', 'n01'],
      ranksPerNode: 2,
      topology: { tp: 2, pp: 1, dp: 2, order: 'tp-dp-pp' },
      launcher: 'accept',
      codeVersion: 'v1',
      microbatches: { perIteration: 8, multipleOf: 2 },
    };
    const kubernetes = {
      ...job,
      launcher: { kind: 'kubernetes', namespace: 'ml', workload: 'pytorchjobs.kubeflow.org/llama', podSelector: 'training.kubeflow.org/job-name=llama' },
    };
    await fuzz(
      REPORT,
      'core/job parseJobSpec',
      fc.oneof(mutationsOf(job), mutationsOf(kubernetes)),
      (spec) => outcomeOf(() => parseJobSpec(spec), InputError),
      budget(400, 2),
    );
  });

  it('Slurm hostlists throw only DoNotRetryError, never expand past their bound and never loop', async () => {
    const digits = fc.oneof(
      fc.integer({ min: 0, max: 120 }).map(String),
      fc.constantFrom('0', '00', '007', '99999', '100000', '9007199254740991', '9007199254740993', '9'.repeat(400)),
    );
    const range = fc.oneof(
      digits,
      fc.tuple(digits, digits).map(([low, high]) => `${low}-${high}`),
    );
    const group = fc.array(range, { minLength: 1, maxLength: 3 }).map((ranges) => `[${ranges.join(',')}]`);
    const item = fc
      .tuple(fc.constantFrom('gpu-', 'n', 'rack1-n', ''), fc.array(fc.tuple(group, fc.constantFrom('', 'x', '-ib')), { maxLength: 3 }))
      .map(([prefix, parts]) => prefix + parts.map((part) => part.join('')).join(''));
    const list = fc.array(item, { minLength: 1, maxLength: 4 }).map((items) => items.join(','));
    const broken = mutatedText(['gpu-[01-03,07],login1', 'r[1-2]n[8-9]', '(null)', 'n[0-99999][0-99999]'], ['[', ']', ',', '-', '[0-99999]', '9'.repeat(30)]);
    await fuzz(
      REPORT,
      'actuators/hostlist',
      fc.oneof(list, broken, fc.string({ maxLength: 40 })),
      (text) =>
        outcomeOf(() => {
          expect(expandHostlist(text).length).toBeLessThanOrEqual(100_000);
        }, DoNotRetryError),
      budget(400, 3),
    );
  });

  it('iteration CSV throws only InputError', async () => {
    const csv = 'time,rank,iteration_seconds\n0,0,1.5\n0,1,1.6\n60,0,1.5\n60,1,3.2\n';
    const tokens = [',', '\n', '\r\n', '\ufeff', 'nan', 'Infinity', '-1', '1e400', '0x10', 'rank', 'time', 'iteration_seconds', ' ', '9007199254740993'];
    await fuzz(
      REPORT,
      'cli/detect parseIterationCsv',
      textInputs([csv, 'rank,iteration_seconds,time\n3,2.5,10\n'], tokens),
      (text) => outcomeOf(() => parseIterationCsv(text, 'fuzz.csv'), InputError),
      budget(400, 1.5),
    );
  });
});

function listFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => (entry.isDirectory() ? listFiles(join(dir, entry.name)) : [join(dir, entry.name)]));
}
