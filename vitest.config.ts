import { defineConfig, type TestProjectInlineConfiguration } from 'vitest/config';

/**
 * Files that start many real processes and kill or wait on them: the lab (real slurmd, PyTorch
 * ranks), the fault tests (Redis failover and restarts, controller crashes), the end-to-end spine
 * and the 256-node scale test; and the container image build (a Debian root, two images
 * compressed) and the Debian packages' test (built, linted, installed into a Debian root), which
 * would slow every file beside them. They run one at a time, after the rest,
 * with nothing beside them: on two cores their deadlines are then set by what they wait for, not
 * by whichever file shares the machine with them.
 */
const ALONE = ['test/lab/**/*.test.ts', 'test/faults/**/*.test.ts', 'test/e2e/**/*.test.ts', 'test/scale/**/*.test.ts', 'test/package/image.test.ts', 'test/package/deb.test.ts', 'test/package/tryit-pack.test.ts'];

const shared = {
  globalSetup: ['test/support/global-redis.ts'],
  testTimeout: 30_000,
  hookTimeout: 60_000,
};

const projects: TestProjectInlineConfiguration[] = [
  // Two workers: the machine the suite is held to has two cores.
  { extends: true, test: { ...shared, name: 'parallel', include: ['test/**/*.test.ts'], exclude: ALONE, maxWorkers: 2, sequence: { groupOrder: 0 } } },
  { extends: true, test: { ...shared, name: 'alone', include: ALONE, maxWorkers: 1, sequence: { groupOrder: 1 } } },
];

export default defineConfig({
  test: {
    projects,
    // Each file's duration and pool, slowest first, after the run (test/support/durations-reporter.ts).
    reporters: ['default', './test/support/durations-reporter.ts'],
  },
});
