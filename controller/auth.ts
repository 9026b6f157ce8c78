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
