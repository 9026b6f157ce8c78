import express from 'express';
import type { Config } from '../../core/config.js';
import { xidPolicyStacks } from '../../core/profiles.js';
import { fastPathCodesOf, type XidPolicyAnswer } from '../../core/xid-policy.js';
import { apiRoute } from './routes.js';

/**
 * GET /api/v1/xid-policy: which codes the controller wants on an agent's fast path beyond the
 * Xids the catalogue calls fatal (core/xid-policy.ts, fastPathCodes). Agents ask at start and
 * every few minutes (agent/xid-policy-client.ts). The controller decides every signal with its
 * own table whatever an agent sends; the answer only makes sure the codes it acts on arrive at
 * once instead of with the next Prometheus evaluation. The codes come from the configuration's layers
 * alone and with each profile's over them: an agent may send a code only another group of nodes acts
 * on, and the controller decides. The answer is fixed at start, as the configuration it comes from is.
 */
export function xidPolicyRouter(config: Pick<Config, 'xidPolicy' | 'profiles'>): express.Router {
  const router = express.Router();
  const answer: XidPolicyAnswer = { version: 1, fastPath: fastPathCodesOf(xidPolicyStacks(config)) };
  apiRoute(router, 'get', '/xid-policy', (_req, res) => {
    res.json(answer);
  });
  return router;
}
