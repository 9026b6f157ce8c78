import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { createAgent, type Agent } from '../../agent/agent.js';
import { kernelLogCollectorFactory, XID_STATE_FILE_FLAG } from '../../agent/collectors/kernel-log/collector.js';
import { pino } from 'pino';
import { waitFor } from './helpers.js';

const NON_FATAL_31 =
  '[ 2001.000000] NVRM: Xid (PCI:0000:18:00): 31, pid=4242, name=python3, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f01_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ\n';
const NON_FATAL_SXID = '[ 2002.000000] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Non-fatal, Link 30 LTSSM Fault Up\n';
const FATAL_79 = "[ 2003.000000] NVRM: Xid (PCI:0000:19:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n";

interface FakeController {
  readonly url: string;
  readonly events: Record<string, unknown>[];
  readonly policyAsked: () => number;
}

/**
 * A controller that answers GET /api/v1/xid-policy with `policy` (or 404, as one older than the
 * route) and takes every fast-path event.
 */
async function fakeController(servers: Server[], policy: unknown): Promise<FakeController> {
  const events: Record<string, unknown>[] = [];
  let asked = 0;
  const server = createServer((request, response) => {
    if (request.method === 'GET' && request.url === '/api/v1/xid-policy') {
      asked += 1;
      if (policy === undefined) response.writeHead(404, { 'content-type': 'application/json' }).end('{"error":"no such endpoint"}');
      else response.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(policy));
      return;
    }
    let body = '';
    request.on('data', (chunk: Buffer) => (body += chunk.toString()));
    request.on('end', () => {
      // A request cut short (an agent closing mid-send) or not JSON is refused, as the controller would.
      let parsed: Record<string, unknown> | Record<string, unknown>[];
      try {
        parsed = JSON.parse(body) as Record<string, unknown> | Record<string, unknown>[];
      } catch {
        response.writeHead(400).end('{"error":"invalid JSON"}');
        return;
      }
      events.push(...(Array.isArray(parsed) ? parsed : [parsed]));
      response.writeHead(202).end('{}');
    });
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, events, policyAsked: () => asked };
}

describe("the agent's fast path follows the controller's Xid policy", () => {
  const servers: Server[] = [];
  const agents: Agent[] = [];
  const dirs: string[] = [];
  afterEach(async () => {
    await Promise.all(agents.splice(0).map((agent) => agent.close()));
    await Promise.all(servers.splice(0).map((server) => new Promise((resolve) => server.close(resolve))));
    for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  });

  async function run(policy: unknown): Promise<Record<string, unknown>[]> {
    const controller = await fakeController(servers, policy);
    const dir = mkdtempSync(join(tmpdir(), 'steadfast-xid-policy-'));
    dirs.push(dir);
    const kmsg = join(dir, 'kern.log');
    const logs: string[] = [];
    writeFileSync(kmsg, '');
    const agent = createAgent({
      node: 'node-1',
      listen: { host: '127.0.0.1', port: 0 },
      paths: { sysfs: '/nonexistent/sys', procfs: '/nonexistent/proc', kmsg, nvidiaSmiXml: '/nonexistent/x.xml', nvidiaSmi: '/nonexistent/nvidia-smi' },
      pollIntervalSeconds: 60,
      collectors: [kernelLogCollectorFactory],
      settings: { [XID_STATE_FILE_FLAG]: join(dir, 'xid-state.json') },
      controllerUrl: controller.url,
      controllerToken: 'agent-token-0123456789',
      logger: pino({ level: 'info' }, { write: (line: string) => void logs.push(line) }),
    });
    agents.push(agent);
    await agent.start();
    await waitFor(() => controller.policyAsked() > 0);
    // The agent has the answer (or took the 404 as "catalogue only") once it says which codes it sends.
    await waitFor(() => logs.some((line) => line.includes('Xid and SXid codes the controller wants on the fast path')));
    // The fatal Xid after the others marks that every line was read.
    appendFileSync(kmsg, NON_FATAL_31 + NON_FATAL_SXID + FATAL_79);
    await waitFor(() => controller.events.some((event) => event.xid === 79));
    return controller.events;
  }

  it('sends a non-fatal Xid and an SXid the controller listed', async () => {
    const events = await run({ version: 1, fastPath: { xid: [31], sxid: [20034] } });
    expect(events.map((event) => [event.kind, event.xid ?? event.sxid])).toEqual([
      ['xid', 31],
      ['sxid', 20034],
      ['xid', 79],
    ]);
    expect(events[0]).toMatchObject({ node: 'node-1', gpu: '0000:18:00' });
    expect(events[1]).toMatchObject({ node: 'node-1', nvswitch: '0000:05:00.0', message: expect.stringContaining('20034, Non-fatal') });
  });

  it('sends only the fatal Xid to a controller without the route (404), as before', async () => {
    const events = await run(undefined);
    expect(events.map((event) => [event.kind, event.xid ?? event.sxid])).toEqual([['xid', 79]]);
  });
});
