import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

/**
 * The packages are released together under one version: the controller's (package.json), the
 * agent's and the try-it tools' manifests, the Debian changelog and CHANGELOG.md's newest entry
 * all name it, so a release tag `vVERSION` says what every artifact built from it is.
 */
const ROOT = join(import.meta.dirname, '..');
const versionOf = (path: string): string => (JSON.parse(readFileSync(join(ROOT, path), 'utf8')) as { version: string }).version;

describe('the release version', () => {
  const version = versionOf('package.json');

  it('is the version of the agent and try-it packages too', () => {
    expect(versionOf('agent/package.json')).toBe(version);
    expect(versionOf('tryit/package.json')).toBe(version);
  });

  it("heads CHANGELOG.md and the Debian packages' changelog", () => {
    // The newest released entry: an `Unreleased` section above it gathers what main adds since.
    const newest = /^## (?!Unreleased\b)(\S+)/m.exec(readFileSync(join(ROOT, 'CHANGELOG.md'), 'utf8'))?.[1];
    expect(newest).toBe(version);
    const debian = /^steadfast \(([^)-]+)-\d+\)/.exec(readFileSync(join(ROOT, 'packaging', 'debian', 'changelog'), 'utf8'))?.[1];
    expect(debian).toBe(version);
  });
});
