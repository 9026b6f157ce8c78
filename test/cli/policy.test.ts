import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { policyCommand } from '../../cli/policy.js';
import { runCli } from '../support/cli.js';

function configFile(text: string): string {
  const file = join(mkdtempSync(join(tmpdir(), 'steadfast-policy-')), 'config.yaml');
  writeFileSync(file, text);
  return file;
}

const CONFIG = `
xidPolicy:
  xid:
    "13": { action: drain, count: 3, windowSeconds: 600 }
    "48": { action: observe }
  sxid:
    "20034": { action: hand_off }
`;

describe('steadfast policy', () => {
  it('prints the effective Xid and SXid tables as JSON, each row with the layer that decided it', async () => {
    const run = await runCli(policyCommand(), ['--json', '--config', configFile(CONFIG)]);
    expect(run.exitCode).toBe(0);
    const answer = JSON.parse(run.stdout) as { xid: Record<string, unknown>[]; sxid: Record<string, unknown>[]; profiles: unknown[] };
    expect(answer.profiles).toEqual([]);
    expect(answer.xid.find((row) => row.code === 13)).toEqual({
      kind: 'xid',
      code: 13,
      meaning: 'graphics engine exception, usually the application',
      action: 'drain',
      count: 3,
      windowSeconds: 600,
      source: 'configuration',
    });
    expect(answer.xid.find((row) => row.code === 48)).toMatchObject({ action: 'observe', source: 'configuration' });
    // Reboots are off by default: the ladder drains where the catalogue says reboot.
    expect(answer.xid.find((row) => row.code === 79)).toMatchObject({ action: 'reboot', takes: 'drain', source: 'catalogue' });
    expect(answer.xid.find((row) => row.code === 48)).toMatchObject({ action: 'observe', source: 'configuration' });
    expect(answer.xid.find((row) => row.code === 145)).toMatchObject({ action: 'by message', source: 'catalogue' });
    expect(answer.sxid).toEqual([
      {
        kind: 'sxid',
        code: 20034,
        meaning: 'NVSwitch error, fatal or non-fatal as the kernel line says',
        action: 'hand_off',
        count: 1,
        source: 'configuration',
      },
    ]);
  });

  it('prints each line with its source for people', async () => {
    const run = await runCli(policyCommand(), ['-c', configFile(CONFIG)]);
    expect(run.exitCode).toBe(0);
    const lines = run.stdout.split('\n');
    expect(
      lines
        .find((line) => line.trim().startsWith('13 '))
        ?.replace(/\s+/g, ' ')
        .trim(),
    ).toBe('13 drain at 3 within 600 s configuration graphics engine exception, usually the application');
    expect(
      lines
        .find((line) => line.trim().startsWith('79 '))
        ?.replace(/\s+/g, ' ')
        .trim(),
    ).toBe('79 reboot (rung off: drain) catalogue GPU has fallen off the bus');
    expect(run.stdout).toContain('20034  hand_off');
  });

  it('exits 2 on a bad key, naming it', async () => {
    const run = await runCli(policyCommand(), ['--json', '--config', configFile('xidPolicy:\n  xid:\n    "13x": { action: drain }\n')]);
    expect(run.exitCode).toBe(2);
    expect(run.stdout).toBe('');
    expect(run.stderr).toBe('steadfast: invalid config: xidPolicy.xid.13x: must be a whole-number Xid code from 0 to 100000\n');
  });

  it("prints each profile with its match, settings and its nodes' own table, its rules marked with the profile", async () => {
    const file = configFile(`${CONFIG}
remedies:
  reboot: { enabled: true }
profiles:
  - name: burn-in
    match: { nodes: [gpu-b1, gpu-b2] }
    dryRun: true
    remedies: { reboot: false }
    xidPolicy:
      xid:
        "13": { action: observe }
        "31": { action: drain }
`);
    const run = await runCli(policyCommand(), ['--json', '--config', file]);
    expect(run.exitCode).toBe(0);
    const answer = JSON.parse(run.stdout) as { xid: Record<string, unknown>[]; profiles: Array<Record<string, unknown> & { xid: Record<string, unknown>[] }> };
    // The fleet-wide table is the configuration's; the profile's rules are only in its own.
    expect(answer.xid.find((row) => row.code === 13)).toMatchObject({ action: 'drain', source: 'configuration' });
    const [profile] = answer.profiles;
    expect(profile).toMatchObject({ name: 'burn-in', match: { nodes: ['gpu-b1', 'gpu-b2'] }, dryRun: true, remedies: { reboot: false } });
    expect(profile?.xid.find((row) => row.code === 13)).toMatchObject({ action: 'observe', count: 1, source: 'profile burn-in' });
    expect(profile?.xid.find((row) => row.code === 31)).toMatchObject({ action: 'drain', source: 'profile burn-in' });
    expect(profile?.xid.find((row) => row.code === 48)).toMatchObject({ action: 'observe', source: 'configuration' });
    // Reboots on for the fleet, off in the profile: its nodes drain where the others reboot.
    expect(answer.xid.find((row) => row.code === 79)).not.toHaveProperty('takes');
    expect(profile?.xid.find((row) => row.code === 79)).toMatchObject({ action: 'reboot', takes: 'drain', source: 'catalogue' });

    const text = await runCli(policyCommand(), ['--config', file]);
    expect(text.stdout).toContain('profile burn-in: nodes ["gpu-b1","gpu-b2"]; dry-run; rungs {"reboot":false}\n    Xid 13: observe\n    Xid 31: drain\n');
  });

  it("exits 2 on a bad key in a profile's Xid policy, naming it", async () => {
    const run = await runCli(policyCommand(), [
      '--config',
      configFile('profiles:\n  - name: p\n    match: { nodes: [n1] }\n    xidPolicy: { sxid: { "12": { action: reset } } }\n'),
    ]);
    expect(run.exitCode).toBe(2);
    expect(run.stderr).toMatch(/^steadfast: invalid config: profiles\.0\.xidPolicy\.sxid\.12/);
  });
});
