import { Command } from 'commander';
import { loadConfig } from '../core/config.js';
import { configurationLayers, effectiveTable, type EffectiveRow } from '../core/xid-policy.js';
import { printableJson, runCommand } from './common.js';

/**
 * `steadfast policy`: what the controller does about each Xid and SXid code with this
 * configuration, and which layer says so (the catalogue, the configuration's `xidPolicy`), so an
 * operator can read the result of their overrides before a fault does. Reads the config only;
 * a bad one exits 2 naming the key.
 */

function describeAction(row: EffectiveRow): string {
  return row.count > 1 ? `${row.action} at ${row.count} within ${row.windowSeconds ?? '?'} s` : row.action;
}

function printTable(title: string, rows: readonly EffectiveRow[], fallback: string): string {
  const lines = rows.map((row) => `  ${String(row.code).padStart(6)}  ${describeAction(row).padEnd(30)} ${row.source.padEnd(14)} ${row.meaning}`);
  return [`${title}:`, `  ${'code'.padStart(6)}  ${'action'.padEnd(30)} ${'source'.padEnd(14)} meaning`, ...lines, `  ${fallback}`].join('\n');
}

export function policyCommand(): Command {
  return new Command('policy')
    .description(
      "Print what steadfast does about each Xid and SXid code with this configuration, and whether the catalogue or the configuration's xidPolicy says so.",
    )
    .option('-c, --config <file>', 'config file (YAML), as the controller reads it')
    .option('--json', 'print {xid, sxid, profiles} as JSON')
    .action(async (options: { config?: string; json?: boolean }) => {
      await runCommand(async () => {
        const config = loadConfig({ file: options.config });
        const table = effectiveTable(configurationLayers(config.xidPolicy));
        if (options.json) {
          // Node-group profiles will add their own tables here.
          process.stdout.write(`${printableJson({ xid: table.xid, sxid: table.sxid, profiles: [] }, 2)}\n`);
          return;
        }
        process.stdout.write(
          `${printTable('Xid', table.xid, 'any other Xid: observe (catalogue)')}\n\n${printTable('SXid', table.sxid, 'any other SXid: by message: Fatal drains, Non-fatal is observed (catalogue)')}\n`,
        );
      });
    });
}
