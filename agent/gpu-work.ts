/**
 * One heavy job on this node's GPUs at a time, whichever endpoint asks for it: a validation's burn
 * (collectors/validate.ts) and a stop-time diagnosis (collectors/diagnose.ts: dcgmi diag, NCCL
 * tests) would otherwise run on the same GPUs at once, each measuring the other's load as the
 * node's fault. The agent keeps one for all its collectors; the second asker is answered 409.
 */
export class GpuWork {
  private holder: string | undefined;

  /** Takes the GPUs for `what`; undefined when taken, else what holds them now. */
  take(what: string): string | undefined {
    if (this.holder !== undefined) return this.holder;
    this.holder = what;
    return undefined;
  }

  release(what: string): void {
    if (this.holder === what) this.holder = undefined;
  }
}
