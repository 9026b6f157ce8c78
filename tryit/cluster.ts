import { randomUUID } from 'node:crypto';
import { appendFileSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tryitRoot } from './paths.js';
import { StandInNvml } from './nvml/stand-in.js';

/**
 * A simulated GPU node is a directory with what a real agent reads on a real node: a kernel log,
 * the output of `nvidia-smi -q -x` and the boot id (`proc/sys/kernel/random/boot_id`). Faults are
 * injected by writing to them, exactly as the kernel and the driver would. The agent keeps its
 * record of the Xids it reported in the node's directory too (`xid-state.json`).
 */

const FIXTURE = join(tryitRoot(), 'fixtures', 'nvidia-smi-a10g.xml');
const FAKE_NVIDIA_SMI = join(tryitRoot(), 'fake-nvidia-smi.sh');

/** PCI bus numbers of the eight GPUs of an HGX board. */
const GPU_BUSES = ['18', '2a', '3a', '5d', '9a', 'ab', 'ba', 'db'];

export interface SimulatedGpu {
  readonly index: number;
  /** `dddd:bb:dd`, as Xid lines print it. */
  readonly pciBusId: string;
  present: boolean;
}

export class SimulatedNode {
  readonly kmsgPath: string;
  readonly xmlPath: string;
  /** The node's procfs root: only the boot id is there. */
  readonly procfs: string;
  /** Where the node's agent records the last fatal Xid the controller took (`--xid.state-file`). */
  readonly xidStateFile: string;
  /** The agent's diagnostics file: one GPU check that fails once failDiagnostics() was called. */
  readonly diagnosticsConfig: string;
  /** The node's nvidia-smi for the agent's gpu-reset endpoint (tryit/fake-nvidia-smi.sh on this directory). */
  readonly nvidiaSmi: string;
  private readonly diagnosticsFlag: string;
  readonly gpus: SimulatedGpu[];
  /** The node's NVML (a stand-in libnvidia-ml.so.1), once useNvml() made one; the agent then reads it. */
  nvml: StandInNvml | undefined;
  private bootSeconds = 1000 + Math.random() * 1000;

  constructor(
    readonly name: string,
    readonly dir: string,
    private readonly template: { head: string; gpu: string; tail: string },
    gpuCount: number,
  ) {
    mkdirSync(dir, { recursive: true });
    this.kmsgPath = join(dir, 'kern.log');
    this.xmlPath = join(dir, 'nvidia-smi.xml');
    this.procfs = join(dir, 'proc');
    this.xidStateFile = join(dir, 'xid-state.json');
    mkdirSync(join(this.procfs, 'sys', 'kernel', 'random'), { recursive: true });
    writeFileSync(join(this.procfs, 'sys', 'kernel', 'random', 'boot_id'), `${randomUUID()}\n`);
    this.gpus = Array.from({ length: gpuCount }, (_, index) => ({
      index,
      pciBusId: `0000:${GPU_BUSES[index % GPU_BUSES.length] ?? '00'}:00`,
      present: true,
    }));
    this.diagnosticsFlag = join(dir, 'diagnostics-fail');
    this.diagnosticsConfig = join(dir, 'diagnostics.json');
    // Stands in for `dcgmi diag -r 2`: passes unless the demo broke this node's GPU silently.
    const check = `if [ -e '${this.diagnosticsFlag}' ]; then cat '${this.diagnosticsFlag}' >&2; exit 1; fi`;
    writeFileSync(this.diagnosticsConfig, JSON.stringify({ checks: [{ name: 'gpu-diag', command: ['sh', '-c', check], timeoutSeconds: 10 }] }));
    writeFileSync(this.kmsgPath, '');
    this.kernel('Linux version 6.1.0-steadfast-sim (simulated)');
    this.kernel('nvidia-nvlink: Nvlink Core is being initialized, major device number 511');
    this.nvidiaSmi = join(dir, 'nvidia-smi');
    writeFileSync(this.nvidiaSmi, `#!/bin/sh\nexec sh '${FAKE_NVIDIA_SMI}' '${dir}' "$@"\n`, { mode: 0o755 });
    this.writeXml();
  }

  /**
   * A fault a GPU reset clears: the Xid in the kernel log, and nvidia-smi printing
   * "[GPU requires reset]" for the GPU until it is reset. With `stuck` the reset fails.
   */
  needsReset(gpuIndex: number, xid: number, message: string, options: { stuck?: boolean } = {}): void {
    writeFileSync(join(this.dir, `gpu-${gpuIndex}-bad`), '');
    if (options.stuck) writeFileSync(join(this.dir, `gpu-${gpuIndex}-stuck`), '');
    this.injectXid(gpuIndex, xid, message);
  }

  /** Processes holding the GPU (empty: none), which make nvidia-smi refuse a reset. */
  holdGpu(gpuIndex: number, pids: readonly number[]): void {
    const file = join(this.dir, `gpu-${gpuIndex}-busy`);
    if (pids.length === 0) rmSync(file, { force: true });
    else writeFileSync(file, `${pids.join('\n')}\n`);
  }

  /** Persistence mode on the GPU, which blocks a reset. */
  setPersistence(gpuIndex: number, on: boolean): void {
    const file = join(this.dir, `gpu-${gpuIndex}-persistence`);
    if (on) writeFileSync(file, '');
    else rmSync(file, { force: true });
  }

  /** The GPU indexes nvidia-smi reset on this node, in order. */
  resets(): number[] {
    const file = join(this.dir, 'resets');
    if (!existsSync(file)) return [];
    return readFileSync(file, 'utf8').split('\n').filter(Boolean).map(Number);
  }

  /** Whether nvidia-smi still shows the GPU as needing a reset. */
  gpuNeedsReset(gpuIndex: number): boolean {
    return existsSync(join(this.dir, `gpu-${gpuIndex}-bad`));
  }

  /** A fault only a diagnostic finds (no Xid, no alert): the node's GPU check fails from now on. */
  failDiagnostics(message: string): void {
    writeFileSync(this.diagnosticsFlag, `${message}\n`);
  }

  gpu(index: number): SimulatedGpu {
    const gpu = this.gpus[index];
    if (!gpu) throw new Error(`${this.name} has no GPU ${index}`);
    return gpu;
  }

  /** Appends one kernel log line with a dmesg-style uptime prefix. */
  kernel(message: string): void {
    this.bootSeconds += 0.25 + Math.random();
    appendFileSync(this.kmsgPath, `[${this.bootSeconds.toFixed(6).padStart(13)}] ${message}\n`);
  }

  /**
   * Gives the node an NVML library (tryit/nvml/stand-in.c) listing the same GPUs as its nvidia-smi
   * output, for an agent that reads its GPUs and Xid events through NVML.
   */
  async useNvml(): Promise<void> {
    this.nvml = await StandInNvml.create(join(this.dir, 'nvml'), this.nvmlState());
  }

  /**
   * An Xid as the driver reports it: a line in the kernel log and, on a node with NVML, an Xid
   * event. `via: 'nvml'` leaves the kernel log out, as an agent without kernel-log rights sees it.
   */
  injectXid(gpuIndex: number, xid: number, message: string, options: { via?: 'both' | 'nvml' } = {}): void {
    if (options.via !== 'nvml') this.kernel(`NVRM: Xid (PCI:${this.gpu(gpuIndex).pciBusId}): ${xid}, pid='<unknown>', name=<unknown>, ${message}`);
    const listed = this.gpus.filter((gpu) => gpu.present).findIndex((gpu) => gpu.index === gpuIndex);
    if (this.nvml && listed !== -1) this.nvml.raiseXidSync(listed, xid);
    else if (options.via === 'nvml') throw new Error(`${this.name} has no NVML to raise Xid ${xid} on GPU ${gpuIndex}`);
  }

  /** The GPU drops off the bus: Xid 79 in the kernel log, and nvidia-smi no longer lists it. */
  fallOffBus(gpuIndex: number, options: { via?: 'both' | 'nvml' } = {}): void {
    this.injectXid(gpuIndex, 79, 'GPU has fallen off the bus.', options);
    this.gpu(gpuIndex).present = false;
    this.writeXml();
  }

  /** The listed GPUs as NVML answers for them: identity, a few readings, Xid events. */
  private nvmlState(): string {
    const lines = ['driver 515.105.01', `gpus ${this.gpus.filter((gpu) => gpu.present).length}`];
    this.gpus
      .filter((gpu) => gpu.present)
      .forEach((gpu, position) => {
        const [domain = '0000', bus = '00', device = '00'] = gpu.pciBusId.split(':');
        for (const [key, value] of [
          ['pci', `0000${domain}:${bus.toUpperCase()}:${device}.0`],
          ['minor', String(gpu.index)],
          ['uuid', this.uuid(gpu.index)],
          ['name', 'NVIDIA A10G'],
          ['temp', '33'],
          ['power', '60000'],
          ['power.limit', '300000'],
          ['events', '0x8'],
        ]) {
          lines.push(`${position} ${key} ${value}`);
        }
      });
    return `${lines.join('\n')}\n`;
  }

  private uuid(index: number): string {
    const nodeHash = [...this.name].reduce((sum, char) => (sum * 31 + char.charCodeAt(0)) % 0xffff, 7);
    return `GPU-5eadfa57-${nodeHash.toString(16).padStart(4, '0')}-0000-0000-00000000000${index}`;
  }

  private writeXml(): void {
    this.nvml?.setStateSync(this.nvmlState());
    const listed = this.gpus.filter((gpu) => gpu.present);
    const blocks = listed.map((gpu) => {
      const [domain = '0000', bus = '00', device = '00'] = gpu.pciBusId.split(':');
      return this.template.gpu
        .replace(/<gpu id="[^"]*">/, `<gpu id="0000${domain}:${bus.toUpperCase()}:${device}.0">`)
        .replace(/<minor_number>\d+<\/minor_number>/, `<minor_number>${gpu.index}</minor_number>`)
        .replace(/<uuid>[^<]*<\/uuid>/, `<uuid>${this.uuid(gpu.index)}</uuid>`)
        .replace(/<pci_bus>[0-9A-Fa-f]+<\/pci_bus>/, `<pci_bus>${bus.toUpperCase()}</pci_bus>`)
        .replace(/<pci_bus_id>[^<]*<\/pci_bus_id>/, `<pci_bus_id>0000${domain}:${bus.toUpperCase()}:${device}.0</pci_bus_id>`);
    });
    const head = this.template.head.replace(/<attached_gpus>\d+<\/attached_gpus>/, `<attached_gpus>${listed.length}</attached_gpus>`);
    // Write then rename, so a poll never reads half a file.
    writeFileSync(join(this.dir, 'gpus'), listed.map((gpu) => `${gpu.index} ${gpu.pciBusId}\n`).join(''));
    const temporary = `${this.xmlPath}.tmp`;
    writeFileSync(temporary, `${head}${blocks.join('\n')}${this.template.tail}`);
    renameSync(temporary, this.xmlPath);
  }
}

function loadTemplate(): { head: string; gpu: string; tail: string } {
  const xml = readFileSync(FIXTURE, 'utf8');
  const start = xml.indexOf('<gpu id=');
  const end = xml.lastIndexOf('</gpu>') + '</gpu>'.length;
  if (start < 0 || end < start) throw new Error(`${FIXTURE} has no <gpu> element`);
  return { head: xml.slice(0, start), gpu: xml.slice(start, end), tail: xml.slice(end) };
}

export function nodeNames(count: number): string[] {
  return Array.from({ length: count }, (_, index) => `node-${index + 1}`);
}

/** Creates `count` simulated nodes under `root`, named node-1 … node-N. */
export function createSimulatedNodes(root: string, count: number, gpusPerNode = 8): SimulatedNode[] {
  const template = loadTemplate();
  return nodeNames(count).map((name) => new SimulatedNode(name, join(root, 'nodes', name), template, gpusPerNode));
}
