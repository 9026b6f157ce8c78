import { describe, expect, it } from 'vitest';
import { checkpointShardSchema, type CheckpointShard } from '../../core/checkpoint.js';
import { planRestore, planRestoreByStep, type StepCopies } from '../../actuators/restore-plan.js';

/** Two ranks on n0 and n1, each backing the other up in host memory, remote every 100 steps. */
function shardsUpTo(step: number): CheckpointShard[] {
  const shards: CheckpointShard[] = [];
  for (let s = 10; s <= step; s += 10) {
    shards.push({ step: s, rank: 0, tier: 'host', holder: 'n0' }, { step: s, rank: 0, tier: 'peer', holder: 'n1' });
    shards.push({ step: s, rank: 1, tier: 'host', holder: 'n1' }, { step: s, rank: 1, tier: 'peer', holder: 'n0' });
    if (s % 100 === 0) shards.push({ step: s, rank: 0, tier: 'remote' }, { step: s, rank: 1, tier: 'remote' });
  }
  return shards;
}

describe('restore planning', () => {
  it('resumes from the newest step with each rank loading its own host copy when nothing was evicted', () => {
    const plan = planRestore(shardsUpTo(120), {
      ranks: 2,
      evicted: new Set(),
      rankNodes: new Map([
        [0, 'n0'],
        [1, 'n1'],
      ]),
    });
    expect(plan?.step).toBe(120);
    expect(plan?.sources).toEqual([
      { rank: 0, tier: 'host', holder: 'n0', local: true },
      { rank: 1, tier: 'host', holder: 'n1', local: true },
    ]);
  });

  it('loads an evicted rank from its peer backup on the surviving node, still at the newest step', () => {
    const plan = planRestore(shardsUpTo(120), {
      ranks: 2,
      evicted: new Set(['n1']),
      rankNodes: new Map([
        [0, 'n0'],
        [1, 'standby-1'],
      ]),
    });
    expect(plan?.step).toBe(120);
    expect(plan?.sources[1]).toEqual({ rank: 1, tier: 'peer', holder: 'n0', local: false });
  });

  it('falls back to the newest remote step when both holders of a shard were evicted, and lists what it skipped', () => {
    const plan = planRestore(shardsUpTo(120), {
      ranks: 2,
      evicted: new Set(['n0', 'n1']),
      rankNodes: new Map([
        [0, 's0'],
        [1, 's1'],
      ]),
    });
    expect(plan?.step).toBe(100);
    expect(plan?.sources.every((source) => source.tier === 'remote')).toBe(true);
    expect(plan?.skipped.map((skip) => skip.step)).toEqual([120, 110]);
  });

  it('finds no plan when no step is complete', () => {
    const shards: CheckpointShard[] = [{ step: 5, rank: 0, tier: 'host', holder: 'n0' }];
    expect(planRestore(shards, { ranks: 2, evicted: new Set(), rankNodes: new Map() })).toBeUndefined();
  });

  it('reads each copy a bounded number of times, however many ranks the step has (the plan is linear, not copies × ranks)', () => {
    const ranks = 2000;
    let reads = 0;
    // Every field read of every copy is counted.
    const counted = (shard: CheckpointShard): CheckpointShard =>
      new Proxy(shard, {
        get(target, field, receiver) {
          reads += 1;
          return Reflect.get(target, field, receiver) as unknown;
        },
      });
    const shards = Array.from({ length: ranks }, (_, rank) => [
      counted({ step: 10, rank, tier: 'host', holder: `n${rank}` }),
      counted({ step: 10, rank, tier: 'peer', holder: `n${(rank + 1) % ranks}` }),
    ]).flat();
    const rankNodes = new Map(Array.from({ length: ranks }, (_, rank) => [rank, `n${rank}`] as const));
    const plan = planRestore(shards, { ranks, evicted: new Set(['n0']), rankNodes });
    expect(plan?.step).toBe(10);
    expect(plan?.sources[0]).toEqual({ rank: 0, tier: 'peer', holder: 'n1', local: false });
    expect(reads).toBeLessThanOrEqual(16 * shards.length);
  });

  it('plans steps read in chunks, newest first, asking once about each holder, as the controller reads them from the job store', async () => {
    async function* chunks(): AsyncGenerator<StepCopies> {
      // Step 20 in two chunks: rank 1's only surviving copy comes in the second.
      yield {
        step: 20,
        copies: [
          { step: 20, rank: 0, tier: 'host', holder: 'n0' },
          { step: 20, rank: 1, tier: 'host', holder: 'n1' },
        ],
      };
      yield { step: 20, copies: [{ step: 20, rank: 1, tier: 'peer', holder: 'n0' }] };
      yield {
        step: 10,
        copies: [
          { step: 10, rank: 0, tier: 'remote' },
          { step: 10, rank: 1, tier: 'remote' },
        ],
      };
    }
    const asked: string[][] = [];
    const lost = async (holders: readonly string[]): Promise<string[]> => {
      asked.push([...holders]);
      return holders.filter((holder) => holder === 'n1');
    };
    const rankNodes = new Map([
      [0, 'n0'],
      [1, 's1'],
    ]);
    const { plan, stepsRead } = await planRestoreByStep(chunks(), { ranks: 2, rankNodes }, lost);
    expect(stepsRead).toBe(1);
    expect(plan).toEqual({
      step: 20,
      skipped: [],
      sources: [
        { rank: 0, tier: 'host', holder: 'n0', local: true },
        { rank: 1, tier: 'peer', holder: 'n0', local: false },
      ],
    });
    expect(asked).toEqual([['n0', 'n1']]);

    // With n0 lost too, step 20 is incomplete and the remote step 10 is used.
    const both = await planRestoreByStep(chunks(), { ranks: 2, rankNodes }, async (holders) => holders);
    expect(both).toEqual({
      stepsRead: 2,
      plan: {
        step: 10,
        skipped: [{ step: 20, missingRank: 0 }],
        sources: [
          { rank: 0, tier: 'remote', holder: undefined, local: false },
          { rank: 1, tier: 'remote', holder: undefined, local: false },
        ],
      },
    });
  });

  it('requires a holder for every copy that is not remote, naming the field', () => {
    const result = checkpointShardSchema.safeParse({ step: 1, rank: 0, tier: 'host' });
    expect(result.success).toBe(false);
    expect(result.error?.issues[0]?.path).toEqual(['holder']);
  });
});
