import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { importViolations } from './import-rules.js';

const REPO = resolve(import.meta.dirname, '../..');

describe('the import rules between folders', () => {
  const trees: string[] = [];
  afterEach(() => {
    for (const tree of trees.splice(0)) rmSync(tree, { recursive: true, force: true });
  });

  function tree(files: Record<string, string>): string {
    const root = mkdtempSync(join(tmpdir(), 'steadfast-imports-'));
    trees.push(root);
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(dirname(join(root, path)), { recursive: true });
      writeFileSync(join(root, path), text);
    }
    return root;
  }

  it('hold in this repository: nothing below the controller imports it, and core imports nothing else of ours', () => {
    expect(importViolations(REPO)).toEqual([]);
  });

  it("leave the try-it tools out of the controller's CLI: cli/ names tryit/ only in type positions, and loads it through cli/tryit.ts", () => {
    const cli = join(REPO, 'cli');
    const naming = readdirSync(cli)
      .filter((name) => name.endsWith('.ts'))
      .flatMap((name) =>
        readFileSync(join(cli, name), 'utf8')
          .split('\n')
          .map((line) => ({ name, line })),
      )
      .filter(({ line }) => line.includes('../tryit/'));
    expect(naming.length).toBeGreaterThan(0);
    for (const { name, line } of naming) {
      expect(name).toBe('commands.ts');
      expect(line.replaceAll(/typeof import\('\.\.\/tryit\/[^']+'\)/g, '')).not.toContain('../tryit/');
    }
  });

  it('report an actuator that imports the controller, and core importing another folder, by file and specifier', () => {
    const root = tree({
      'actuators/recovery.ts': "import type { JobStore } from '../controller/job-store.js';\nexport type X = JobStore;\n",
      'core/queues.ts': "export { ladder } from '../controller/policy/ladder/index.js';\nconst later = () => import('../analyzers/stacks.js');\n",
      'controller/job-store.ts': "import { z } from 'zod';\nimport { Keys } from '../core/redis.js';\n",
    });
    expect(importViolations(root)).toEqual([
      { file: 'core/queues.ts', specifier: '../controller/policy/ladder/index.js', target: 'controller' },
      { file: 'core/queues.ts', specifier: '../analyzers/stacks.js', target: 'analyzers' },
      { file: 'actuators/recovery.ts', specifier: '../controller/job-store.js', target: 'controller' },
    ]);
  });
});
