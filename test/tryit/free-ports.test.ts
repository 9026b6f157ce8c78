import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { freePort, freePorts } from '../../tryit/processes.js';
import { reservablePortRange } from '../../tryit/ports.js';

const run = promisify(execFile);

function listen(port: number): Promise<ReturnType<typeof createServer>> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => resolve(server));
  });
}

describe('free loopback ports for the simulated parts', () => {
  it('gives as many distinct ports as asked for, each free to listen on', async () => {
    const ports = await freePorts(40);
    expect(ports).toHaveLength(40);
    expect(new Set(ports).size).toBe(40);
    const servers = await Promise.all(ports.map(listen));
    await Promise.all(servers.map((server) => new Promise<void>((resolve) => server.close(() => resolve()))));
  });

  it('never hands out a port again while the process that got it lives, even after its server closed', async () => {
    const first = await freePort();
    const server = await listen(first);
    await new Promise<void>((resolve) => server.close(() => resolve()));
    // The server is down, as a killed one waiting for its restart is: the port must stay ours.
    const later = await freePorts(300);
    expect(later).not.toContain(first);
  });

  it('keeps another process from being handed the ports this one holds', async () => {
    const mine = await freePorts(50);
    const script = `import { freePorts } from ${JSON.stringify(join(process.cwd(), 'tryit', 'ports.ts'))}; console.log(JSON.stringify(await freePorts(400)));`;
    const { stdout } = await run(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: process.cwd() });
    const theirs = JSON.parse(stdout) as number[];
    expect(theirs).toHaveLength(400);
    expect(theirs.filter((port) => mine.includes(port))).toEqual([]);
  });

  it('takes ports outside the kernel ephemeral range, where listen(0) and outgoing connections never land', async () => {
    const { low, high } = reservablePortRange();
    const ports = await freePorts(20);
    expect(ports.every((port) => port >= low && port <= high)).toBe(true);
    const dir = mkdtempSync(join(tmpdir(), 'ports-'));
    const write = (text: string): string => {
      const file = join(dir, `range-${text.replace(/\s+/g, '-')}`);
      writeFileSync(file, text);
      return file;
    };
    expect(reservablePortRange(write('32768\t60999\n'))).toEqual({ low: 10_000, high: 32_767 });
    // Little room below a widened ephemeral range: the ports above it.
    expect(reservablePortRange(write('1024 60999'))).toEqual({ low: 61_000, high: 65_535 });
    expect(reservablePortRange(join(dir, 'missing'))).toEqual({ low: 10_000, high: 32_767 });
  });
});
