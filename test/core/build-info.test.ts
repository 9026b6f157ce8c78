import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import { readBuildInfo, registerBuildInfo } from '../../core/build-info.js';

const roots: string[] = [];
afterEach(() => {
  for (const root of roots.splice(0)) rmSync(root, { recursive: true, force: true });
});

function packageRoot(revision?: string): string {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-build-'));
  roots.push(root);
  writeFileSync(join(root, 'package.json'), JSON.stringify({ name: 'steadfast', version: '1.2.3' }));
  if (revision !== undefined) writeFileSync(join(root, 'REVISION'), revision);
  return root;
}

describe('steadfast_build_info', () => {
  it('carries the version, the revision from a REVISION file and the Node.js version', async () => {
    const registry = new Registry();
    registerBuildInfo(registry, readBuildInfo(packageRoot('0123456789abcdef0123456789abcdef01234567\n')));
    expect(await registry.metrics()).toContain(
      `steadfast_build_info{version="1.2.3",nodejs="${process.versions.node}",revision="0123456789abcdef0123456789abcdef01234567"} 1`,
    );
  });

  it('leaves the revision out when there is no REVISION file or it holds no commit id', () => {
    expect(readBuildInfo(packageRoot()).revision).toBeUndefined();
    expect(readBuildInfo(packageRoot('main; rm -rf /')).revision).toBeUndefined();
    expect(readBuildInfo(packageRoot()).version).toBe('1.2.3');
  });
});
