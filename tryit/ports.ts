import { mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * Loopback ports for the parts the demo and the tests start, each handed out once and kept for
 * the whole life of the process that asked for it.
 *
 * A port the kernel picks (`listen(0)`) is free only until someone else asks: a server killed to
 * be restarted on its port (a Redis failover, a controller crash) leaves it free meanwhile, and a
 * test file running beside it could be handed that port and take it first. So ports come from
 * below the kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`), where neither
 * `listen(0)` nor an outgoing connection ever lands, and each is reserved across processes by a
 * file `<tmp>/steadfast-ports-<uid>/<port>/<pid>`: a port is granted to a process only while no
 * other live process holds a file for it. Files of dead processes count for nothing and are
 * removed when met; a process removes its own when it exits.
 */

const SEARCH_FLOOR = 10_000;
const ATTEMPTS = 2_000;

/** Files this process holds, removed at exit. Process-wide by nature, as the ports are. */
const held = new Set<string>();
let exitHookInstalled = false;

function reservationRoot(): string {
  return join(tmpdir(), `steadfast-ports-${process.getuid?.() ?? 'user'}`);
}

/** The ports to hand out: below the ephemeral range, or above it when too little lies below. */
export function reservablePortRange(rangeFile = '/proc/sys/net/ipv4/ip_local_port_range'): { low: number; high: number } {
  let ephemeral = { low: 32_768, high: 60_999 };
  try {
    const [low, high] = readFileSync(rangeFile, 'utf8').trim().split(/\s+/).map(Number);
    if (Number.isInteger(low) && Number.isInteger(high) && (low as number) <= (high as number)) ephemeral = { low: low as number, high: high as number };
  } catch {
    // Not Linux, or no procfs: the kernel's default range.
  }
  if (ephemeral.low - SEARCH_FLOOR >= 4_000) return { low: SEARCH_FLOOR, high: ephemeral.low - 1 };
  return { low: ephemeral.high + 1, high: 65_535 };
}

function alive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function releaseAll(): void {
  for (const file of held) rmSync(file, { force: true });
  held.clear();
}

/** Takes `port` for this process unless another live process holds it. */
function reserve(port: number): boolean {
  const dir = join(reservationRoot(), String(port));
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const own = join(dir, String(process.pid));
  if (held.has(own)) return false;
  writeFileSync(own, '');
  // Both of two processes that write at once see the other's file and back off: never both keep it.
  const others = readdirSync(dir).filter((name) => name !== String(process.pid));
  let taken = false;
  for (const name of others) {
    if (alive(Number(name))) taken = true;
    else rmSync(join(dir, name), { force: true });
  }
  if (taken) {
    rmSync(own, { force: true });
    return false;
  }
  held.add(own);
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    process.once('exit', releaseAll);
  }
  return true;
}

function canListen(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

/** A loopback port no other process was or will be handed while this one lives. */
export async function freePort(): Promise<number> {
  const [port] = await freePorts(1);
  return port as number;
}

/** `count` distinct loopback ports, each reserved for this process (see above). */
export async function freePorts(count: 2): Promise<[number, number]>;
export async function freePorts(count: 3): Promise<[number, number, number]>;
export async function freePorts(count: number): Promise<number[]>;
export async function freePorts(count: number): Promise<number[]> {
  const { low, high } = reservablePortRange();
  const span = high - low + 1;
  const ports: number[] = [];
  let next = low + Math.floor(Math.random() * span);
  for (let attempt = 0; ports.length < count; attempt += 1) {
    if (attempt >= ATTEMPTS) throw new Error(`no free loopback port found in ${low}-${high} after ${ATTEMPTS} tries`);
    const port = next;
    next = low + ((next - low + 1 + Math.floor(Math.random() * 16)) % span);
    // A port something outside steadfast listens on stays reserved, so that it is not tried again.
    if (reserve(port) && (await canListen(port))) ports.push(port);
  }
  return ports;
}
