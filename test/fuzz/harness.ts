import fc from 'fast-check';

/**
 * Shared settings for the fuzz tests: one seed for every target, so a failure is reproduced by
 * running the file again, and a run count per target that CI can afford (about a minute for all
 * targets on two cores). `STEADFAST_FUZZ_SEED` picks another seed; `STEADFAST_FUZZ_SCALE=10`
 * tries ten times as many inputs (and allows ten times the time) for a longer local run.
 * Not a test file itself.
 */

export const FUZZ_SEED = Number(process.env.STEADFAST_FUZZ_SEED ?? 20_261_121);
const SCALE = Math.max(0.01, Number(process.env.STEADFAST_FUZZ_SCALE ?? 1));
/** How long the input in hand when the time limit strikes may still take before it counts as a hang. */
const HANG_MS = 10_000;

export interface FuzzBudget {
  /** Inputs to try. */
  readonly runs: number;
  /** Stops early (without failing) once this much time has gone, so a slow machine still finishes. */
  readonly seconds: number;
}

/** A target's budget at the current scale. */
export function budget(runs: number, seconds: number): FuzzBudget {
  return { runs: Math.max(1, Math.round(runs * SCALE)), seconds: seconds * SCALE };
}

interface TargetResult {
  readonly target: string;
  readonly inputs: number;
  readonly milliseconds: number;
  readonly outcomes: ReadonlyMap<string, number>;
}

/** What each target tried, printed as one line per target when the file ends. */
export class FuzzReport {
  private readonly results: TargetResult[] = [];

  constructor(private readonly suite: string) {}

  add(result: TargetResult): void {
    this.results.push(result);
  }

  get totalInputs(): number {
    return this.results.reduce((sum, result) => sum + result.inputs, 0);
  }

  lines(): string[] {
    return this.results.map((result) => {
      const outcomes = [...result.outcomes.entries()]
        .sort((a, b) => b[1] - a[1])
        .map(([outcome, count]) => `${outcome}×${count}`)
        .join(' ');
      return `fuzz ${this.suite} | ${result.target}: ${result.inputs} inputs, seed ${FUZZ_SEED}, ${(result.milliseconds / 1000).toFixed(1)} s${outcomes ? ` | ${outcomes}` : ''}`;
    });
  }

  print(): void {
    const total = this.results.reduce((sum, result) => sum + result.milliseconds, 0);
    console.log([...this.lines(), `fuzz ${this.suite} | total: ${this.totalInputs} inputs in ${(total / 1000).toFixed(1)} s`].join('\n'));
  }
}

/**
 * Runs `check` on inputs from `arbitrary` under the seed and budget, counting the inputs tried
 * and the outcome label each check returns (an HTTP status, "refused (InputError)", …). A failing
 * check fails the test with fast-check's counterexample and the seed to replay it.
 */
export async function fuzz<T>(
  report: FuzzReport,
  target: string,
  arbitrary: fc.Arbitrary<T>,
  check: (input: T) => Promise<string> | string,
  limits: FuzzBudget,
): Promise<void> {
  const outcomes = new Map<string, number>();
  let inputs = 0;
  // The time limit ends the run without waiting for the input in hand; that one still has to
  // pass, and must finish within HANG_MS, or it counts as a hang.
  const state: { running?: { input: T; done: Promise<unknown> } | undefined } = {};
  const started = performance.now();
  try {
    await fc.assert(
      fc.asyncProperty(arbitrary, async (input) => {
        inputs += 1;
        const done = Promise.resolve().then(() => check(input));
        state.running = { input, done };
        const outcome = await done;
        state.running = undefined;
        outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
      }),
      {
        seed: FUZZ_SEED,
        numRuns: limits.runs,
        interruptAfterTimeLimit: limits.seconds * 1000,
        markInterruptAsFailure: false,
      },
    );
    const last = state.running;
    if (last !== undefined) {
      let timer: NodeJS.Timeout | undefined;
      const hung = new Promise<'hung'>((resolve) => {
        timer = setTimeout(() => resolve('hung'), HANG_MS);
      });
      try {
        const settled = await Promise.race([last.done, hung]);
        if (settled === 'hung') {
          throw new Error(
            `${target}: an input was still being handled ${HANG_MS / 1000} s after the time limit (seed ${FUZZ_SEED}): ${String(JSON.stringify(last.input)).slice(0, 500)}`,
          );
        }
        outcomes.set(String(settled), (outcomes.get(String(settled)) ?? 0) + 1);
      } finally {
        clearTimeout(timer);
      }
    }
  } finally {
    report.add({ target, inputs, milliseconds: performance.now() - started, outcomes });
  }
}

/** Watches the process for what the tests must never cause: a rejection nobody handles, an exception nobody catches. */
export function watchProcess(): { problems: string[]; stop: () => void } {
  const problems: string[] = [];
  const onRejection = (reason: unknown): void => {
    problems.push(`unhandled rejection: ${reason instanceof Error ? (reason.stack ?? reason.message) : String(reason)}`);
  };
  const onException = (error: Error): void => {
    problems.push(`uncaught exception: ${error.stack ?? error.message}`);
  };
  process.on('unhandledRejection', onRejection);
  process.on('uncaughtException', onException);
  return {
    problems,
    stop: () => {
      process.off('unhandledRejection', onRejection);
      process.off('uncaughtException', onException);
    },
  };
}
