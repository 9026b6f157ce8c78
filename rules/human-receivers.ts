import { isAbsolute } from 'node:path';
import { isMap, isSeq, type Document, type YAMLMap } from 'yaml';
import { z } from 'zod';

/**
 * Where people get told, added to the `humans` receiver of the Alertmanager config: email, Slack,
 * PagerDuty. Secrets (the Slack webhook URL, the PagerDuty routing key) are named by file, never
 * written into the config, so the rendered file can be committed and the secret rotated alone.
 */

export const HUMANS_RECEIVER = 'humans';

const absoluteFile = z
  .string()
  .refine((path) => isAbsolute(path), 'must be an absolute path')
  .refine((path) => !/[\r\n]/.test(path), 'must not contain line breaks');

const emailAddress = z.email('must be an email address');

export const humanReceiversSchema = z
  .object({
    email: z
      .object({
        to: emailAddress,
        from: emailAddress,
        /** `host:port` of the SMTP relay. */
        smarthost: z.string().regex(/^[A-Za-z0-9.-]+:\d{1,5}$/, 'must be host:port'),
      })
      .strict()
      .optional(),
    slack: z
      .object({
        /** File holding the Slack incoming-webhook URL (Alertmanager's `api_url_file`). */
        webhookUrlFile: absoluteFile,
        channel: z.string().regex(/^#?[a-z0-9_-]{1,80}$/, 'must be a Slack channel name like #gpu-ops'),
      })
      .strict()
      .optional(),
    pagerduty: z
      .object({
        /** File holding the Events API v2 integration key (Alertmanager's `routing_key_file`). */
        routingKeyFile: absoluteFile,
      })
      .strict()
      .optional(),
  })
  .strict();

export type HumanReceivers = z.output<typeof humanReceiversSchema>;

function receiverNamed(document: Document, name: string, file: string): YAMLMap {
  const receivers = document.get('receivers');
  const receiver = isSeq(receivers) ? receivers.items.find((item): item is YAMLMap => isMap(item) && item.get('name') === name) : undefined;
  if (!receiver) throw new Error(`${file}: no receiver named ${name}`);
  return receiver;
}

/** Adds the chosen notifiers to the humans receiver; with none chosen the receiver stays empty (a sink). */
export function addHumanReceivers(document: Document, humans: HumanReceivers, file: string): void {
  const receiver = receiverNamed(document, HUMANS_RECEIVER, file);
  if (humans.email) {
    receiver.set(
      'email_configs',
      document.createNode([{ to: humans.email.to, from: humans.email.from, smarthost: humans.email.smarthost, send_resolved: true }]),
    );
  }
  if (humans.slack) {
    const channel = humans.slack.channel.startsWith('#') ? humans.slack.channel : `#${humans.slack.channel}`;
    receiver.set(
      'slack_configs',
      document.createNode([
        {
          api_url_file: humans.slack.webhookUrlFile,
          channel,
          send_resolved: true,
          title: '{{ .CommonAnnotations.summary }}',
          text: '{{ range .Alerts }}{{ .Annotations.description }}\n{{ .Annotations.runbook_url }}\n{{ end }}',
        },
      ]),
    );
  }
  if (humans.pagerduty) {
    receiver.set(
      'pagerduty_configs',
      document.createNode([{ routing_key_file: humans.pagerduty.routingKeyFile, send_resolved: true, description: '{{ .CommonAnnotations.summary }}' }]),
    );
  }
}
