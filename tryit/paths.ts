import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The folder of the try-it tools' own files (the simulated nodes' nvidia-smi fixture and script,
 * the stand-in NVML library's source): `tryit/` in a checkout, whether the code runs from source
 * or from dist/, and `tryit/` in the steadfast-tryit package, whose compiled code sits in
 * dist/tryit/ beside it. The controller's files (rules, the example, the Python client) are found
 * through repoRoot() instead: in an installed try-it package they are the steadfast package's.
 */
export function tryitRoot(moduleUrl: string = import.meta.url): string {
  let dir = dirname(fileURLToPath(moduleUrl));
  for (;;) {
    const candidate = join(dir, 'tryit');
    if (existsSync(join(candidate, 'fixtures'))) return candidate;
    const parent = dirname(dir);
    if (parent === dir) throw new Error(`cannot find the try-it tools' files (tryit/fixtures) above ${fileURLToPath(moduleUrl)}`);
    dir = parent;
  }
}
