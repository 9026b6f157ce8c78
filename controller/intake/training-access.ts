import type { Request, Response } from 'express';
import { trainingNodes, type JobRecord, type JobStore } from '../job-store.js';
import { ForbiddenError, identityOf } from './auth.js';

/**
 * Who may call a job's training routes (scope `training`): an operator for any job; an agent's
 * node-bound credential for a job whose member or hot-swap spare its node is, and, when the
 * request says which node it speaks for (`asNode`), only as its own node. Returns the job's record.
 */
export async function mayTrainFor(jobs: JobStore, name: string, req: Request, res: Response, asNode?: string): Promise<JobRecord> {
  const record = await jobs.get(name);
  const identity = identityOf(res);
  if (identity.node === undefined) return record;
  const route = `${req.method} ${req.originalUrl.split('?')[0] ?? ''}`;
  if (!trainingNodes(record).includes(identity.node)) {
    throw new ForbiddenError(identity, 'training', `agent ${identity.node} may not ${route}: job ${name} does not run on ${identity.node}`);
  }
  if (asNode !== undefined && asNode !== identity.node) {
    throw new ForbiddenError(identity, 'training', `agent ${identity.node} may not ${route} as ${asNode}: a node reports only for itself`);
  }
  return record;
}
