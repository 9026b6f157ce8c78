import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';
import { ALERT_CATALOGUE } from '../../rules/catalogue.js';

/**
 * What an alert means lives with its rule (rules/domains/) and reaches the controller through
 * the catalogue (rules/catalogue.ts). A controller file that names an alert in a string keeps a
 * second table beside it, which drifts: no string in controller/ may name one.
 */

const REPO = resolve(import.meta.dirname, '../..');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sourceFiles(path);
    return name.endsWith('.ts') && !name.endsWith('.d.ts') ? [path] : [];
  });
}

/**
 * The text of every string literal, every literal part of a template and every property name of
 * an object literal (a table keyed by name) in `text`, with its line.
 */
function literals(file: string, text: string): { readonly text: string; readonly line: number }[] {
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS);
  const found: { text: string; line: number }[] = [];
  const visit = (node: ts.Node): void => {
    const literal = ts.isStringLiteral(node) || ts.isNoSubstitutionTemplateLiteral(node) || ts.isTemplateLiteralToken(node);
    const key = ts.isIdentifier(node) && ts.isPropertyAssignment(node.parent) && node.parent.name === node;
    if (literal || key) found.push({ text: node.text, line: source.getLineAndCharacterOfPosition(node.getStart(source)).line + 1 });
    ts.forEachChild(node, visit);
  };
  visit(source);
  return found;
}

/** Each `file:line: name` where a string literal in `files` names an alert of `names`. */
function alertNamesIn(files: readonly string[], names: readonly string[]): string[] {
  const pattern = new RegExp(`\\b(${names.join('|')})\\b`);
  return files.flatMap((file) =>
    literals(file, readFileSync(file, 'utf8')).flatMap(({ text, line }) => {
      const name = pattern.exec(text)?.[1];
      return name === undefined ? [] : [`${relative(REPO, file)}:${line}: ${name}`];
    }),
  );
}

describe('alert names in the controller', () => {
  const names = [...ALERT_CATALOGUE.keys()];

  it('the catalogue has every alert of the rules', () => {
    expect(names.length).toBeGreaterThan(25);
    expect(names).toContain('SteadfastXidFatal');
    expect(names).toContain('SteadfastAgentDown');
  });

  it('no string in controller/ names an alert: what one means comes from the catalogue', () => {
    expect(alertNamesIn(sourceFiles(join(REPO, 'controller')), names)).toEqual([]);
  });

  it('finds an alert name in a string, a template or an object key, and not in a comment or a variable', () => {
    const file = join(REPO, 'controller', 'example.ts');
    const found = (text: string) => literals(file, text).map((literal) => literal.text);
    const text = [
      '// SteadfastXidFatal is a comment',
      'const SteadfastXidFatal = 1;',
      "const a = 'SteadfastGpuLost';",
      'const b = `SteadfastAgentDown`;',
      'const c = `${a}: SteadfastXidGpuResetRequired on ${b}`;',
      "const d = { SteadfastNvswitchFatal: 'machine' };",
    ].join('\n');
    expect(found(text)).toEqual(['SteadfastGpuLost', 'SteadfastAgentDown', '', ': SteadfastXidGpuResetRequired on ', '', 'SteadfastNvswitchFatal', 'machine']);
  });
});
