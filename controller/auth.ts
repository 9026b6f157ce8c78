import { createHash, timingSafeEqual } from 'node:crypto';
import type { NextFunction, Request, Response } from 'express';

/** Bearer-token check in constant time (digests first, so lengths leak nothing either). */
export function bearerAuth(token: string, onReject: (req: Request) => void = () => undefined): (req: Request, res: Response, next: NextFunction) => void {
  const expected = createHash('sha256').update(token).digest();
  return (req, res, next) => {
    const header = req.get('authorization') ?? '';
    const match = /^Bearer\s+(.+)$/i.exec(header);
    const given = createHash('sha256').update(match?.[1]?.trim() ?? '').digest();
    if (!match || !timingSafeEqual(given, expected)) {
      onReject(req);
      res
        .status(401)
        .set('WWW-Authenticate', 'Bearer realm="steadfast"')
        .json({ error: match ? 'invalid bearer token' : 'missing "Authorization: Bearer <token>" header' });
      return;
    }
    next();
  };
}

/**
 * Like bearerAuth, but also takes the token as the password of HTTP Basic auth (any user name),
 * and challenges with Basic so a browser prompts for it: for pages people open in a browser,
 * which cannot send a bearer header. Comparison is constant-time, as in bearerAuth.
 */
export function bearerOrBasicAuth(token: string, onReject: (req: Request) => void = () => undefined): (req: Request, res: Response, next: NextFunction) => void {
  const expected = createHash('sha256').update(token).digest();
  return (req, res, next) => {
    const given = presentedToken(req.get('authorization') ?? '');
    const digest = createHash('sha256').update(given ?? '').digest();
    if (given === undefined || !timingSafeEqual(digest, expected)) {
      onReject(req);
      res
        .status(401)
        .set('WWW-Authenticate', 'Basic realm="steadfast"')
        .json({ error: given === undefined ? 'missing credentials: send "Authorization: Bearer <token>" or the token as the Basic-auth password' : 'invalid token' });
      return;
    }
    next();
  };
}

/** The token in an Authorization header: a bearer token, or the password of Basic credentials. */
function presentedToken(header: string): string | undefined {
  const bearer = /^Bearer\s+(.+)$/i.exec(header);
  if (bearer) return bearer[1]?.trim();
  const basic = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(header);
  if (!basic?.[1]) return undefined;
  const decoded = Buffer.from(basic[1], 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  return colon === -1 ? undefined : decoded.slice(colon + 1);
}
