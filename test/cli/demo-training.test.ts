import { describe, expect, it } from 'vitest';
import { demoCommand } from '../../tryit/cli/demo.js';
import { parseScenarioList } from '../../tryit/cli/demo-training.js';
import { scenarioLabs } from '../../tryit/lab/scenarios.js';
import { InputError } from '../../core/errors.js';
import { runCli } from '../support/cli.js';

/** `steadfast demo --scenario training`: its input, refused before anything starts (test/lab/ runs the scenarios). */
describe('steadfast demo --scenario training: input', () => {
  it('runs every scenario by default, or the ones named, in the order given', () => {
    expect(parseScenarioList(undefined)).toEqual([
      'machine-fault',
      'bad-code',
      'crash',
      'hang',
      'fail-slow',
      'hot-swap',
      'hot-swap-spare-dies',
      'foreign-drain',
      'preflight',
    ]);
    expect(parseScenarioList('crash, machine-fault')).toEqual(['crash', 'machine-fault']);
  });

  it('runs the hang on a lab of its own: 3 ranks and a 10 s stalled-progress bound', () => {
    expect(scenarioLabs(['hang', 'crash', 'machine-fault'])).toEqual([
      { options: {}, names: ['crash', 'machine-fault'] },
      { options: { nodes: 3, standbys: 1, noProgressSeconds: 10 }, names: ['hang'] },
    ]);
    expect(scenarioLabs(['hang'])).toEqual([{ options: { nodes: 3, standbys: 1, noProgressSeconds: 10 }, names: ['hang'] }]);
    expect(scenarioLabs(['crash'])).toEqual([{ options: {}, names: ['crash'] }]);
  });

  it('runs fail-slow on a lab of its own too: the job with micro-batches, fail-slow checks every second and costs of seconds', () => {
    expect(scenarioLabs(['fail-slow', 'crash', 'hang'])).toEqual([
      { options: {}, names: ['crash'] },
      { options: { nodes: 2, standbys: 1, failSlow: { intervalSeconds: 1, costSeconds: { S2: 2, S3: 5, S4: 8 }, threshold: 0.5 } }, names: ['fail-slow'] },
      { options: { nodes: 3, standbys: 1, noProgressSeconds: 10 }, names: ['hang'] },
    ]);
  });

  it('runs both hot-swap cases on one lab of their own: 2 ranks, a spare for each case, standbys for the used spare and the fallback', () => {
    const hotSwapLab = { nodes: 2, spares: 2, standbys: 2 };
    expect(scenarioLabs(['hot-swap', 'machine-fault', 'hot-swap-spare-dies'])).toEqual([
      { options: {}, names: ['machine-fault'] },
      { options: hotSwapLab, names: ['hot-swap', 'hot-swap-spare-dies'] },
    ]);
    expect(scenarioLabs(['hot-swap-spare-dies'])).toEqual([{ options: hotSwapLab, names: ['hot-swap-spare-dies'] }]);
  });

  it("runs the preflight on a lab of its own: 4 nodes, a standby, one node's link slowed from lab up", () => {
    expect(scenarioLabs(['preflight', 'crash'])).toEqual([
      { options: {}, names: ['crash'] },
      { options: { nodes: 4, standbys: 1, preflight: { slowNode: 2, rateMbit: 16, thresholdSeconds: 0.25 } }, names: ['preflight'] },
    ]);
  });

  it('refuses an unknown or empty scenario list, naming the choices', () => {
    expect(() => parseScenarioList('slow-disk')).toThrow(InputError);
    expect(() => parseScenarioList('slow-disk')).toThrow(
      /unknown slow-disk; choose from machine-fault, bad-code, crash, hang, fail-slow, hot-swap, hot-swap-spare-dies, foreign-drain, preflight/,
    );
    expect(() => parseScenarioList(',')).toThrow(/empty/);
  });

  it('exits 2 for --scenarios naming no scenario, and for --json or --scenarios without --scenario training', async () => {
    const unknown = await runCli(demoCommand(), ['--scenario', 'training', '--scenarios', 'slow-disk']);
    expect(unknown.exitCode).toBe(2);
    expect(unknown.stderr).toContain('--scenarios: unknown slow-disk');
    const json = await runCli(demoCommand(), ['--json']);
    expect(json.exitCode).toBe(2);
    expect(json.stderr).toContain('--json and --scenarios go with --scenario training');
    const other = await runCli(demoCommand(), ['--scenario', 'chaos']);
    expect(other.exitCode).toBe(2);
    expect(other.stderr).toContain('must be spine, recovery or training');
  });
});
