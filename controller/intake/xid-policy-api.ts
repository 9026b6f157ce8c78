import express from 'express';
import { fastPathCodes, type PolicyLayer, type XidPolicyAnswer } from '../../core/xid-policy.js';
import { apiRoute } from './routes.js';

/**
 * GET /api/v1/xid-policy: which codes the controller wants on an agent's fast path beyond the
 * Xids the catalogue calls fatal (core/xid-policy.ts, fastPathCodes). Agents ask at start and
 * every few minutes (agent/xid-policy-client.ts). The controller decides every signal with its
 * own table whatever an agent sends; the answer only makes sure the codes it acts on arrive at
 * once instead of with the next Prometheus evaluation. The answer is fixed at start, as the
 * configuration it comes from is.
 */
export function xidPolicyRouter(layers: readonly PolicyLayer[]): express.Router {
  const router = express.Router();
  const answer: XidPolicyAnswer = { version: 1, fastPath: fastPathCodes(layers) };
  apiRoute(router, 'get', '/xid-policy', (_req, res) => {
    res.json(answer);
  });
  return router;
}
