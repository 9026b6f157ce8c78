import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Gauge, type Registry } from 'prom-client';

/**
 * What build of steadfast is running, for `steadfast_build_info` on the agent's and the
 * controller's /metrics: the package version, the source revision when the package carries one
 * (a `REVISION` file next to package.json holding a commit id), and the Node.js version.
 */
export interface BuildInfo {
  readonly version: string;
  readonly revision?: string | undefined;
  readonly nodejs: string;
}

const REVISION_PATTERN = /^[0-9a-f]{7,64}$/;
const PACKAGE_NAMES = new Set(['steadfast', 'steadfast-agent']);

/**
 * The installed package's root: the nearest directory above the running code whose package.json
 * is steadfast's or the agent-only package's. A repository checkout, the npm packages, the Debian
 * packages and the images all have one; nothing else of the repository's layout is needed.
 */
export function packageRoot(moduleUrl: string = import.meta.url): string {
  let dir = dirname(fileURLToPath(moduleUrl));
  for (;;) {
    const manifest = join(dir, 'package.json');
    if (existsSync(manifest)) {
      try {
        if (PACKAGE_NAMES.has((JSON.parse(readFileSync(manifest, 'utf8')) as { name?: unknown }).name as string)) return dir;
      } catch {
        // Not ours, or not JSON: go on up.
      }
    }
    const parent = dirname(dir);
    if (parent === dir) throw new Error(`cannot find steadfast's package.json above ${fileURLToPath(moduleUrl)}`);
    dir = parent;
  }
}

export function readBuildInfo(root: string = packageRoot(import.meta.url)): BuildInfo {
  const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version?: unknown };
  const version = typeof manifest.version === 'string' ? manifest.version : 'unknown';
  let revision: string | undefined;
  try {
    const text = readFileSync(join(root, 'REVISION'), 'utf8').trim();
    // Anything else in the file is not a revision; the label stays off rather than carry it.
    if (REVISION_PATTERN.test(text)) revision = text;
  } catch {
    // No REVISION file: a checkout or a package built without one.
  }
  return { version, revision, nodejs: process.versions.node };
}

/** Registers `steadfast_build_info` (always 1) with the build's labels. */
export function registerBuildInfo(registry: Registry, info: BuildInfo = readBuildInfo()): void {
  const labels: Record<string, string> = { version: info.version, nodejs: info.nodejs };
  if (info.revision !== undefined) labels.revision = info.revision;
  const gauge = new Gauge({
    name: 'steadfast_build_info',
    help: 'The running steadfast build: version, source revision when known, Node.js version. Always 1.',
    labelNames: ['version', 'revision', 'nodejs'],
    registers: [registry],
  });
  gauge.set(labels, 1);
}
