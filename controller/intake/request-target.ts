/**
 * The request targets the controller serves: plain origin-form paths (RFC 9112 §3.2.1), where
 * what the router matches is exactly what was sent. Anything a parser could read two ways is
 * refused with 400 before authentication or routing: a fragment (`#`), a backslash (WHATWG URL
 * parsing reads it as `/`), an encoded `/`, `\`, `#` or `.` in the path, dot segments, and targets
 * not in origin form (absolute-form `http://…`, asterisk-form `*`).
 */

const ENCODED_SEPARATOR = /%(2f|5c|23|2e)/i;

/** Why `target` is not a plain origin-form path, or undefined when it is. */
export function requestTargetProblem(target: string): string | undefined {
  if (!target.startsWith('/')) return 'the request target must be a path starting with "/" (origin-form)';
  if (target.startsWith('//')) return 'the request target must not start with "//"';
  if (target.includes('#')) return 'the request target must not contain "#"';
  if (target.includes('\\')) return 'the request target must not contain "\\"';
  const query = target.indexOf('?');
  const path = query === -1 ? target : target.slice(0, query);
  if (ENCODED_SEPARATOR.test(path)) return 'the request path must not encode "/", "\\", "#" or "."';
  if (path.split('/').some((segment) => segment === '.' || segment === '..')) return 'the request path must not contain "." or ".." segments';
  return undefined;
}
