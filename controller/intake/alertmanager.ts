import { setImmediate } from 'node:timers/promises';
import { z } from 'zod';
import { NODE_NAME_PATTERN, TRAINING_JOB_PATTERN, normalizePciBusId } from '../../core/names.js';
import { describeIssues } from '../../core/validate.js';
import { AGENT_SCRAPE_JOB, TRAINING_JOB_LABEL } from '../../core/scrape.js';
import { signalKindOfAlert } from '../../rules/catalogue.js';
import {
  EVIDENCE_KEY_MAX,
  EVIDENCE_TEXT_MAX,
  faultFingerprint,
  reportedTimeSchema,
  stableHash,
  storedBytes,
  type Signal,
  type SignalKind,
  type SignalSeverity,
} from '../../core/signal.js';

/**
 * Alertmanager's webhook payload, version 4 (prometheus.io/docs/alerting/latest/configuration,
 * `<webhook_config>`), and its translation into Signals. Older senders omit the per-alert
 * `status` and `fingerprint`; both are optional here.
 *
 * Whatever this schema accepts becomes a valid Signal (a property test holds it to that): text
 * that only describes (annotations, the generator URL) is cut to the evidence's length, what a
 * decision rests on (the alert name, the Xid, the label names) is refused here when it could not
 * be stored whole, and an alert with more labels or annotations than LABELS_MAX, or a label value
 * longer than LABEL_VALUE_MAX_BYTES, is refused: every label is stored.
 */

/** `label.<name>` must fit an evidence key. */
const LABEL_NAME_MAX = EVIDENCE_KEY_MAX - 'label.'.length;
const ALERTNAME_MAX = 100;
const YEAR_MS = 366 * 24 * 3600 * 1000;

/**
 * Most labels, and most annotations, in one set. Every label is stored with its alert's signal,
 * so these bound what an alert's labels cost Redis (about 74 KiB at most); real alerts carry a few
 * (the samples in test/fixtures/realworld/alertmanager-webhook/ at most 7, steadfast's own rules at most 13).
 */
export const LABELS_MAX = 64;
/** Longest label value, in bytes as stored (JSON: a control character takes six). */
export const LABEL_VALUE_MAX_BYTES = 1024;
/** Longest annotation value: only the summary and description are kept, cut to the evidence's length. */
const ANNOTATION_VALUE_MAX = 16_384;

/** A set of at most LABELS_MAX entries, counted before they are read: one reason, not one per entry. */
function boundedSet(noun: 'label' | 'annotation', value: z.ZodType<string>) {
  const nameRule = `${noun} names must be at most ${LABEL_NAME_MAX} bytes`;
  const names = z.string().refine((name) => storedBytes(name) <= LABEL_NAME_MAX, { message: nameRule });
  return z
    .custom<object>((set) => typeof set !== 'object' || set === null || Object.keys(set).length <= LABELS_MAX, {
      message: `at most ${LABELS_MAX} ${noun}s are taken`,
    })
    .pipe(z.record(names, value, { error: (issue) => (issue.code === 'invalid_key' ? nameRule : undefined) }));
}

const labelSet = boundedSet(
  'label',
  z.string().refine((text) => storedBytes(text) <= LABEL_VALUE_MAX_BYTES, {
    message: `must be at most ${LABEL_VALUE_MAX_BYTES} bytes as stored (a control character takes six)`,
  }),
);
const annotationSet = boundedSet('annotation', z.string().max(ANNOTATION_VALUE_MAX));
const alertLabels = labelSet
  .refine((labels) => labels.alertname === undefined || labels.alertname.length <= ALERTNAME_MAX, {
    message: `alertname must be at most ${ALERTNAME_MAX} characters`,
    path: ['alertname'],
  })
  // An alert the catalogue turns into an Xid signal names its fault by the Xid.
  .refine((labels) => labels.alertname === undefined || signalKindOfAlert(labels.alertname) !== 'xid' || /^\d{1,4}$/.test(labels.xid ?? ''), {
    message: 'an Xid alert must carry its Xid as a number of 1 to 4 digits',
    path: ['xid'],
  })
  // Any alert may carry an xid label (reset-required, repeated application Xids): it is an Xid
  // code or the alert is refused, never a free text read as "Xid ?".
  .refine((labels) => labels.xid === undefined || /^\d{1,6}$/.test(labels.xid), {
    message: 'xid must be an Xid code, a number of 1 to 6 digits',
    path: ['xid'],
  })
  // A node label is what a drain acts on: one that is not a node name is refused, not dropped.
  .refine((labels) => labels.node === undefined || NODE_NAME_PATTERN.test(labels.node), {
    message: 'node must be 1-63 characters of letters, digits, ".", "_" or "-", starting with a letter or digit',
    path: ['node'],
  });

/** Alertmanager's spelling of "not set" for endsAt (Go's zero time). */
const UNSET_TIME = '0001-01-01T00:00:00Z';

export const webhookAlertSchema = z.object({
  status: z.enum(['firing', 'resolved']).optional(),
  labels: alertLabels,
  annotations: annotationSet.default({}),
  startsAt: reportedTimeSchema,
  // endsAt lies ahead while an alert fires (Alertmanager's resolve timeout), so it is not held to
  // a day from now; still a real time, and no later than a year from now.
  endsAt: z
    .string()
    .max(64)
    .refine((text) => text === UNSET_TIME || (z.iso.datetime({ offset: true }).safeParse(text).success && Date.parse(text) <= Date.now() + YEAR_MS), {
      message: `must be a time no later than a year from now, or ${UNSET_TIME} (not set)`,
    })
    .optional(),
  generatorURL: z.string().max(16_384).optional(),
  fingerprint: z.string().max(64).optional(),
});

const MAX_ALERTS = 10_000;

/** The webhook without its alerts, which are judged one by one (webhookAlertsOf). */
export const webhookEnvelopeSchema = z.object({
  version: z.literal('4', { message: 'only Alertmanager webhook version "4" is supported' }),
  groupKey: z.string().max(16_384).optional(),
  truncatedAlerts: z.number().int().min(0).optional(),
  status: z.enum(['firing', 'resolved']),
  receiver: z.string().max(256),
  groupLabels: labelSet.default({}),
  commonLabels: labelSet.default({}),
  commonAnnotations: annotationSet.default({}),
  externalURL: z.string().max(4096).optional(),
  alerts: z.array(z.unknown()).min(1).max(MAX_ALERTS),
});

/** A whole webhook whose every alert is valid. */
export const webhookPayloadSchema = webhookEnvelopeSchema.extend({ alerts: z.array(webhookAlertSchema).min(1).max(MAX_ALERTS) });

export type WebhookPayload = z.infer<typeof webhookPayloadSchema>;
type WebhookAlert = z.infer<typeof webhookAlertSchema>;
type WebhookEnvelope = z.infer<typeof webhookEnvelopeSchema>;

/** An alert of a webhook that was not taken, and why (the field and what is wrong with it). */
export interface RefusedAlert {
  readonly index: number;
  readonly reason: string;
}

/** Alerts judged between two turns of the event loop: a 10,000-alert webhook must not stall other requests. */
const ALERTS_PER_TURN = 250;

/**
 * The signals of a webhook's valid alerts and the refusals of the others, by index: one bad alert
 * in a group does not cost the rest (Alertmanager retries a whole webhook, or none of it). Works
 * through the alerts a slice at a time, yielding to the event loop in between.
 */
export async function signalsFromWebhookAlerts(envelope: WebhookEnvelope, receivedAt: Date): Promise<{ signals: Signal[]; refused: RefusedAlert[] }> {
  const signals: Signal[] = [];
  const refused: RefusedAlert[] = [];
  for (let start = 0; start < envelope.alerts.length; start += ALERTS_PER_TURN) {
    if (start > 0) await setImmediate();
    for (const [offset, raw] of envelope.alerts.slice(start, start + ALERTS_PER_TURN).entries()) {
      const index = start + offset;
      const parsed = webhookAlertSchema.safeParse(raw);
      if (parsed.success) signals.push(signalFromAlert(parsed.data, envelope.status, receivedAt));
      else refused.push({ index, reason: describeIssues(parsed.error.issues, `alerts.${index}`) });
    }
  }
  return { signals, refused };
}

function severityOf(label: string | undefined): SignalSeverity {
  switch (label) {
    case 'critical':
    case 'page':
    case 'fatal':
      return 'critical';
    case 'info':
    case 'informational':
    case 'none':
      return 'info';
    default:
      return 'warning';
  }
}

/** The node an alert is about: its `node` label, else the host part of `instance`. */
function nodeOf(labels: Record<string, string>): string | undefined {
  const candidate = labels.node ?? labels.instance?.replace(/:\d+$/, '');
  return candidate !== undefined && NODE_NAME_PATTERN.test(candidate) ? candidate : undefined;
}

export function signalsFromWebhook(payload: WebhookPayload, receivedAt: Date): Signal[] {
  return payload.alerts.map((alert) => signalFromAlert(alert, payload.status, receivedAt));
}

function signalFromAlert(alert: WebhookAlert, groupStatus: 'firing' | 'resolved', receivedAt: Date): Signal {
  const labels = alert.labels;
  const alertname = labels.alertname ?? 'unnamed';
  // The signal kind each of steadfast's own alerts reports is its meaning in the rules (rules/catalogue.ts).
  const kind: SignalKind = signalKindOfAlert(alertname);
  const node = nodeOf(labels);
  const gpu = labels.pci_bus_id ? normalizePciBusId(labels.pci_bus_id) : undefined;
  const status = alert.status ?? groupStatus;
  const detail = kind === 'xid' ? labels.xid : kind === 'alert' ? `${alertname}:${alert.fingerprint ?? stableHash(JSON.stringify(labels))}` : undefined;
  const fingerprint = faultFingerprint({ kind, node, gpu, detail });
  const evidence: Record<string, string | number | boolean> = {
    alertname,
    status,
    summary: descriptive(alert.annotations.summary ?? ''),
    description: descriptive(alert.annotations.description ?? ''),
  };
  if (labels.xid !== undefined && /^\d{1,6}$/.test(labels.xid)) evidence.xid = Number(labels.xid);
  if (alert.fingerprint) evidence.alertFingerprint = alert.fingerprint;
  if (alert.generatorURL) evidence.generatorURL = descriptive(alert.generatorURL);
  if (alert.endsAt && alert.endsAt !== UNSET_TIME) evidence.endsAt = alert.endsAt;
  for (const [name, value] of Object.entries(labels)) evidence[`label.${name}`] = descriptive(value);
  // Rule files from before `training_job` named the training job in `job` (with honor_labels);
  // the agents' own scrape job is never a training job.
  const trainingJob = labels[TRAINING_JOB_LABEL] ?? (labels.domain === 'training' && labels.job !== AGENT_SCRAPE_JOB ? labels.job : undefined);
  return {
    // Repeated notifications of one alert carry the same identity and startsAt: one id, one job.
    id: 's-' + stableHash(['alertmanager', fingerprint, alert.startsAt, status].join('|')),
    kind,
    node,
    gpu,
    // A name that is not a training job's cannot name one; it stays in the evidence.
    job: trainingJob !== undefined && TRAINING_JOB_PATTERN.test(trainingJob) ? trainingJob : undefined,
    severity: severityOf(labels.severity),
    time: new Date(alert.startsAt).toISOString(),
    receivedAt: receivedAt.toISOString(),
    fingerprint,
    source: 'alertmanager',
    evidence,
  };
}

/** Text kept only to be read by a person: cut to what the evidence holds, saying so. */
function descriptive(text: string): string {
  const marker = '…[truncated]';
  return text.length <= EVIDENCE_TEXT_MAX ? text : `${text.slice(0, EVIDENCE_TEXT_MAX - marker.length)}${marker}`;
}
