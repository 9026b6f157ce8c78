#!/usr/bin/env node
// Writes a machine-readable copyright file (copyright-format 1.0) for one of the Debian packages
// to stdout: steadfast's own files under Apache-2.0, then one paragraph per npm package the
// Debian package carries, with the copyright lines of that package's licence files and the
// licence its package.json declares.
//
// Usage: node packaging/debian/copyright.mjs [--node-modules PATH=DIR] [--bundle PATH=ENTRY]...
//   --node-modules PATH=DIR  the installed node_modules: PATH as the package installs it
//                            (usr/lib/steadfast/node_modules), DIR where it lies now; one
//                            paragraph per npm package found under DIR
//   --bundle PATH=ENTRY      PATH (usr/lib/steadfast-agent/dist/agent.cjs) is esbuild's bundle of
//                            ENTRY (dist/cli/agent-main.js, in this checkout): one paragraph for
//                            PATH naming every npm package esbuild takes into it (not koffi,
//                            which scripts/build-agent.mjs leaves out: it is under node_modules)
//
// A licence that is neither in /usr/share/common-licenses nor in packaging/debian/licenses/ is
// copied from the first package that ships its text; a licence the script cannot name fails the
// build, so that a new dependency's licence is looked at before it ships.
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AGENT_EXTERNALS } from '../../scripts/agent-dependencies.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const repo = join(here, '..', '..');
const OWN_COPYRIGHT = '2026 the steadfast authors';
const CONTACT = 'steadfast maintainers <maintainers@steadfast.dev>';

/** SPDX identifiers as npm packages give them, and the short names copyright-format uses. */
const SHORT_NAMES = new Map([
  ['MIT', 'Expat'],
  ['Apache-2.0', 'Apache-2.0'],
  ['ISC', 'ISC'],
  ['BSD-2-Clause', 'BSD-2-Clause'],
  ['BSD-3-Clause', 'BSD-3-Clause'],
  ['0BSD', '0BSD'],
  ['MPL-2.0', 'MPL-2.0'],
  ['CC0-1.0', 'CC0-1.0'],
  ['Python-2.0', 'Python-2.0'],
  ['Unlicense', 'Unlicense'],
  ['BlueOak-1.0.0', 'BlueOak-1.0.0'],
]);

/** Licences whose full text every Debian system has; the copyright file points there. */
const COMMON_LICENSES = new Map([
  ['Apache-2.0', 'the Apache License, Version 2.0'],
  ['MPL-2.0', 'the Mozilla Public License, Version 2.0'],
  ['CC0-1.0', 'the Creative Commons CC0 1.0 Universal licence'],
]);

const LICENSE_FILE = /^(licen[cs]e|copying|notice)([-._].*)?$/i;

function fail(message) {
  process.stderr.write(`copyright.mjs: ${message}\n`);
  process.exit(1);
}

function parseArgs(argv) {
  const options = { nodeModules: [], bundles: [] };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    const pair = value?.match(/^([^=]+)=(.+)$/);
    if (!pair) fail(`${flag ?? '(nothing)'} needs PATH=VALUE`);
    if (flag === '--node-modules') options.nodeModules.push({ installed: pair[1], dir: pair[2] });
    else if (flag === '--bundle') options.bundles.push({ installed: pair[1], entry: pair[2] });
    else fail(`unknown argument ${flag} (expected --node-modules or --bundle)`);
  }
  return options;
}

/** Every npm package under a node_modules folder, nested ones included, parents first. */
function packagesUnder(dir) {
  const found = [];
  const visit = (modules) => {
    if (!existsSync(modules)) return;
    for (const name of readdirSync(modules).sort()) {
      if (name.startsWith('.')) continue;
      const path = join(modules, name);
      if (name.startsWith('@')) {
        for (const scoped of readdirSync(path).sort()) addPackage(join(path, scoped));
      } else addPackage(path);
    }
  };
  const addPackage = (path) => {
    if (!existsSync(join(path, 'package.json'))) return;
    found.push(path);
    visit(join(path, 'node_modules'));
  };
  visit(dir);
  return found;
}

/** The npm packages esbuild takes into the bundle of `entry`, with build-agent.mjs's externals left out. */
async function packagesBundled(entry) {
  const { build } = await import('esbuild');
  const result = await build({
    entryPoints: [join(repo, entry)],
    bundle: true,
    platform: 'node',
    format: 'cjs',
    write: false,
    metafile: true,
    logLevel: 'error',
    outfile: 'bundle.cjs',
    absWorkingDir: repo,
    external: AGENT_EXTERNALS,
  });
  const dirs = new Set();
  for (const input of Object.keys(result.metafile.inputs)) {
    const match = input.match(/^(.*node_modules\/(?:@[^/]+\/)?[^/]+)\//);
    if (match) dirs.add(join(repo, match[1]));
  }
  return [...dirs].sort();
}

function spdxOf(manifest) {
  if (typeof manifest.license === 'string') return manifest.license;
  if (manifest.license && typeof manifest.license.type === 'string') return manifest.license.type;
  if (Array.isArray(manifest.licenses)) return manifest.licenses.map((entry) => entry.type ?? entry).join(' OR ');
  return undefined;
}

/** An SPDX expression in copyright-format's words: `(MIT OR Apache-2.0)` → `Expat or Apache-2.0`. */
function shortLicense(spdx, where) {
  if (spdx === undefined) fail(`${where}: package.json names no licence`);
  const words = spdx.replace(/[()]/g, ' ').trim().split(/\s+/);
  return words
    .map((word, index) => {
      if (index % 2 === 1) {
        if (word === 'OR' || word === 'AND') return word.toLowerCase();
        fail(`${where}: cannot read the licence expression "${spdx}"`);
      }
      const name = SHORT_NAMES.get(word);
      if (name === undefined) fail(`${where}: licence "${word}" is not known to packaging/debian/copyright.mjs; check its terms and add it`);
      return name;
    })
    .join(' ');
}

function licenseFiles(dir) {
  return readdirSync(dir)
    .filter((name) => LICENSE_FILE.test(name) && statSync(join(dir, name)).isFile())
    .sort()
    .map((name) => join(dir, name));
}

/** The holders a package names: its licence files' copyright lines, else its package.json author. */
function holdersOf(dir, manifest) {
  const lines = new Set();
  for (const file of licenseFiles(dir)) {
    for (const raw of readFileSync(file, 'utf8').split(/\r?\n/)) {
      const line = raw.trim();
      // A notice, not licence wording that happens to say "copyright" (or Apache's clause "(c) You
      // must retain"): "Copyright" or a copyright sign, and a year or a copyright sign.
      if (!/^(copyright\b|©|\(c\)\s*\d)/i.test(line) || !/\d{4}|\(c\)|©/i.test(line)) continue;
      const holder = line
        .replace(/^copyright\b\s*:?\s*/i, '')
        .replace(/^(\(c\)|©)\s*/i, '')
        .trim();
      if (holder) lines.add(holder);
    }
  }
  if (lines.size > 0) return { holders: [...lines], source: 'notice' };
  const author = typeof manifest.author === 'string' ? manifest.author : manifest.author?.name;
  if (author) return { holders: [author.replace(/\s*\(http[^)]*\)\s*$/, '')], source: 'author' };
  return { holders: [`the ${manifest.name} authors`], source: 'none' };
}

/** A field's value over several lines, as copyright-format writes it (" ." for an empty line). */
function continued(lines) {
  return lines.map((line, index) => (index === 0 ? line : line.trim() === '' ? ' .' : ` ${line}`)).join('\n');
}

function describe(dir) {
  const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
  const where = `${manifest.name}@${manifest.version} (${dir})`;
  return { dir, manifest, license: shortLicense(spdxOf(manifest), where), ...holdersOf(dir, manifest) };
}

const options = parseArgs(process.argv.slice(2));
const paragraphs = [
  [
    'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/',
    'Upstream-Name: steadfast',
    `Upstream-Contact: ${CONTACT}`,
    continued([
      'Comment: Files are named by their installed paths. Each npm package is named with',
      "its version, the holders from its licence files' notices and the licence its",
      'package.json declares.',
      ...(options.nodeModules.length > 0 ? ['The npm packages under node_modules are installed as npm published them,', 'with their own licence files.'] : []),
    ]),
  ].join('\n'),
  ['Files: *', `Copyright: ${OWN_COPYRIGHT}`, 'License: Apache-2.0'].join('\n'),
];
const used = new Map();
const noteUse = (info) => {
  for (const name of info.license.split(/ (?:or|and) /)) if (!used.has(name)) used.set(name, info);
};

for (const bundle of options.bundles) {
  const modules = (await packagesBundled(bundle.entry)).map(describe);
  modules.forEach(noteUse);
  const licenses = ['Apache-2.0', ...new Set(modules.flatMap((info) => info.license.split(/ (?:or|and) /)))].filter(
    (name, index, all) => all.indexOf(name) === index,
  );
  paragraphs.push(
    [
      `Files: ${bundle.installed}`,
      `Copyright: ${continued([OWN_COPYRIGHT, ...new Set(modules.flatMap((info) => info.holders))])}`,
      `License: ${licenses.join(' and ')}`,
      `Comment: ${continued(["steadfast's code bundled (esbuild) with these npm packages:", ...modules.map((info) => `${info.manifest.name} ${info.manifest.version}: ${info.license}`)])}`,
    ].join('\n'),
  );
}

for (const tree of options.nodeModules) {
  for (const dir of packagesUnder(tree.dir)) {
    const info = describe(dir);
    noteUse(info);
    const installed = [tree.installed, ...relative(tree.dir, dir).split(sep)].join('/');
    const notes = [`${info.manifest.name} ${info.manifest.version}`];
    if (info.source === 'author') notes.push('The package carries no copyright notice; the holder is the author its package.json names.');
    if (info.source === 'none') notes.push('The package carries no copyright notice and names no author.');
    paragraphs.push([`Files: ${installed}/*`, `Copyright: ${continued(info.holders)}`, `License: ${info.license}`, `Comment: ${continued(notes)}`].join('\n'));
  }
}

if (!used.has('Apache-2.0')) used.set('Apache-2.0', undefined);
for (const name of [...used.keys()].sort()) {
  const common = COMMON_LICENSES.get(name);
  if (common !== undefined) {
    const apacheNotice =
      name === 'Apache-2.0'
        ? [
            'Licensed under the Apache License, Version 2.0 (the "License"); you may not',
            'use this software except in compliance with the License. Unless required by',
            'applicable law or agreed to in writing, software distributed under the',
            'License is distributed on an "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS',
            'OF ANY KIND, either express or implied. See the License for the specific',
            'language governing permissions and limitations under the License.',
            '',
          ]
        : [];
    paragraphs.push(
      `License: ${continued([name, ...apacheNotice, `On Debian systems, the complete text of ${common} can be found in`, `/usr/share/common-licenses/${name}.`])}`,
    );
    continue;
  }
  const ours = join(here, 'licenses', name);
  if (existsSync(ours)) {
    paragraphs.push(`License: ${continued([name, ...readFileSync(ours, 'utf8').trimEnd().split('\n')])}`);
    continue;
  }
  // No text of our own: the text the package ships, as it ships it.
  const info = used.get(name);
  const file = info && licenseFiles(info.dir)[0];
  if (!file) fail(`no text for licence ${name}: add packaging/debian/licenses/${name}`);
  paragraphs.push(
    `License: ${continued([
      name,
      ...readFileSync(file, 'utf8')
        .trimEnd()
        .split(/\r?\n/)
        .map((line) => line.replace(/\s+$/, '')),
    ])}\nComment: the text as ${info.manifest.name} ${info.manifest.version} ships it`,
  );
}

process.stdout.write(`${paragraphs.join('\n\n')}\n`);
