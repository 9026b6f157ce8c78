import { Command } from 'commander';
import { loadConfig } from '../core/config.js';
import { profileRemedies, profileXidLayer, type Profile } from '../core/profiles.js';
import type { RemediesConfig } from '../core/remedy-config.js';
import { configurationLayers, effectiveTable, type EffectiveRow, type PolicyLayer } from '../core/xid-policy.js';
import { printableJson, runCommand } from './common.js';

/**
 * `steadfast policy`: what the controller does about each Xid and SXid code with this
 * configuration, and which layer says so (the catalogue, the configuration's `xidPolicy`, a
 * node-group profile's), so an operator can read the result of their overrides before a fault
 * does; then each profile: how it matches nodes, what else it sets, and its nodes' own table.
 * Reads the config only (which nodes a partition or label holds is the scheduler's to say); a
 * bad one exits 2 naming the key. A row whose action is a rung the configuration (or the profile)
 * turned off says what the node ladder takes instead (`takes: drain`).
 */

/** A row with what the node ladder takes for it where a rung it names is off: `reset` with GPU resets off drains. */
type PrintedRow = EffectiveRow & { readonly takes?: 'drain' };

function withRungs(rows: readonly EffectiveRow[], remedies: RemediesConfig, handOff: boolean): PrintedRow[] {
  return rows.map((row) => {
    const off =
      (row.action === 'reset' && !remedies.gpuReset.enabled) ||
      (row.action === 'reboot' && !remedies.reboot.enabled) ||
      (row.action === 'hand_off' && !handOff);
    return off ? { ...row, takes: 'drain' } : row;
  });
}

/** The Xid and SXid tables for one set of layers and rungs. */
function tables(layers: readonly PolicyLayer[], remedies: RemediesConfig, handOff = true): { xid: PrintedRow[]; sxid: PrintedRow[] } {
  const table = effectiveTable(layers);
  return { xid: withRungs(table.xid, remedies, handOff), sxid: withRungs(table.sxid, remedies, handOff) };
}

/** A profile as the command prints it: its match and settings, and the tables its nodes get. */
function describeProfile(profile: Profile, layers: readonly PolicyLayer[], remedies: RemediesConfig) {
  const own = profileXidLayer(profile);
  const table = tables(own === undefined ? layers : [...layers, own], profileRemedies(remedies, profile), profile.remedies?.handOff !== false);
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

function describeAction(row: PrintedRow): string {
  const action = row.takes === undefined ? row.action : `${row.action} (rung off: ${row.takes})`;
  return row.count > 1 ? `${action} at ${row.count} within ${row.windowSeconds ?? '?'} s` : action;
}

function printTable(title: string, rows: readonly PrintedRow[], fallback: string): string {
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
        const table = tables(layers, config.remedies);
        const profiles = config.profiles.map((profile) => describeProfile(profile, layers, config.remedies));
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
