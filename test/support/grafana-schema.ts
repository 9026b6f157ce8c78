import { existsSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import ts from 'typescript';

/**
 * What a Grafana release's own schema package (@grafana/schema, installed under an alias per
 * release) says a panel type accepts: the property names of its panel config's `Options` and of
 * its field config's `custom` part, inherited ones included, read with the TypeScript checker
 * from the package's declaration files.
 */
export interface PanelSchema {
  readonly options: ReadonlySet<string>;
  /** Undefined when the release declares no custom field config for the panel type. */
  readonly fieldCustom: ReadonlySet<string> | undefined;
}

export interface GrafanaSchema {
  /** The release, from the package's own version. */
  readonly version: string;
  /** The panel types the release declares a panel config for (the directory names: `statetimeline`). */
  readonly panelTypes: ReadonlySet<string>;
  /** The schema of a panel type as dashboards name it (`state-timeline`), or undefined when the release has none. */
  panel(type: string): PanelSchema | undefined;
  /** The property names of an interface the release's dashboard schema exports (`Dashboard`, `Panel`, `RowPanel`, `FieldConfig`). */
  dashboardType(name: string): ReadonlySet<string>;
}

/** Panel types whose custom field config lives in the common schema, not in their panel config. */
const COMMON_FIELD_CONFIG: Readonly<Record<string, string>> = { table: 'TableFieldOptions' };

const require = createRequire(import.meta.url);

/** Reads the schema of the @grafana/schema release installed as `packageName`. */
export function grafanaSchema(packageName: string): GrafanaSchema {
  const root = dirname(require.resolve(`${packageName}/package.json`));
  const manifest = require(`${packageName}/package.json`) as { version: string; types: string };
  const { version } = manifest;
  const composable = join(root, 'dist', 'esm', 'raw', 'composable');
  const panelFiles = new Map<string, string>();
  for (const entry of readdirSync(composable)) {
    const dir = join(composable, entry, 'panelcfg', 'x');
    if (!existsSync(dir)) continue;
    const file = readdirSync(dir).find((name) => name.endsWith('_types.gen.d.ts'));
    if (file) panelFiles.set(entry, join(dir, file));
  }
  const index = join(root, manifest.types);
  // The panel configs import '@grafana/schema': resolve it to this same release.
  const program = ts.createProgram([index, ...panelFiles.values()], {
    noEmit: true,
    skipLibCheck: true,
    baseUrl: root,
    paths: { '@grafana/schema': [index] },
    moduleResolution: ts.ModuleResolutionKind.Node10,
  });
  const checker = program.getTypeChecker();

  function propertiesOf(file: string, name: string): Set<string> | undefined {
    const source = program.getSourceFile(file);
    if (!source) throw new Error(`${packageName}: cannot read ${file}`);
    const symbol = checker.getSymbolAtLocation(source);
    const exported = symbol ? checker.getExportsOfModule(symbol).find((entry) => entry.name === name) : undefined;
    if (!exported) return undefined;
    return new Set(checker.getPropertiesOfType(checker.getDeclaredTypeOfSymbol(exported)).map((property) => property.name));
  }

  return {
    version,
    panelTypes: new Set(panelFiles.keys()),
    panel(type) {
      const file = panelFiles.get(type.replaceAll('-', ''));
      if (!file) return undefined;
      const options = propertiesOf(file, 'Options');
      if (!options) throw new Error(`${packageName}: ${file} declares no Options`);
      const common = COMMON_FIELD_CONFIG[type];
      return { options, fieldCustom: common ? propertiesOf(index, common) : propertiesOf(file, 'FieldConfig') };
    },
    dashboardType(name) {
      const properties = propertiesOf(index, name);
      if (!properties) throw new Error(`${packageName}: exports no ${name}`);
      return properties;
    },
  };
}
