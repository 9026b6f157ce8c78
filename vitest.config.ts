import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/support/global-redis.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // Two cores: end-to-end files start real Prometheus, Alertmanager and slurmctld processes.
    maxWorkers: 2,
  },
});
