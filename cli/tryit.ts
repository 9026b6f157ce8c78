import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { InputError } from '../core/errors.js';

/**
 * The try-it tools (`steadfast demo`, `lab`, `simulate`) are not part of the controller's
 * package: they live in tryit/ and ship as the steadfast-tryit package, with the plotting
 * libraries only they use. In a checkout they are built beside this CLI; where the controller's
 * package is installed, they are found in the steadfast-tryit package installed around it
 * (`npm install -g steadfast-tryit`, which brings this package as its dependency).
 */
export const TRYIT_PACKAGE = 'steadfast-tryit';

export type TryitModule = 'demo' | 'lab' | 'simulate';

/** Where a try-it module is: beside this CLI (a checkout), else in the try-it package, else undefined. */
export function tryitModulePath(name: TryitModule, from: string = import.meta.url): string | undefined {
  const here = dirname(fileURLToPath(from));
  // From dist/cli/ (compiled) the module is dist/tryit/cli/NAME.js; from cli/ (tsx) tryit/cli/NAME.ts.
  for (const candidate of [join(here, '..', 'tryit', 'cli', `${name}.js`), join(here, '..', 'tryit', 'cli', `${name}.ts`)]) {
    if (existsSync(candidate)) return candidate;
  }
  let manifest: string;
  try {
    manifest = createRequire(from).resolve(`${TRYIT_PACKAGE}/package.json`);
  } catch {
    return undefined;
  }
  const installed = join(dirname(manifest), 'dist', 'tryit', 'cli', `${name}.js`);
  return existsSync(installed) ? installed : undefined;
}

/** Imports a try-it module, or says which package brings it. */
export async function loadTryit(name: TryitModule): Promise<unknown> {
  const path = tryitModulePath(name);
  if (path === undefined) {
    throw new InputError(
      `steadfast ${name} is one of the try-it tools, which this installation does not have: they come with the ${TRYIT_PACKAGE} package (npm install -g ${TRYIT_PACKAGE}, which installs this controller's package with them), or run it from a checkout of steadfast`,
    );
  }
  return import(pathToFileURL(path).href);
}
