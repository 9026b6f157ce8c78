import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { labCommand } from '../../tryit/cli/lab.js';
import { runCli } from '../support/cli.js';

/** `steadfast lab` refusing bad input before it touches the machine, and on a directory with no lab. */
describe('steadfast lab: input and empty directories', () => {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-lab-cli-'));
  afterAll(() => rmSync(root, { recursive: true, force: true }));

  it('documents up, down and status', async () => {
    const commands = labCommand().commands;
    expect(commands.map((command) => command.name())).toEqual(['up', 'down', 'status']);
    const help = commands[0]?.helpInformation() ?? '';
    expect(help).toMatch(/--standbys <count>/);
    expect(help).toMatch(/--subnet <a\.b\.c>/);
    expect((await runCli(labCommand(), ['up', '--help'])).exitCode).toBe(0);
  });

  it('exits 2 for a public subnet, no nodes, or a prefix that could not be an interface name', async () => {
    const publicNet = await runCli(labCommand(), ['up', '--dir', join(root, 'a'), '--subnet', '8.8.8']);
    expect(publicNet.exitCode).toBe(2);
    expect(publicNet.stderr).toMatch(/subnet: must be the first three octets of a private \/24/);
    const noNodes = await runCli(labCommand(), ['up', '--dir', join(root, 'a'), '--nodes', '0']);
    expect(noNodes.exitCode).toBe(2);
    expect(noNodes.stderr).toMatch(/nodes:/);
    const longPrefix = await runCli(labCommand(), ['down', '--dir', join(root, 'a'), '--prefix', 'a-very-long-prefix']);
    expect(longPrefix.exitCode).toBe(2);
    expect(longPrefix.stderr).toMatch(/prefix:/);
  });

  it('says it needs root instead of failing half-way', async () => {
    const getuid = vi.spyOn(process, 'getuid').mockReturnValue(1000);
    try {
      const up = await runCli(labCommand(), ['up', '--dir', join(root, 'b')]);
      expect(up.exitCode).toBe(2);
      expect(up.stderr).toMatch(/needs root/);
    } finally {
      getuid.mockRestore();
    }
  });

  it('reports no lab, and down on nothing is harmless', async () => {
    const dir = join(root, 'empty');
    const status = await runCli(labCommand(), ['status', '--dir', dir, '--prefix', 'sfnone']);
    expect(status).toMatchObject({ exitCode: 0, stdout: `no lab in ${dir}\n` });
    const json = await runCli(labCommand(), ['status', '--dir', dir, '--prefix', 'sfnone', '--json']);
    expect(JSON.parse(json.stdout)).toMatchObject({ phase: 'none', strays: { netns: [], links: [] } });
    const down = await runCli(labCommand(), ['down', '--dir', dir, '--prefix', 'sfnone']);
    expect(down.exitCode).toBe(0);
    expect(down.stdout).toMatch(/stopped 0 process/);
  });

  it('names a damaged state file', async () => {
    const dir = join(root, 'damaged');
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'lab.json'), '{"version": 7}');
    const status = await runCli(labCommand(), ['status', '--dir', dir, '--prefix', 'sfnone']);
    expect(status.exitCode).toBe(2);
    expect(status.stderr).toContain(`${join(dir, 'lab.json')} is not a lab state file`);
  });
});
