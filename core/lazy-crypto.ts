import { createRequire } from 'node:module';

/**
 * node:crypto, loaded the first time something asks for it. The agent hashes only when asked to
 * (a token to check, a command's output to hash, a reported Xid line), and loading the module
 * costs several milliseconds of a start-up that must stay within its budget
 * (docs/evaluation.md); the controller and the CLI may import node:crypto as usual.
 */

const load = createRequire(import.meta.url);
let loaded: typeof import('node:crypto') | undefined;

export function lazyCrypto(): typeof import('node:crypto') {
  loaded ??= load('node:crypto') as typeof import('node:crypto');
  return loaded;
}
