import fc from 'fast-check';
import { afterAll, describe, expect, it } from 'vitest';
import { Credentials, agentTokenFor, parseAgentToken, presentedToken } from '../../core/credentials.js';
import { NODE_NAME_PATTERN } from '../../core/names.js';
import { hostileString } from '../support/hostile.js';
import { FuzzReport, budget, fuzz } from './harness.js';

/**
 * Fuzzes the credential parsing every API request goes through: the Authorization header, the
 * agent token's `NODE.HEX` form, and the lookup of who holds a token. None may throw, and only
 * a genuine token is ever recognised, for the node it was made for.
 */

const REPORT = new FuzzReport('credentials');
afterAll(() => REPORT.print());

const SECRET = 'fuzz-agent-secret-0123456789abcdef01234567';
const credentials = new Credentials({
  operator: 'operator-token-0123456789',
  readOnly: 'read-only-token-0123456789',
  alertmanager: 'alertmanager-token-0123456789',
  agentSecret: SECRET,
});
const nodeName = fc.stringMatching(NODE_NAME_PATTERN);

describe('credential parsing under fuzzing', () => {
  it('reads any Authorization header without throwing, and only a bearer token or a non-empty Basic password comes out', async () => {
    const header = fc.oneof(
      hostileString,
      fc
        .tuple(fc.constantFrom('Bearer ', 'Basic ', 'bearer\t', 'BASIC  ', 'Digest ', ''), fc.oneof(hostileString, fc.base64String(), fc.string()))
        .map(([scheme, rest]) => scheme + rest),
      fc
        .tuple(fc.oneof(fc.string(), hostileString), fc.oneof(fc.string(), hostileString))
        .map(([user, password]) => `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`),
    );
    await fuzz(
      REPORT,
      'presentedToken',
      header,
      (text) => {
        const presented = presentedToken(text);
        if (presented) {
          expect(presented.token.length).toBeGreaterThan(0);
          expect(/^(bearer|basic)[ \t]/i.test(text)).toBe(true);
        }
        return presented ? presented.scheme : 'none';
      },
      budget(600, 3),
    );
  });

  it('recognises no garbage, mutated or foreign token, and every genuine agent token as its own node', async () => {
    const genuine = nodeName.map((node) => ({ node, token: agentTokenFor(SECRET, node) }));
    const mutated = fc.tuple(genuine, fc.nat(), fc.integer({ min: 1, max: 15 })).map(({ 0: { token }, 1: at, 2: delta }) => {
      const index = at % token.length;
      const code = token.charCodeAt(index);
      return token.slice(0, index) + String.fromCharCode(code ^ delta) + token.slice(index + 1);
    });
    const foreign = nodeName.map((node) => agentTokenFor('another-secret-0123456789abcdef0123456789', node));
    const input = fc.oneof(
      { weight: 2, arbitrary: genuine },
      { weight: 3, arbitrary: mutated.map((token) => ({ node: undefined, token })) },
      { weight: 1, arbitrary: foreign.map((token) => ({ node: undefined, token })) },
      { weight: 2, arbitrary: hostileString.map((token) => ({ node: undefined, token })) },
    );
    await fuzz(
      REPORT,
      'Credentials.identify',
      input,
      ({ node, token }) => {
        const identity = credentials.identify(token);
        const parsed = parseAgentToken(token);
        if (node === undefined) {
          expect(identity, token).toBeUndefined();
          return parsed ? 'agent-shaped, refused' : 'refused';
        }
        expect(identity).toEqual({ role: 'agent', node });
        expect(parsed?.node).toBe(node);
        return 'genuine';
      },
      budget(600, 4),
    );
  });
});
