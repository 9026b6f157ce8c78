import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The repository root, found from a module's own location, so files shipped in the repo
 * (rules, fixtures) resolve the same whether the code runs from source (tests) or from dist/.
 */
export function repoRoot(moduleUrl: string = import.meta.url): string {
  let dir = dirname(fileURLToPath(moduleUrl));
  for (;;) {
    if (existsSync(join(dir, 'package.json')) && existsSync(join(dir, 'rules'))) return dir;
    const parent = dirname(dir);
    if (parent === dir) throw new Error(`cannot find the steadfast repository above ${fileURLToPath(moduleUrl)}`);
    dir = parent;
  }
}
