import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../core/config.js';
import { InputError } from '../../core/errors.js';
import {
  configurationLayers,
  effectiveRule,
  effectiveTable,
  fastPathCodes,
  xidPolicyLayerSchema,
  type PolicyLayer,
  type XidPolicyLayer,
} from '../../core/xid-policy.js';

const layer = (policy: unknown): XidPolicyLayer => xidPolicyLayerSchema.parse(policy);

/** The message `loadConfig` (the controller, `steadfast policy`) gives for a config file holding `xidPolicy`. */
function configError(xidPolicy: unknown): string {
  const file = join(mkdtempSync(join(tmpdir(), 'xid-policy-')), 'config.json');
  writeFileSync(file, JSON.stringify({ xidPolicy }));
  try {
    loadConfig({ file, env: {} });
  } catch (error) {
    expect(error).toBeInstanceOf(InputError);
    return (error as Error).message;
  }
  throw new Error('the config was taken');
}

describe('the xidPolicy config section', () => {
  it('is empty by default, so the catalogue alone decides', () => {
    const config = loadConfig({ env: {} });
    expect(config.xidPolicy).toEqual({ xid: {}, sxid: {} });
    expect(effectiveTable(configurationLayers(config.xidPolicy)).xid.every((row) => row.source === 'catalogue')).toBe(true);
    expect(fastPathCodes(configurationLayers(config.xidPolicy))).toEqual({ xid: [], sxid: [] });
  });

  it('refuses a key that is not a whole-number code, naming the key', () => {
    expect(configError({ xid: { '13x': { action: 'drain' } } })).toBe('invalid config: xidPolicy.xid.13x: must be a whole-number Xid code from 0 to 100000');
    expect(configError({ xid: { '100001': { action: 'drain' } } })).toBe(
      'invalid config: xidPolicy.xid.100001: must be a whole-number Xid code from 0 to 100000',
    );
    expect(configError({ sxid: { '-1': { action: 'drain' } } })).toBe('invalid config: xidPolicy.sxid.-1: must be a whole-number SXid code from 0 to 100000');
    expect(configError({ xid: { '013': { action: 'drain' } } })).toContain('must be a whole-number Xid code');
  });

  it('requires a window with a count above 1, bounds both, and takes no unknown field', () => {
    expect(configError({ xid: { '13': { action: 'drain', count: 3 } } })).toBe(
      'invalid config: xidPolicy.xid.13.windowSeconds: windowSeconds is required when count is more than 1',
    );
    expect(configError({ xid: { '13': { action: 'drain', count: 1001, windowSeconds: 60 } } })).toContain('xidPolicy.xid.13.count: ');
    expect(configError({ xid: { '13': { action: 'drain', count: 2, windowSeconds: 30 * 86400 + 1 } } })).toContain('xidPolicy.xid.13.windowSeconds: ');
    expect(configError({ xid: { '13': { action: 'drain', after: 2 } } })).toBe('invalid config: xidPolicy.xid.13: Unrecognized key: "after"');
    expect(configError({ xid: { '13': { action: 'panic' } } })).toContain('xidPolicy.xid.13.action: ');
    expect(configError({ xids: {} })).toBe('invalid config: xidPolicy: Unrecognized key: "xids"');
  });

  it('refuses a reset for an SXid: an SXid names an NVSwitch, not a GPU', () => {
    expect(configError({ sxid: { '20034': { action: 'reset' } } })).toBe(
      'invalid config: xidPolicy.sxid.20034.action: reset is not an SXid action: an SXid names an NVSwitch, not a GPU (use drain, reboot or hand_off)',
    );
    expect(layer({ sxid: { '20034': { action: 'drain' } } }).sxid['20034']).toEqual({ action: 'drain', count: 1 });
  });
});

describe('the effective table', () => {
  it("shows the catalogue's own action for every catalogued Xid, and message-decided codes as such", () => {
    const { xid, sxid } = effectiveTable([]);
    const row = (code: number) => xid.find((entry) => entry.code === code);
    expect(row(48)).toEqual({ kind: 'xid', code: 48, meaning: 'uncorrectable double-bit ECC error', action: 'reset', count: 1, source: 'catalogue' });
    expect(row(79)?.action).toBe('reboot');
    expect(row(13)?.action).toBe('observe');
    expect(row(154)?.action).toBe('by message');
    for (const code of [144, 145, 146, 147, 148, 149, 150]) expect(row(code)?.action).toBe('by message');
    expect(xid.map((entry) => entry.code)).toEqual([...xid.map((entry) => entry.code)].sort((a, b) => a - b));
    expect(sxid).toEqual([]);
  });

  it('shows each configured code with its rule and source, a code outside the catalogue included', () => {
    const layers = configurationLayers(
      layer({
        xid: { '13': { action: 'drain', count: 3, windowSeconds: 600 }, '48': { action: 'observe' }, '999': { action: 'ignore' } },
        sxid: { '20034': { action: 'hand_off' } },
      }),
    );
    const { xid, sxid } = effectiveTable(layers);
    expect(xid.find((row) => row.code === 13)).toEqual({
      kind: 'xid',
      code: 13,
      meaning: 'graphics engine exception, usually the application',
      action: 'drain',
      count: 3,
      windowSeconds: 600,
      source: 'configuration',
    });
    expect(xid.find((row) => row.code === 48)?.action).toBe('observe');
    expect(xid.find((row) => row.code === 999)).toEqual({
      kind: 'xid',
      code: 999,
      meaning: 'Xid not in the catalogue',
      action: 'ignore',
      count: 1,
      source: 'configuration',
    });
    expect(xid.find((row) => row.code === 79)?.source).toBe('catalogue');
    expect(sxid).toEqual([
      {
        kind: 'sxid',
        code: 20034,
        meaning: 'NVSwitch error, fatal or non-fatal as the kernel line says',
        action: 'hand_off',
        count: 1,
        source: 'configuration',
      },
    ]);
  });

  it('lets the later layer win per code, naming it', () => {
    const layers: PolicyLayer[] = [
      { source: 'configuration', policy: layer({ xid: { '13': { action: 'drain' }, '31': { action: 'drain' } } }) },
      { source: 'profile h100', policy: layer({ xid: { '13': { action: 'ignore' } } }) },
    ];
    expect(effectiveRule(layers, 'xid', 13)).toMatchObject({ action: 'ignore', source: 'profile h100' });
    expect(effectiveRule(layers, 'xid', 31)).toMatchObject({ action: 'drain', source: 'configuration' });
    expect(effectiveRule(layers, 'xid', 79)).toMatchObject({ action: 'reboot', source: 'catalogue' });
  });

  it('lists for the fast path the codes that act or count, beyond those the agent sends as fatal anyway', () => {
    const layers = configurationLayers(
      layer({
        xid: {
          '13': { action: 'observe', count: 2, windowSeconds: 60 },
          '31': { action: 'drain' },
          '43': { action: 'observe' },
          '45': { action: 'ignore' },
          '48': { action: 'drain' },
          '145': { action: 'drain' },
        },
        sxid: { '20034': { action: 'drain' }, '11012': { action: 'observe' } },
      }),
    );
    expect(fastPathCodes(layers)).toEqual({ xid: [13, 31, 145], sxid: [20034] });
  });
});
