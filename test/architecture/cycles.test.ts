import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { CYCLE_FOLDERS, importCircles, importGraph } from './cycles.js';

const REPO = resolve(import.meta.dirname, '../..');

describe('import circles between files', () => {
  const trees: string[] = [];
  afterEach(() => {
    for (const tree of trees.splice(0)) rmSync(tree, { recursive: true, force: true });
  });

  function tree(files: Record<string, string>): string {
    const root = mkdtempSync(join(tmpdir(), 'steadfast-cycles-'));
    trees.push(root);
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(dirname(join(root, path)), { recursive: true });
      writeFileSync(join(root, path), text);
    }
    return root;
  }

  it('there are none in the product folders and the benchmarks, type-only imports included', () => {
    const graph = importGraph(REPO, CYCLE_FOLDERS);
    expect(graph.size).toBeGreaterThan(100);
    expect(importCircles(graph)).toEqual([]);
  });

  it('are found through `import type`, re-exports, import() and folder index files, each circle once', () => {
    const root = tree({
      'a/x.ts': "import type { Y } from './y.js';\nexport type X = Y;\n",
      'a/y.ts': "export { z } from '../b/index.js';\nexport type Y = number;\n",
      'b/index.ts': "export const z = () => import('../a/x.js');\n",
      'b/alone.ts': "import { z } from './index.js';\nimport { readFileSync } from 'node:fs';\nexport const w = [z, readFileSync];\n",
      'b/self.ts': "export * from './self.js';\n",
    });
    expect(importCircles(importGraph(root, ['a', 'b']))).toEqual([['a/x.ts', 'a/y.ts', 'b/index.ts'], ['b/self.ts']]);
  });
});
