import { writeRuleFiles } from './build.js';

/** `npm run rules`: rewrites rules/<domain>.yml from the domain modules. */
const changed = await writeRuleFiles();
process.stdout.write(changed.length === 0 ? 'rules: every file up to date\n' : `rules: wrote ${changed.join(', ')}\n`);
