import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { InputError } from '../../core/errors.js';
import { freePort } from '../processes.js';
import { LabError, hasCommand } from './command.js';
import { LabDaemons } from './daemons.js';
import { labDown } from './down.js';
import { labLayout, type LabLayout, type LabOptionsInput } from './layout.js';
import { createBridge, createNodeNetwork, labNetworkLeftovers, subnetUser } from './network.js';
import { renderHostsFile, renderSlurmConf } from './slurm-conf.js';
import { holdStandbys, startSlurmctld, startSlurmd, waitForNodesIdle, waitForSlurmctld, waitForStandbysHeld } from './slurm.js';
import { readLabState, writeLabState, type LabState } from './state.js';

/**
 * `steadfast lab up`: a bridge, one namespace per node with its own address and hostname, a
 * real slurmd in each, slurmctld on the host bound to the bridge, and the standbys held in the
 * standby reservation. Anything that fails half-way is undone before the error is reported.
 */

/** Programs the lab runs; scripts/setup.sh installs the packages that carry them. */
const REQUIRED_PROGRAMS = ['ip', 'nsenter', 'unshare', 'mount', 'hostname', 'slurmctld', 'slurmd', 'sinfo', 'scontrol', 'squeue', 'scancel'];

export interface LabUpProgress {
  (step: string, seconds: number): void;
}

function checkMachine(): void {
  if (process.getuid?.() !== 0) throw new InputError('the lab makes network namespaces and a bridge, which needs root (run it as root, or with sudo)');
  const missing = REQUIRED_PROGRAMS.filter((program) => !hasCommand(program));
  if (missing.length > 0)
    throw new InputError(`the lab needs ${missing.join(', ')}; run scripts/setup.sh (Debian packages slurmd, slurmctld, slurm-client, iproute2, util-linux)`);
}

async function refuseIfTaken(layout: LabLayout): Promise<void> {
  if (readLabState(layout.stateFile)) {
    throw new InputError(`a lab is already up in ${layout.dir} (state file ${layout.stateFile}); run \`steadfast lab down --dir ${layout.dir}\` first`);
  }
  const leftovers = await labNetworkLeftovers(layout.options.prefix);
  if (leftovers.netns.length > 0 || leftovers.links.length > 0) {
    throw new InputError(
      `namespaces or links named ${layout.options.prefix}-… already exist (${[...leftovers.netns, ...leftovers.links].join(', ')}): another lab with this --prefix, or one left behind; \`steadfast lab down --prefix ${layout.options.prefix}\` removes them`,
    );
  }
  const user = await subnetUser(layout.options.subnet, layout.bridge);
  if (user) throw new InputError(`${layout.options.subnet}.0/24 is already used on ${user}; choose another --subnet`);
}

/** A fresh state directory: Slurm's saved state and spool from an earlier lab would bring old jobs back. */
function prepareFiles(layout: LabLayout, controllerHost: string, controllerPort: number): void {
  mkdirSync(layout.dir, { recursive: true });
  rmSync(layout.slurmStateDir, { recursive: true, force: true });
  rmSync(layout.spoolDir, { recursive: true, force: true });
  for (const dir of [layout.slurmStateDir, layout.logDir, layout.jobsDir]) mkdirSync(dir, { recursive: true });
  for (const node of layout.nodes) mkdirSync(join(layout.spoolDir, node.name), { recursive: true });
  writeFileSync(layout.conf, renderSlurmConf(layout, controllerHost, controllerPort));
  writeFileSync(layout.hostsFile, renderHostsFile(layout, controllerHost));
}

export async function labUp(input: LabOptionsInput, progress: LabUpProgress = () => undefined): Promise<LabState> {
  const layout = labLayout(input);
  checkMachine();
  await refuseIfTaken(layout);
  const started = Date.now();
  const step = (what: string): void => progress(what, (Date.now() - started) / 1000);
  // slurmctld checks that it runs on the host SlurmctldHost names.
  const controllerHost = hostname().split('.')[0] ?? 'localhost';
  const controllerPort = await freePort();
  prepareFiles(layout, controllerHost, controllerPort);
  const state: LabState = {
    version: 1,
    phase: 'starting',
    options: { ...layout.options, dir: layout.dir },
    dir: layout.dir,
    conf: layout.conf,
    controllerHost,
    controllerPort,
    createdAt: new Date().toISOString(),
    slurmd: {},
  };
  // Written before anything is made, so `down` can undo an `up` killed at any point.
  writeLabState(layout.stateFile, state);
  const daemons = new LabDaemons();
  try {
    await createBridge(layout);
    for (const node of layout.nodes) await createNodeNetwork(layout, node);
    step(`bridge ${layout.bridge} (${layout.bridgeAddress}) and ${layout.nodes.length} namespaces`);
    state.slurmctld = { pid: startSlurmctld(layout, daemons), marker: layout.conf };
    writeLabState(layout.stateFile, state);
    await waitForSlurmctld(layout, daemons);
    step(`slurmctld on ${layout.bridgeAddress}:${controllerPort}`);
    for (const node of layout.nodes) {
      state.slurmd[node.name] = { pid: startSlurmd(layout, node, daemons), marker: layout.conf };
      writeLabState(layout.stateFile, state);
    }
    await waitForNodesIdle(layout, daemons);
    step(`${layout.nodes.length} slurmd nodes idle`);
    const standbys = layout.nodes.filter((node) => node.role === 'standby');
    if (standbys.length > 0) {
      await holdStandbys(layout);
      await waitForStandbysHeld(layout);
      step(`${standbys.map((node) => node.name).join(', ')} held in reservation ${layout.options.reservation}`);
    }
    state.phase = 'up';
    writeLabState(layout.stateFile, state);
    daemons.release();
    return state;
  } catch (error) {
    await daemons.stopAll();
    await labDown({ dir: layout.dir, prefix: layout.options.prefix }).catch(() => undefined);
    throw error instanceof LabError || error instanceof InputError
      ? error
      : new LabError(`lab up failed: ${error instanceof Error ? error.message : String(error)}`, error);
  }
}
