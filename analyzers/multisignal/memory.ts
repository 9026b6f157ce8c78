/**
 * What the multi-signal detector remembers between evaluations (analyzers/multisignal/detector.ts): each
 * node's own normal relative to its peers, and each node's recent verdicts.
 *
 * A node that always runs a few degrees warmer than its peers (a hotter slot, a fan curve, a
 * different board revision) is unlike them every minute of its life; scored on the peers alone it
 * is flagged again and again, and it drowns the one that is changing. So per node, feature and
 * device the detector keeps the peer z it usually has: the median of samples taken every
 * `everyMs` over the last `samples × everyMs` (6 hours by default). A median of hours moves only
 * when more than half of that time changed, so a precursor of tens of minutes stays visible
 * against it while a lasting offset is learnt. Samples are not taken while the node is raised or
 * anomalous (once learnt), nor in a moment its whole group moved (a job-wide phase).
 */

export interface BaselineSettings {
  readonly everyMs: number;
  readonly samples: number;
  readonly minSamples: number;
}

interface Ring {
  readonly values: Float64Array;
  count: number;
  next: number;
  lastAt: number;
  usual: number;
}

export interface Baselines {
  /** The node's usual peer z on this device key; 0 until minSamples samples were taken. */
  usual(node: string, key: string): number;
}

export class NodeBaselines implements Baselines {
  private readonly rings = new Map<string, Map<string, Ring>>();

  constructor(private readonly settings: BaselineSettings) {}

  usual(node: string, key: string): number {
    const ring = this.rings.get(node)?.get(key);
    return ring && ring.count >= this.settings.minSamples ? ring.usual : 0;
  }

  /** Whether the node has a learnt normal for at least one device key. */
  learnt(node: string): boolean {
    for (const ring of this.rings.get(node)?.values() ?? []) if (ring.count >= this.settings.minSamples) return true;
    return false;
  }

  /** Offers this moment's peer z values of a node; taken when the last sample is everyMs old. */
  offer(node: string, time: number, peerZ: ReadonlyMap<string, number>): void {
    let byKey = this.rings.get(node);
    if (!byKey) this.rings.set(node, (byKey = new Map()));
    for (const [key, z] of peerZ) {
      let ring = byKey.get(key);
      if (!ring) byKey.set(key, (ring = { values: new Float64Array(this.settings.samples), count: 0, next: 0, lastAt: Number.NEGATIVE_INFINITY, usual: 0 }));
      if (time - ring.lastAt < this.settings.everyMs) continue;
      ring.values[ring.next] = z;
      ring.next = (ring.next + 1) % ring.values.length;
      ring.count = Math.min(ring.count + 1, ring.values.length);
      ring.lastAt = time;
      const sorted = ring.values.slice(0, ring.count).sort();
      const middle = sorted.length >> 1;
      ring.usual = sorted.length % 2 === 1 ? (sorted[middle] as number) : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
    }
  }

  /** Forgets nodes not offered for `olderThanMs` (gone from the fleet). */
  prune(time: number, olderThanMs: number): void {
    for (const [node, byKey] of this.rings) {
      let newest = Number.NEGATIVE_INFINITY;
      for (const ring of byKey.values()) newest = Math.max(newest, ring.lastAt);
      if (time - newest > olderThanMs) this.rings.delete(node);
    }
  }
}

/** A node's recent verdicts, newest last, at most `length`. */
export class VerdictRing {
  private readonly marks: Uint8Array;
  private readonly times: Float64Array;
  private next = 0;
  private size = 0;

  constructor(length: number) {
    this.marks = new Uint8Array(length);
    this.times = new Float64Array(length);
  }

  get length(): number {
    return this.size;
  }

  lastTime(): number | undefined {
    return this.size === 0 ? undefined : this.times[(this.next - 1 + this.marks.length) % this.marks.length];
  }

  /** Adds a verdict; one at the same time as the last replaces it (a retried evaluation counts once). */
  push(time: number, anomalous: boolean): void {
    if (this.lastTime() === time) this.next = (this.next - 1 + this.marks.length) % this.marks.length;
    else this.size = Math.min(this.size + 1, this.marks.length);
    this.marks[this.next] = anomalous ? 1 : 0;
    this.times[this.next] = time;
    this.next = (this.next + 1) % this.marks.length;
  }

  /** Anomalous verdicts among the newest `last`. */
  count(last: number): number {
    let total = 0;
    for (let back = 1; back <= Math.min(last, this.size); back += 1) total += this.marks[(this.next - back + this.marks.length) % this.marks.length] as number;
    return total;
  }

  /** Separate runs of anomalous verdicts among the newest `last`. */
  episodes(last: number): number {
    let runs = 0;
    let previous = 0;
    for (let back = Math.min(last, this.size); back >= 1; back -= 1) {
      const mark = this.marks[(this.next - back + this.marks.length) % this.marks.length] as number;
      if (mark === 1 && previous === 0) runs += 1;
      previous = mark;
    }
    return runs;
  }
}
