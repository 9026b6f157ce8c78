/**
 * The machines of the simulated job, in rank order. An evicted machine leaves the job and a spare
 * takes its slot (rank), so a culprit that was evicted is gone for good and the parallel groups
 * keep their shape.
 */
export class JobMembers {
  private readonly ranks: string[];
  /** Where each machine of the job sits in `ranks`. */
  private readonly slots = new Map<string, number>();
  private spares = 0;

  constructor(nodes: number) {
    this.ranks = Array.from({ length: nodes }, (_, i) => `node-${String(i + 1).padStart(5, '0')}`);
    this.ranks.forEach((node, slot) => this.slots.set(node, slot));
  }

  /** The machine at a uniform draw in [0, 1): where an incident strikes. */
  pick(draw: number): string {
    const slot = Math.min(this.ranks.length - 1, Math.floor(draw * this.ranks.length));
    return this.ranks[slot] as string;
  }

  has(node: string): boolean {
    return this.slots.has(node);
  }

  /**
   * Puts a fresh spare into the slot of each named machine still in the job (the i-th of `by`
   * when given: a hot swap's named spares); returns who replaced whom.
   */
  replace(nodes: readonly string[], by: readonly string[] = []): { replaced: string; by: string }[] {
    const replacements: { replaced: string; by: string }[] = [];
    for (const [index, node] of nodes.entries()) {
      const slot = this.slots.get(node);
      if (slot === undefined) continue;
      this.spares += 1;
      const spare = by[index] ?? `spare-${String(this.spares).padStart(5, '0')}`;
      this.ranks[slot] = spare;
      this.slots.delete(node);
      this.slots.set(spare, slot);
      replacements.push({ replaced: node, by: spare });
    }
    return replacements;
  }

  /**
   * The aligned group of `groupSize` machines holding `node` (§5.1: stack aggregation points at a
   * parallel group, not a machine); the first group when `node` has already left the job.
   */
  groupAround(node: string, groupSize: number): string[] {
    const size = Math.max(1, Math.min(groupSize, this.ranks.length));
    const at = this.slots.get(node) ?? 0;
    const first = Math.min(this.ranks.length - size, Math.floor(at / size) * size);
    return this.ranks.slice(first, first + size);
  }
}
