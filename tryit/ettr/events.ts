/**
 * The event queue of the ETTR simulation: a binary min-heap on time, ties broken by insertion
 * order so a run never depends on how the heap happens to settle. Each entry is a callback; a run
 * is deterministic as long as the callbacks only draw randomness that was fixed in advance.
 */

interface Entry {
  readonly time: number;
  readonly seq: number;
  readonly run: () => void;
}

export class EventQueue {
  private readonly heap: Entry[] = [];
  private seq = 0;

  get size(): number {
    return this.heap.length;
  }

  /** The time of the next event, or Infinity when none is queued. */
  peekTime(): number {
    return this.heap[0]?.time ?? Infinity;
  }

  schedule(time: number, run: () => void): void {
    if (!Number.isFinite(time)) throw new Error(`event scheduled at a non-finite time (${time})`);
    this.heap.push({ time, seq: this.seq, run });
    this.seq += 1;
    this.up(this.heap.length - 1);
  }

  /** Removes the next event and returns it; undefined when the queue is empty. */
  pop(): { time: number; run: () => void } | undefined {
    const top = this.heap[0];
    if (top === undefined) return undefined;
    const last = this.heap.pop() as Entry;
    if (this.heap.length > 0) {
      this.heap[0] = last;
      this.down(0);
    }
    return top;
  }

  private before(a: Entry, b: Entry): boolean {
    return a.time < b.time || (a.time === b.time && a.seq < b.seq);
  }

  private up(index: number): void {
    let child = index;
    while (child > 0) {
      const parent = (child - 1) >> 1;
      const c = this.heap[child] as Entry;
      const p = this.heap[parent] as Entry;
      if (!this.before(c, p)) return;
      this.heap[child] = p;
      this.heap[parent] = c;
      child = parent;
    }
  }

  private down(index: number): void {
    let parent = index;
    for (;;) {
      const left = parent * 2 + 1;
      const right = left + 1;
      let best = parent;
      if (left < this.heap.length && this.before(this.heap[left] as Entry, this.heap[best] as Entry)) best = left;
      if (right < this.heap.length && this.before(this.heap[right] as Entry, this.heap[best] as Entry)) best = right;
      if (best === parent) return;
      const p = this.heap[parent] as Entry;
      this.heap[parent] = this.heap[best] as Entry;
      this.heap[best] = p;
      parent = best;
    }
  }
}

/** A callback of the share of [start, end] reached, called at most once per percent as time moves on; a no-op without one. */
export function percentReporter(start: number, end: number, report?: (fraction: number) => void): (now: number) => void {
  let last = -1;
  return (now) => {
    if (report === undefined) return;
    const percent = Math.floor(((now - start) / (end - start)) * 100);
    if (percent <= last) return;
    last = percent;
    report(percent / 100);
  };
}
