import { describeIdentity, type Identity } from '../../core/credentials.js';

/**
 * How many costly reads (the audit, the queues) run at once: a few per credential and a few in
 * all, so that one credential's flood of big reads cannot hold the controller's memory and event
 * loop while Alertmanager, the agents and the health check wait. A read past either bound is
 * answered 429 with Retry-After at once; nothing queues.
 */
export class ReadLimit {
  private readonly perIdentity = new Map<string, number>();
  private total = 0;

  constructor(
    readonly perCredential = 2,
    readonly overall = 6,
  ) {}

  /** A release function when the read may run now, else undefined. */
  take(identity: Identity): (() => void) | undefined {
    const who = describeIdentity(identity);
    const mine = this.perIdentity.get(who) ?? 0;
    if (mine >= this.perCredential || this.total >= this.overall) return undefined;
    this.perIdentity.set(who, mine + 1);
    this.total += 1;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.total -= 1;
      const left = (this.perIdentity.get(who) ?? 1) - 1;
      if (left <= 0) this.perIdentity.delete(who);
      else this.perIdentity.set(who, left);
    };
  }
}
