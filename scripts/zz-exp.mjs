import { build } from 'esbuild';
import { join } from 'node:path';
const root = '/work/main';
const stubLocales = process.env.STUB_LOCALES === '1';
const r = await build({
  entryPoints: [join(root, 'dist', 'cli', 'agent-main.js')], outfile: process.env.OUT, bundle: true, minify: true, platform: 'node', format: 'cjs', target: 'node20', logLevel: 'warning', metafile: true,
  banner: { js: "const __bundle_url = require('node:url').pathToFileURL(__filename).href;" }, define: { 'import.meta.url': '__bundle_url' },
  plugins: [{ name: 'no-pushgateway', setup(plugin) {
    plugin.onResolve({ filter: /^\.\/lib\/pushgateway$/ }, (args) => (args.importer.includes('node_modules/prom-client') ? { path: 'pushgateway', namespace: 'no-pushgateway' } : undefined));
    plugin.onLoad({ filter: /.*/, namespace: 'no-pushgateway' }, () => ({ contents: "module.exports = class Pushgateway {};", loader: 'js' }));
    if (stubLocales) {
      plugin.onResolve({ filter: /^\.\.\/locales\/index\.js$/ }, (args) => (args.importer.includes('node_modules/zod/') ? { path: 'locales', namespace: 'zod-en' } : undefined));
      plugin.onLoad({ filter: /.*/, namespace: 'zod-en' }, () => ({ contents: `export { default as en } from ${JSON.stringify(join(root, 'node_modules/zod/v4/locales/en.js'))};`, loader: 'js', resolveDir: root }));
    }
  } }],
});
const out = Object.values(r.metafile.outputs)[0]; console.log('bytes', out.bytes);
