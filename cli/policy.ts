import { Command } from 'commander';
import { loadConfig } from '../core/config.js';
import { profileXidLayer, type Profile } from '../core/profiles.js';
import { configurationLayers, effectiveTable, type EffectiveRow, type PolicyLayer } from '../core/xid-policy.js';
import { printableJson, runCommand } from './common.js';

/**
 * `steadfast policy`: what the controller does about each Xid and SXid code with this
 * configuration, and which layer says so (the catalogue, the configuration's `xidPolicy`, a
 * node-group profile's), so an operator can read the result of their overrides before a fault
 * does; then each profile: how it matches nodes, what else it sets, and its nodes' own table.
 * Reads the config only (which nodes a partition or label holds is the scheduler's to say); a
 * bad one exits 2 naming the key.
 */

/** A profile as the command prints it: its match and settings, and the tables its nodes get. */
function describeProfile(profile: Profile, layers: readonly PolicyLayer[]) {
  const own = profileXidLayer(profile);
  const table = effectiveTable(own === undefined ? layers : [...layers, own]);
  return {
    name: profile.name,
    match: profile.match,
    dryRun: profile.dryRun ?? false,
    ...(profile.safety === undefined ? {} : { safety: profile.safety }),
    ...(profile.remedies === undefined ? {} : { remedies: profile.remedies }),
    xid: table.xid,
    sxid: table.sxid,
  };
}

function printProfile(profile: ReturnType<typeof describeProfile>): string {
  const match = Object.entries(profile.match)
    .map(([key, value]) => `${key} ${JSON.stringify(value)}`)
    .join(', ');
  const settings = [
    profile.dryRun ? 'dry-run' : '',
    profile.safety ? `budget ${JSON.stringify(profile.safety)}` : '',
    profile.remedies ? `rungs ${JSON.stringify(profile.remedies)}` : '',
  ].filter(Boolean);
  const own = [...profile.xid, ...profile.sxid].filter((row) => row.source.startsWith('profile '));
  const rules = own.map((row) => `    ${row.kind === 'xid' ? 'Xid' : 'SXid'} ${row.code}: ${describeAction(row)}`);
  return [`profile ${profile.name}: ${match}${settings.length > 0 ? `; ${settings.join('; ')}` : ''}`, ...rules].join('\n');
}

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
        const layers = configurationLayers(config.xidPolicy);
        const table = effectiveTable(layers);
        const profiles = config.profiles.map((profile) => describeProfile(profile, layers));
        if (options.json) {
          process.stdout.write(`${printableJson({ xid: table.xid, sxid: table.sxid, profiles }, 2)}\n`);
          return;
        }
        process.stdout.write(
          `${printTable('Xid', table.xid, 'any other Xid: observe (catalogue)')}\n\n${printTable('SXid', table.sxid, 'any other SXid: by message: Fatal drains, Non-fatal is observed (catalogue)')}\n`,
        );
        if (profiles.length > 0) process.stdout.write(`\n${profiles.map(printProfile).join('\n')}\n`);
      });
    });
}
