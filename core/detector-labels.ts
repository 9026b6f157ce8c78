import { z } from 'zod';
import { AGENT_SCRAPE_JOB, TRAINING_JOB_LABEL } from './scrape.js';

/**
 * The label names the multi-signal detector's Prometheus queries rely on, for fleets that name
 * them otherwise (another scrape job, `instance` or `host` for the node, another label for the
 * training job). The controller's config (analysis.labels) and the `detect suspects` flags
 * (--scrape-job, --node-label, --training-job-label) both read them through these schemas.
 */

export const prometheusLabelNameSchema = z
  .string()
  .regex(/^[a-zA-Z_][a-zA-Z0-9_]*$/, 'must be a Prometheus label name (letters, digits, _; not starting with a digit)');

/** A scrape job name, or several as `a|b`; it goes between quotes in a selector, so no quotes, backslashes or newlines. */
export const scrapeJobSchema = z
  .string()
  .min(1)
  .max(200)
  .regex(/^[^"\\\n]+$/, 'must not hold quotes, backslashes or newlines');

export const detectorLabelsSchema = z
  .object({
    /** The scrape job (or jobs, `a|b`) of the node metrics. */
    scrapeJob: scrapeJobSchema.default(AGENT_SCRAPE_JOB),
    /** The label naming the node on every node series; the progress watch reads a job's nodes by it too. */
    nodeLabel: prometheusLabelNameSchema.default('node'),
    /** The label naming the training job on the series of a job's nodes: who is whose peer. */
    trainingJobLabel: prometheusLabelNameSchema.default(TRAINING_JOB_LABEL),
  })
  .strict();

export type DetectorLabels = z.output<typeof detectorLabelsSchema>;
