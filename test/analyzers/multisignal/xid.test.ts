import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { afterAll, describe, expect, it } from 'vitest';
import { DEFAULT_FEATURES } from '../../../analyzers/multisignal/features.js';

const PROMTOOL = process.env.PROMTOOL ?? 'promtool';
const dir = await mkdtemp(join(tmpdir(), 'steadfast-xid-features-'));
afterAll(() => rm(dir, { recursive: true, force: true }));

const query = (name: string) => DEFAULT_FEATURES.find((feature) => feature.name === name)?.query ?? '';

/**
 * The Xid features' queries at a fixed time, run by promtool (Prometheus' own engine, on a clock
 * the test sets): what counts as a repeated Xid and what as a fatal one.
 */
describe('the Xid feature queries', () => {
  it('count a burst of Xid lines as one incident, Xids that come back in three 5-minute slots as a repeat, and a fatal Xid at once', async () => {
    const xid = (node: string, code: string, severity: string) =>
      `steadfast_xid_errors_total{job="steadfast-agent", node="${node}", pci_bus_id="0000:18:00", xid="${code}", severity="${severity}"}`;
    const input_series = [
      // n1: an application crash, four Xid lines at 11 minutes and one more at 12 (one 5-minute slot).
      { series: xid('n1', '13', 'warning'), values: '_x11 4 5x40' },
      // n2: the same application Xid at 5, 20 and 35 minutes: it keeps coming back.
      { series: xid('n2', '13', 'warning'), values: '_x5 1x15 2x15 3x10' },
      // n4: a GPU fallen off the bus at 38 minutes.
      { series: xid('n4', '79', 'fatal'), values: '_x38 1x5' },
      ...['n1', 'n2', 'n3', 'n4'].map((node) => ({
        series: `steadfast_collector_success{job="steadfast-agent", node="${node}", collector="xid"}`,
        values: '1x45',
      })),
    ];
    const expect_samples = (values: Record<string, number>) => Object.entries(values).map(([node, value]) => ({ labels: `{node="${node}"}`, value }));
    await expectPromqlAnswers('xid', '1m', input_series, [
      { expr: query('xid_errors_1h'), eval_time: '40m', exp_samples: expect_samples({ n1: 1, n2: 3, n3: 0, n4: 1 }) },
      { expr: query('xid_fatal_5m'), eval_time: '40m', exp_samples: expect_samples({ n1: 0, n2: 0, n3: 0, n4: 1 }) },
    ]);
  });
});

/** Writes a promtool unit test of `cases` over `input_series` sampled every `interval`, runs it, and expects it to pass. */
async function expectPromqlAnswers(
  name: string,
  interval: string,
  input_series: { series: string; values: string }[],
  cases: Record<string, unknown>[],
): Promise<void> {
  const file = join(dir, `${name}.test.yml`);
  await writeFile(file, stringify({ rule_files: [], evaluation_interval: '1m', tests: [{ interval, input_series, promql_expr_test: cases }] }));
  const result = await new Promise<{ code: number; output: string }>((resolve) =>
    execFile(PROMTOOL, ['test', 'rules', file], (error, stdout, stderr) =>
      resolve({ code: error ? Number(error.code ?? 1) : 0, output: `${stdout}${stderr}` }),
    ),
  );
  expect(result.output).toContain('SUCCESS');
  expect(result.code, result.output).toBe(0);
}

describe('the PCIe replay recurrence query', () => {
  it("counts the last hour's 5-minute slots that saw a replay: a slow trickle fills most, one burst one, a still counter reads 0, not nothing", async () => {
    const replays = (node: string, gpu: number) =>
      `steadfast_gpu_pcie_replay_errors_total{job="steadfast-agent", node="${node}", gpu="${gpu}", pci_bus_id="0000:1${gpu}:00"}`;
    // 30-second scrapes over 70 minutes (140 samples), evaluated at 70 minutes.
    const still = '0x140';
    const input_series = [
      // n1 gpu 0: from 15 minutes on, one replay every 4 minutes (every 8th sample): far under one
      // a second, yet in every slot since (12; none in the slot that ends at 10 minutes, which a
      // Prometheus whose ranges include both ends also counts).
      { series: replays('n1', 0), values: Array.from({ length: 141 }, (_, at) => (at < 30 ? 0 : Math.floor((at - 30) / 8) + 1)).join(' ') },
      { series: replays('n1', 1), values: still },
      // n2 gpu 0: a burst of 40 replays at 40 minutes, nothing before or after: one slot.
      { series: replays('n2', 0), values: `0x80 40x60` },
      { series: replays('n2', 1), values: still },
      { series: replays('n3', 0), values: '7x140' },
    ];
    await expectPromqlAnswers('pcie', '30s', input_series, [
      {
        expr: query('gpu_pcie_replay_slots_1h'),
        eval_time: '70m',
        exp_samples: [
          { labels: '{node="n1", gpu="0"}', value: 12 },
          { labels: '{node="n1", gpu="1"}', value: 0 },
          { labels: '{node="n2", gpu="0"}', value: 1 },
          { labels: '{node="n2", gpu="1"}', value: 0 },
          { labels: '{node="n3", gpu="0"}', value: 0 },
        ],
      },
    ]);
  });
});
