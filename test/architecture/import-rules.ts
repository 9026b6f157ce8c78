import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, normalize, relative, sep } from 'node:path';
import ts from 'typescript';

/**
 * Which top-level folders each folder may import from: the pipeline runs downward (agents and
 * rules know nothing of the controller; actuators and analyzers take their contracts from core/),
 * and core/ imports nothing else of ours. tryit/, cli/ and bench/ compose everything; cli/ reaches
 * tryit/ only through cli/tryit.ts (by path, at run time) and types, since the controller's package
 * does not carry it.
 */
export const ALLOWED_IMPORTS: Readonly<Record<string, readonly string[]>> = {
  core: [],
  agent: ['core'],
  rules: ['core', 'agent'],
  dashboards: ['core', 'agent', 'rules'],
  analyzers: ['core', 'agent', 'rules'],
  actuators: ['core', 'analyzers'],
  controller: ['core', 'agent', 'rules', 'analyzers', 'actuators'],
  tryit: ['core', 'agent', 'rules', 'dashboards', 'analyzers', 'actuators', 'controller', 'cli'],
  cli: ['core', 'agent', 'rules', 'dashboards', 'analyzers', 'actuators', 'controller', 'tryit'],
  bench: ['core', 'agent', 'rules', 'dashboards', 'analyzers', 'actuators', 'controller', 'tryit'],
};

export interface ImportViolation {
  /** The importing file, relative to the root. */
  readonly file: string;
  /** The import specifier as written. */
  readonly specifier: string;
  /** The folder it reaches into. */
  readonly target: string;
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sourceFiles(path);
    return name.endsWith('.ts') && !name.endsWith('.d.ts') ? [path] : [];
  });
}

/** Every relative import under `root`'s folders that leaves its folder for one it may not use. */
export function importViolations(root: string, allowed: Readonly<Record<string, readonly string[]>> = ALLOWED_IMPORTS): ImportViolation[] {
  const violations: ImportViolation[] = [];
  for (const [folder, may] of Object.entries(allowed)) {
    let files: string[];
    try {
      files = sourceFiles(join(root, folder));
    } catch {
      continue; // a folder this tree does not have
    }
    for (const file of files) {
      // preProcessFile reads static imports, re-exports and import() calls, as the compiler does.
      const { importedFiles } = ts.preProcessFile(readFileSync(file, 'utf8'), true, true);
      for (const { fileName: specifier } of importedFiles) {
        if (!specifier.startsWith('.')) continue; // a package
        const target = relative(root, normalize(join(dirname(file), specifier))).split(sep)[0] ?? '';
        if (target === folder || may.includes(target)) continue;
        violations.push({ file: relative(root, file), specifier, target });
      }
    }
  }
  return violations;
}
