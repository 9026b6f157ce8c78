import { relative } from 'node:path';
import type { Reporter, TestModule } from 'vitest/node';

/**
 * Prints every test file's duration after the run, slowest first, with the pool it ran in and
 * each pool's total: where the suite's time goes, and which file grew, without a rerun.
 */
export default class DurationsReporter implements Reporter {
  onTestRunEnd(modules: ReadonlyArray<TestModule>): void {
    if (modules.length === 0) return;
    const rows = modules
      .map((module) => ({ file: relative(process.cwd(), module.moduleId), pool: module.project.name, ms: module.diagnostic().duration, state: module.state() }))
      .sort((a, b) => b.ms - a.ms);
    const totals = new Map<string, number>();
    for (const row of rows) totals.set(row.pool, (totals.get(row.pool) ?? 0) + row.ms);
    const lines = ['', `test file durations (${rows.length} files, slowest first):`];
    for (const row of rows)
      lines.push(`  ${(row.ms / 1000).toFixed(1).padStart(7)} s  ${row.pool.padEnd(8)}  ${row.file}${row.state === 'passed' ? '' : `  [${row.state}]`}`);
    lines.push(`  pools: ${[...totals].map(([pool, ms]) => `${pool} ${(ms / 1000).toFixed(0)} s`).join(', ')}`);
    process.stdout.write(`${lines.join('\n')}\n`);
  }
}
