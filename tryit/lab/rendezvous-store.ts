import { connect } from 'node:net';
import { join } from 'node:path';
import { repoRoot } from '../../core/paths.js';
import { freePort, waitFor, type ProcessGroup } from '../processes.js';

/**
 * The hot-swap lab's rendezvous store for the ranks: a process of its own on the bridge, so that it
 * outlives every rank, as a production job's would on a service node. ProtectedLab starts it when
 * the lab has spares; it takes only the parts of the lab it needs, so that the lab and the hot-swap
 * helpers (hot-swap-lab.ts), which take the whole lab, do not import each other.
 */

/** The Python the lab's ranks run (Debian's, with python3-torch). */
export const LAB_PYTHON = process.env.STEADFAST_PYTHON ?? '/usr/bin/python3';

/** What of the lab the store needs: the bridge to listen on, the process group to run in, the directory for its log. */
export interface RendezvousHost {
  readonly layout: { readonly bridgeAddress: string };
  readonly processes: ProcessGroup;
  readonly root: string;
}

/** Starts `steadfast_hotswap.py store` on the bridge address and waits until it takes connections; its `host:port`. */
export async function startRendezvousStore(lab: RendezvousHost): Promise<string> {
  const host = lab.layout.bridgeAddress;
  const port = await freePort();
  const script = join(repoRoot(), 'clients', 'python', 'steadfast_hotswap.py');
  const argv = ['-u', script, 'store', '--host', host, '--port', String(port)];
  lab.processes.start('rendezvous-store', LAB_PYTHON, argv, join(lab.root, 'logs', 'rendezvous-store.log'));
  await waitFor(`the rendezvous store on ${host}:${port}`, () => accepts(host, port), 60_000, 100);
  return `${host}:${port}`;
}

function accepts(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host, port });
    socket.setTimeout(1000);
    const done = (ok: boolean): void => {
      socket.destroy();
      resolve(ok);
    };
    socket.once('connect', () => done(true));
    socket.once('error', () => done(false));
    socket.once('timeout', () => done(false));
  });
}
