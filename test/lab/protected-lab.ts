import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, expect } from 'vitest';
import { labProcesses } from '../../tryit/lab/daemons.js';
import { listLinks, listNetns } from '../../tryit/lab/network.js';
import { ProtectedLab } from '../../tryit/lab/protected.js';
import { type ProtectedLabOptions } from '../../tryit/lab/protected-options.js';
import type { ScenarioReport } from '../../tryit/lab/scenarios.js';

/**
 * One protected lab per scenario file: `lab up` with 2 nodes and 2 standbys, the real parts, the
 * controller and an agent in every node, the example training on node-1 and node-2. Its names and
 * subnet are its own, so files running side by side (or a lab someone runs by hand) never meet.
 * Whatever happens, afterAll takes everything down and checks that nothing is left: no slurmd,
 * slurmstepd or rank, no agent, no namespace, veth or bridge.
 */
export function protectedLabForTest(second: number, options: ProtectedLabOptions = {}): () => ProtectedLab {
  let lab: ProtectedLab | undefined;
  const prefix = `sfs${randomBytes(2).toString('hex')}`;

  beforeAll(async () => {
    if (process.getuid?.() !== 0) throw new Error('the lab tests need root (network namespaces, veths, slurmd): run npm test as root');
    lab = ProtectedLab.create({ prefix, subnet: `10.${second}.${randomBytes(1)[0] ?? 0}`, ...options });
    await lab.up();
    await lab.startTraining();
  }, 240_000);

  afterAll(async () => {
    if (!lab) return;
    const conf = lab.conf;
    const report = await lab.down();
    expect(report?.leftovers ?? { processes: [], netns: [], links: [] }).toEqual({ processes: [], netns: [], links: [] });
    expect(labProcesses(conf)).toEqual([]);
    expect((await listNetns()).filter((name) => name.startsWith(`${prefix}-`))).toEqual([]);
    expect((await listLinks()).filter((name) => name.startsWith(`${prefix}-`))).toEqual([]);
    expect([
      ...lab.layout.nodes.map((node) => lab?.processes.isRunning(`agent-${node.name}`)),
      lab.processes.isRunning('redis'),
      lab.processes.isRunning('prometheus'),
    ]).not.toContain(true);
  }, 120_000);

  return () => {
    if (!lab) throw new Error('the protected lab did not come up');
    return lab;
  };
}

/** The report as a person reads it, for the test's output: the measured figures. */
export function printReport(report: ScenarioReport): void {
  const lines = [
    `${report.name}: ${report.recovered ? 'recovered' : 'NOT recovered'} in ${report.recoverySeconds ?? '?'} s, resumed from step ${report.resumedFromStep ?? '?'}, ${report.lostIterations ?? '?'} iteration${report.lostIterations === 1 ? '' : 's'} lost, Slurm runs ${report.slurmJobIds.join(' → ')}`,
    ...report.timeline.map((step) => `  ${step.afterMs === null ? '     —' : String(step.afterMs).padStart(6)} ms  ${step.label}`),
    ...report.problems.map((problem) => `  problem: ${problem}`),
    ...(report.context ?? []).map((line) => `  | ${line}`),
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
}

/**
 * Prints the report, then holds it to what every scenario must show: no problem found, recovered,
 * and the job's Slurm runs in it, `runs` of them (the one interrupted, any in between, the one
 * that trains again).
 */
export function expectRecovered(report: ScenarioReport, runs: number): void {
  printReport(report);
  expect(report.problems).toEqual([]);
  expect(report.recovered).toBe(true);
  expect(report.slurmJobIds).toHaveLength(runs);
}
