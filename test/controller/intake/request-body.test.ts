import { EventEmitter } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { describe, expect, it } from 'vitest';
import { BodyBudget, nestsDeeperThan, readJsonBody } from '../../../controller/intake/request-body.js';

describe('the depth of a JSON text', () => {
  it('counts arrays and objects outside strings only, escaped quotes included', () => {
    const encode = (text: string): Uint8Array => Buffer.from(text, 'utf8');
    expect(nestsDeeperThan(encode('[[[1]]]'), 3)).toBe(false);
    expect(nestsDeeperThan(encode('[[[[1]]]]'), 3)).toBe(true);
    expect(nestsDeeperThan(encode('{"a":{"b":{"c":{}}}}'), 3)).toBe(true);
    expect(nestsDeeperThan(encode(`["${'['.repeat(100)}"]`), 3)).toBe(false);
    expect(nestsDeeperThan(encode(`["\\"${'['.repeat(100)}"]`), 3)).toBe(false);
    expect(nestsDeeperThan(encode(`["\\\\", ${'['.repeat(4)}]`), 3)).toBe(true);
    expect(nestsDeeperThan(encode(`["é€😀${'{'.repeat(100)}"]`), 3)).toBe(false);
  });
});

describe("a failure in one request's body reading", () => {
  it('rejects that request instead of throwing from the request event into the process', async () => {
    // A request whose data comes as text, which the reader does not expect: concatenating it throws at 'end'.
    const req = Object.assign(new EventEmitter(), { headers: { 'content-type': 'application/json', 'content-length': '2' } }) as unknown as IncomingMessage;
    const res = new EventEmitter() as unknown as ServerResponse;
    const read = readJsonBody(req, res, { maxBytes: 1024, budget: new BodyBudget(4096) });
    req.emit('data', '{}');
    expect(() => req.emit('end')).not.toThrow();
    await expect(read).rejects.toThrow(TypeError);
  });
});
