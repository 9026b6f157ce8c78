#!/usr/bin/env node
// Lays out the try-it package (steadfast-tryit: `steadfast demo`, `steadfast lab`,
// `steadfast simulate` and the ETTR plot) in a temporary directory from the build (npm run build)
// and packs it into OUT:
//   package.json        tryit/package.json made packable: its own dependencies (vega, vega-lite,
//                       resvg for the plot) and the controller's package, steadfast, at this version
//   bin/steadfast.cjs   the `steadfast` command: the controller package's, which finds these tools
//   dist/tryit/         the compiled try-it tools, with every import that leaves them pointed at the
//                       steadfast package (`../core/paths.js` becomes `steadfast/dist/core/paths.js`),
//                       and beside them the files they read: the simulated nodes' nvidia-smi fixture
//                       and script, the stand-in NVML library's source
// The controller's own package (`npm pack` at the root) carries none of this.
import { execFileSync } from 'node:child_process';
import { chmodSync, copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, posix, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const args = process.argv.slice(2);
if (args.length !== 1) {
  process.stderr.write('usage: node scripts/stage-tryit.mjs OUT\n');
  process.exit(2);
}
const target = resolve(args[0]);
const built = join(root, 'dist', 'tryit');
if (!existsSync(join(built, 'cli', 'demo.js'))) {
  process.stderr.write('stage-tryit: dist/tryit/ is missing: run npm run build first\n');
  process.exit(1);
}
const main = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const { private: _workspaceOnly, ...own } = JSON.parse(readFileSync(join(root, 'tryit', 'package.json'), 'utf8'));
if (own.version !== main.version) {
  process.stderr.write(`stage-tryit: tryit/package.json is at ${own.version}, package.json at ${main.version}: the packages are released together\n`);
  process.exit(1);
}

/** Every file under `dir`, relative to it. */
function filesUnder(dir) {
  return readdirSync(dir).flatMap((name) => (statSync(join(dir, name)).isDirectory() ? filesUnder(join(dir, name)).map((file) => join(name, file)) : [name]));
}

// tsc writes each import as `from '…'`, `import('…')` or `import '…'` with the specifier in quotes.
const SPECIFIER = /(\bfrom\s*|\bimport\s*\(\s*|\bimport\s+)(['"])(\.{1,2}\/[^'"]+)\2/g;

/** A compiled module's imports that leave dist/tryit/, pointed at the same file in the steadfast package. */
function pointAtController(text, file) {
  return text.replace(SPECIFIER, (whole, lead, quote, specifier) => {
    const into = relative(built, resolve(dirname(file), specifier));
    if (!into.startsWith('..')) return whole;
    const inDist = relative(join(root, 'dist'), resolve(dirname(file), specifier));
    if (inDist.startsWith('..')) throw new Error(`${relative(root, file)} imports ${specifier}, outside dist/`);
    return `${lead}${quote}steadfast/dist/${inDist.split(sep).join(posix.sep)}${quote}`;
  });
}

const out = mkdtempSync(join(tmpdir(), 'steadfast-tryit-package-'));
try {
  for (const file of filesUnder(built)) {
    if (file.endsWith('.map')) continue;
    const from = join(built, file);
    const to = join(out, 'dist', 'tryit', file);
    mkdirSync(dirname(to), { recursive: true });
    if (file.endsWith('.js')) writeFileSync(to, pointAtController(readFileSync(from, 'utf8'), from));
    else copyFileSync(from, to);
  }
  // What the tools read beside their code (tryit/paths.ts finds it there).
  cpSync(join(root, 'tryit', 'fixtures'), join(out, 'dist', 'tryit', 'fixtures'), { recursive: true });
  copyFileSync(join(root, 'tryit', 'fake-nvidia-smi.sh'), join(out, 'dist', 'tryit', 'fake-nvidia-smi.sh'));
  chmodSync(join(out, 'dist', 'tryit', 'fake-nvidia-smi.sh'), 0o755);
  for (const source of readdirSync(join(root, 'tryit', 'nvml')).filter((name) => /\.[ch]$/.test(name))) {
    copyFileSync(join(root, 'tryit', 'nvml', source), join(out, 'dist', 'tryit', 'nvml', source));
  }
  mkdirSync(join(out, 'bin'));
  copyFileSync(join(root, 'tryit', 'bin', 'steadfast.cjs'), join(out, 'bin', 'steadfast.cjs'));
  chmodSync(join(out, 'bin', 'steadfast.cjs'), 0o755);
  copyFileSync(join(root, 'tryit', 'README.md'), join(out, 'README.md'));
  const manifest = {
    ...own,
    bin: { steadfast: 'bin/steadfast.cjs' },
    dependencies: { steadfast: main.version, ...own.dependencies },
    files: ['bin/', 'dist/'],
  };
  // A package the tools import that their manifest does not name would resolve only by the luck of hoisting.
  const BARE = /(?:\bfrom\s*|\bimport\s*\(\s*|\bimport\s+)['"]((?:@[^/'"]+\/)?[^./'"][^/'"]*)/g;
  for (const file of filesUnder(join(out, 'dist')).filter((name) => name.endsWith('.js'))) {
    for (const [, name] of readFileSync(join(out, 'dist', file), 'utf8').matchAll(BARE)) {
      if (!name.startsWith('node:') && !(name in manifest.dependencies))
        throw new Error(`dist/${file} imports ${name}, which tryit/package.json does not depend on`);
    }
  }
  writeFileSync(join(out, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  mkdirSync(target, { recursive: true });
  const tarball = execFileSync('npm', ['pack', out, '--pack-destination', target, '--silent'], { encoding: 'utf8' }).trim();
  process.stdout.write(`${join(target, tarball)}\n`);
} finally {
  rmSync(out, { recursive: true, force: true });
}
