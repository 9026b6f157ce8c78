/**
 * The warm standby pool of ByteRobust §6.2: a fixed number of machines, initialised and
 * self-checked, asleep until an eviction wakes one. Each one woken is replaced in the background
 * after the replenishment delay; an eviction that finds the pool empty waits for a cold node
 * instead (§6.2 "prompt replenishment", §8.2.1 "we only reschedule the shortfall").
 */

export interface PoolUsage {
  activations: number;
  /** Evictions that found the pool short. */
  poolShortEvictions: number;
  coldNodes: number;
  /** Times an activation left the pool empty. */
  depletions: number;
}

export class StandbyPool {
  private ready: number;
  readonly usage: PoolUsage = { activations: 0, poolShortEvictions: 0, coldNodes: 0, depletions: 0 };

  constructor(
    readonly size: number,
    private readonly replenishMs: number,
    /** Schedules the return of a replacement standby on the simulation's clock. */
    private readonly schedule: (time: number, run: () => void) => void,
  ) {
    this.ready = size;
  }

  /** Finds replacements for `machines` evicted machines at `now`; returns how many must come cold. */
  replace(machines: number, now: number): { cold: number } {
    let cold = 0;
    for (let i = 0; i < machines; i += 1) {
      if (this.ready === 0) {
        cold += 1;
        continue;
      }
      this.ready -= 1;
      this.usage.activations += 1;
      if (this.ready === 0) this.usage.depletions += 1;
      this.schedule(now + this.replenishMs, () => {
        this.ready += 1;
      });
    }
    if (cold > 0) this.usage.poolShortEvictions += 1;
    this.usage.coldNodes += cold;
    return { cold };
  }
}
