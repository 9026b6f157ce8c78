import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../core/config.js';
import { InputError } from '../../core/errors.js';
import { matchProfile, profileRemedies, profilesSchema } from '../../core/profiles.js';
import { remediesSchema } from '../../core/remedy-config.js';
import { profileResolverFor } from '../../controller/profile-resolver.js';

const dir = mkdtempSync(join(tmpdir(), 'steadfast-profiles-'));
function configFile(text: string): string {
  const path = join(dir, `config-${Math.random().toString(36).slice(2)}.yaml`);
  writeFileSync(path, text);
  return path;
}

/** The error loadConfig throws for `yaml`, as the operator reads it. */
function refusal(yaml: string): InputError {
  try {
    loadConfig({ file: configFile(yaml), env: {} });
  } catch (error) {
    if (error instanceof InputError) return error;
    throw error;
  }
  throw new Error('the configuration was accepted');
}

const FLEET = `
remedies:
  reboot:
    enabled: true
profiles:
  - name: h100-train
    match:
      partitions: [train]
    safety:
      maxDrainsPerWindow: 2
    remedies:
      reboot: false
  - name: inference
    match:
      nodeLabels:
        node.example.com/pool: inference
    remedies:
      gpuReset: true
  - name: burn-in
    match:
      nodes: [bi-01, bi-02]
    dryRun: true
`;

describe('the profiles section of the configuration', () => {
  it('has no profiles by default: every node keeps the global settings', () => {
    expect(loadConfig({ env: {} }).profiles).toEqual([]);
    expect(profileResolverFor([], {})).toBeUndefined();
  });

  it('reads profiles matched by partition, by label and by name, each with its own settings', () => {
    const config = loadConfig({ file: configFile(FLEET), env: {} });
    expect(config.profiles.map((profile) => profile.name)).toEqual(['h100-train', 'inference', 'burn-in']);
    expect(config.profiles[0]).toEqual({
      name: 'h100-train',
      match: { partitions: ['train'] },
      safety: { maxDrainsPerWindow: 2 },
      remedies: { reboot: false },
    });
    expect(config.profiles[2]?.dryRun).toBe(true);
  });

  it('refuses a profile that matches nothing, names a node twice across profiles, or repeats a name, naming the key', () => {
    expect(refusal('profiles:\n  - name: empty\n    match: {}\n').message).toBe(
      'invalid config: profiles.0.match.nodes: must name nodes, partitions or nodeLabels',
    );
    const twice = refusal('profiles:\n  - name: a\n    match: {nodes: [n1, n2]}\n  - name: b\n    match: {nodes: [n3, n2]}\n');
    expect(twice.message).toBe('invalid config: profiles.1.match.nodes: node "n2" is in profiles "a" and "b"');
    expect(twice.field).toBe('profiles.1.match.nodes');
    expect(refusal('profiles:\n  - name: a\n    match: {nodes: [n1]}\n  - name: a\n    match: {nodes: [n2]}\n').message).toBe(
      'invalid config: profiles.1.name: profile name "a" is used twice',
    );
  });

  it('refuses unknown keys, a partition that could become an option, a bad label, a bad name and a negative budget', () => {
    expect(refusal('profiles:\n  - name: a\n    match: {nodes: [n1]}\n    dryrun: true\n').message).toMatch(
      /^invalid config: profiles\.0: Unrecognized key: "dryrun"/,
    );
    expect(refusal('profiles:\n  - name: a\n    match: {partitions: ["--all"]}\n').message).toMatch(
      /profiles\.0\.match\.partitions\.0: a Slurm partition name/,
    );
    expect(refusal('profiles:\n  - name: a\n    match: {nodeLabels: {"pool": "in ference"}}\n').message).toMatch(
      /profiles\.0\.match\.nodeLabels\.pool: a Kubernetes label value/,
    );
    expect(refusal('profiles:\n  - name: "a b"\n    match: {nodes: [n1]}\n').message).toMatch(/profiles\.0\.name: letters, digits/);
    expect(refusal('profiles:\n  - name: a\n    match: {nodes: [n1]}\n    safety: {maxDrainsPerWindow: -1}\n').message).toMatch(
      /profiles\.0\.safety\.maxDrainsPerWindow/,
    );
    expect(refusal('profiles:\n  - name: a\n    match: {nodes: [n1]}\n    remedies: {reboot: maybe}\n').message).toMatch(/profiles\.0\.remedies\.reboot/);
  });

  it('refuses, when the controller starts, profiles its backend cannot match: partitions without Slurm, labels without Kubernetes', () => {
    const config = loadConfig({ file: configFile(FLEET), env: {} });
    const noPartitions = (() => {
      try {
        profileResolverFor(config.profiles, { nodeLabels: async () => ({}) });
      } catch (error) {
        return error;
      }
      return undefined;
    })();
    expect(noPartitions).toBeInstanceOf(InputError);
    expect((noPartitions as InputError).field).toBe('profiles.0.match.partitions');
    expect(() => profileResolverFor(config.profiles, { partitionNodes: async () => [] })).toThrow(
      /^profiles\.1\.match\.nodeLabels: profile "inference" matches Kubernetes node labels, which only the Kubernetes backend reads/,
    );
  });

  it('matches a node to one profile, none, or a conflict naming every profile that matches it', () => {
    const profiles = profilesSchema.parse([
      { name: 'train', match: { partitions: ['train'] } },
      { name: 'rack9', match: { partitions: ['rack9'] } },
      { name: 'inference', match: { nodeLabels: { pool: 'inference', gpu: 'h100' } } },
    ]);
    expect(matchProfile(profiles, 'n1', { partitions: new Set(['train', 'gpu']) })).toMatchObject({ kind: 'profile', profile: { name: 'train' } });
    expect(matchProfile(profiles, 'n2', { partitions: new Set(['train', 'rack9']) })).toEqual({ kind: 'conflict', profiles: ['train', 'rack9'] });
    // Every label must match.
    expect(matchProfile(profiles, 'n3', { labels: { pool: 'inference' } })).toEqual({ kind: 'none' });
    expect(matchProfile(profiles, 'n3', { labels: { pool: 'inference', gpu: 'h100', zone: 'a' } })).toMatchObject({ kind: 'profile' });
  });

  it("lays a profile's rung switches over the global remedies and leaves the rest as configured", () => {
    const global = remediesSchema.parse({ reboot: { enabled: true, nextState: 'down' } });
    const [profile] = profilesSchema.parse([{ name: 'p', match: { nodes: ['n1'] }, remedies: { reboot: false, gpuReset: true } }]);
    const own = profileRemedies(global, profile);
    expect(own.reboot).toEqual({ enabled: false, nextState: 'down' });
    expect(own.gpuReset.enabled).toBe(true);
    expect(own.escalation).toBe(global.escalation);
    expect(profileRemedies(global, undefined)).toBe(global);
  });
});
