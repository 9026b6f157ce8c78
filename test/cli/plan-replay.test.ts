import { describe, expect, it } from 'vitest';
import { planCommand } from '../../cli/plan.js';
import { runCli, type CliRun } from '../support/cli.js';

/**
 * `steadfast plan replay`, run in process (test/cli/main.test.ts runs the built dist/, which this
 * change may not have been built into yet).
 */

function plan(...args: string[]): Promise<CliRun> {
  return runCli(planCommand(), args);
}

describe('steadfast plan replay', () => {
  it('prints the horizontal and vertical groups of Fig. 6 for 24 machines in groups of 4', async () => {
    const run = await plan('replay', '--machines', '24', '--group-size', '4');
    expect(run.exitCode).toBe(0);
    const printed = JSON.parse(run.stdout) as { horizontal: number[][]; vertical: number[][]; suspects?: number[] };
    expect(printed.horizontal[3]).toEqual([12, 13, 14, 15]);
    expect(printed.vertical[1]).toEqual([1, 7, 13, 19]);
    expect(printed.suspects).toBeUndefined();
  });

  it('adds the suspects of the failing groups given with --failed, 0-based', async () => {
    const run = await plan('replay', '--machines', '24', '--group-size', '4', '--failed', '3,1');
    expect(run.exitCode).toBe(0);
    expect(JSON.parse(run.stdout)).toMatchObject({ suspects: [13] });
  });

  it('takes node names in place of a count', async () => {
    const run = await plan('replay', '--machines', 'gpu-a,gpu-b,gpu-c,gpu-d', '--group-size', '2', '--failed', '0,1');
    expect(run.exitCode).toBe(0);
    expect(JSON.parse(run.stdout)).toEqual({
      horizontal: [
        ['gpu-a', 'gpu-b'],
        ['gpu-c', 'gpu-d'],
      ],
      vertical: [
        ['gpu-a', 'gpu-c'],
        ['gpu-b', 'gpu-d'],
      ],
      suspects: ['gpu-b'],
    });
  });

  it('warns on stderr, keeping stdout JSON, when a fault leaves several suspects or none', async () => {
    const several = await plan('replay', '--machines', '8', '--group-size', '4', '--failed', '0,1');
    expect(JSON.parse(several.stdout)).toMatchObject({ suspects: [1, 3] });
    expect(several.stderr).toContain('up to 2 suspects');
    const none = await plan('replay', '--machines', '24', '--group-size', '4', '--failed', '0,5');
    expect(JSON.parse(none.stdout)).toMatchObject({ suspects: [] });
    expect(none.stderr).toContain('the replays disagree');
  });

  it('exits 2 with a clear message for a group size that does not divide the machines or a group index out of range', async () => {
    const ragged = await plan('replay', '--machines', '10', '--group-size', '4');
    expect(ragged.exitCode).toBe(2);
    expect(ragged.stderr).toContain('group size 4 does not divide the 10 machines');
    expect(ragged.stdout).toBe('');
    const range = await plan('replay', '--machines', '24', '--group-size', '4', '--failed', '6,0');
    expect(range.exitCode).toBe(2);
    expect(range.stderr).toContain('failing horizontal group must be a 0-based group index 0-5, got 6');
  });

  it('exits 2 naming the option for malformed --machines, --group-size and --failed values', async () => {
    const machines = await plan('replay', '--machines', 'a,b,a', '--group-size', '1');
    expect(machines.exitCode).toBe(2);
    expect(machines.stderr).toContain('--machines');
    expect(machines.stderr).toContain('lists node a twice');
    const size = await plan('replay', '--machines', '8', '--group-size', '0');
    expect(size.exitCode).toBe(2);
    expect(size.stderr).toContain('--group-size');
    const failed = await plan('replay', '--machines', '8', '--group-size', '2', '--failed', '1');
    expect(failed.exitCode).toBe(2);
    expect(failed.stderr).toContain('must be A,B');
    const missing = await plan('replay', '--machines', '8');
    expect(missing.exitCode).toBe(2);
    expect(missing.stderr).toContain('--group-size');
  });
});
