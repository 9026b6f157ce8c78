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
const ALONE = [
  'test/lab/**/*.test.ts',
  'test/faults/**/*.test.ts',
  'test/e2e/**/*.test.ts',
  'test/scale/**/*.test.ts',
  'test/package/image.test.ts',
  'test/package/deb.test.ts',
  'test/package/tryit-pack.test.ts',
];

/**
 * What `npm run test:unit` leaves out besides ALONE, for the inner loop: the packaging tests
 * (npm pack and installs under five Node.js releases), the benchmarks' and the fuzzers' tests,
 * and the files that start other programs or run for many seconds (Prometheus, promtool, the
 * built CLI, the stand-in Kubernetes API). `npm test` runs everything.
 */
const SLOW = [
  'test/package/**/*.test.ts',
  'test/bench/**/*.test.ts',
  'test/fuzz/**/*.test.ts',
  'test/controller/kubernetes-job-end.test.ts',
  'test/cli/detect-suspects.test.ts',
  'test/security/controller-start.test.ts',
  'test/cli/main.test.ts',
  'test/controller/progress-prometheus.test.ts',
  'test/analyzers/multisignal/silence.test.ts',
  'test/analyzers/multisignal/source.test.ts',
  'test/rules.test.ts',
  'test/controller/progress.test.ts',
  'test/cli/agent-nvml-hang.test.ts',
  'test/controller/unavailable.test.ts',
  'test/controller/intake/world-api.test.ts',
];

const shared = {
  globalSetup: ['test/support/global-redis.ts'],
  testTimeout: 30_000,
  hookTimeout: 60_000,
};

// `npm run test:unit` (STEADFAST_TESTS=unit): ALONE and SLOW left out, and the files of one worker
// share its module cache (isolate: false) for about two minutes instead of four; the full run
// isolates every file, so a test that leaks state into the next shows up in one of the two.
const unitOnly = process.env.STEADFAST_TESTS === 'unit';

const projects: TestProjectInlineConfiguration[] = unitOnly
  ? [{ extends: true, test: { ...shared, name: 'unit', include: ['test/**/*.test.ts'], exclude: [...ALONE, ...SLOW], maxWorkers: 2, isolate: false } }]
  : [
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
