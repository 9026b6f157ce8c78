import { writeFileSync } from 'node:fs';
import { Command } from 'commander';
import { InputError } from '../core/errors.js';
import type { HumanReceivers } from '../rules/human-receivers.js';
import { DEFAULT_CREDENTIALS_FILE, DEFAULT_WEBHOOK_URL, renderAlertmanagerConfig } from '../rules/index.js';
import { runCommand } from './common.js';

/**
 * `steadfast alertmanager-config`: the Alertmanager config pointed at your controller, with the
 * people's notifiers you name, rendered from the same code that keeps rules/alertmanager.yml.
 */

export const DEFAULT_CONTROLLER_URL = new URL(DEFAULT_WEBHOOK_URL).origin;

interface AlertmanagerConfigOptions {
  out?: string;
  controllerUrl: string;
  credentialsFile: string;
  emailTo?: string;
  emailFrom?: string;
  smarthost?: string;
  slackWebhookUrlFile?: string;
  slackChannel?: string;
  pagerdutyRoutingKeyFile?: string;
}

/** Flags that come in groups must come together; a half-given group is an error naming what is missing. */
function humanReceivers(options: AlertmanagerConfigOptions): HumanReceivers {
  const humans: HumanReceivers = {};
  const email = [options.emailTo, options.emailFrom, options.smarthost];
  if (email.some((value) => value !== undefined)) {
    if (!options.emailTo || !options.emailFrom || !options.smarthost)
      throw new InputError('--email-to, --email-from and --smarthost go together', '--email-to');
    humans.email = { to: options.emailTo, from: options.emailFrom, smarthost: options.smarthost };
  }
  if (options.slackWebhookUrlFile !== undefined || options.slackChannel !== undefined) {
    if (!options.slackWebhookUrlFile || !options.slackChannel)
      throw new InputError('--slack-webhook-url-file and --slack-channel go together', '--slack-channel');
    humans.slack = { webhookUrlFile: options.slackWebhookUrlFile, channel: options.slackChannel };
  }
  if (options.pagerdutyRoutingKeyFile !== undefined) humans.pagerduty = { routingKeyFile: options.pagerdutyRoutingKeyFile };
  return humans;
}

/** The controller's base URL as given, with its webhook path: `http://host:9400` → `http://host:9400/api/v1/alerts`. */
function webhookUrl(controllerUrl: string): string {
  let url: URL;
  try {
    url = new URL(controllerUrl);
  } catch {
    throw new InputError(`--controller-url: must be an http:// or https:// URL, got ${JSON.stringify(controllerUrl)}`, '--controller-url');
  }
  if (url.search || url.hash || url.username)
    throw new InputError('--controller-url: must be a base URL without query, fragment or credentials', '--controller-url');
  return `${controllerUrl.replace(/\/+$/, '')}/api/v1/alerts`;
}

export function alertmanagerConfigCommand(): Command {
  return new Command('alertmanager-config')
    .description("Render the Alertmanager config: fault alerts to the steadfast controller's webhook, the rest to people (email, Slack, PagerDuty when named).")
    .option('-o, --out <file>', 'write here instead of to stdout')
    .option('--controller-url <url>', 'the controller (or the Service in front of its replicas) as Alertmanager reaches it', DEFAULT_CONTROLLER_URL)
    .option(
      '--credentials-file <file>',
      "file with the controller's Alertmanager token (controller.auth.alertmanagerTokenFile), read by Alertmanager at every send",
      DEFAULT_CREDENTIALS_FILE,
    )
    .option('--email-to <address>', 'email people here (with --email-from and --smarthost)')
    .option('--email-from <address>', 'sender address for that email')
    .option('--smarthost <host:port>', 'SMTP relay for that email')
    .option('--slack-webhook-url-file <file>', 'file holding a Slack incoming-webhook URL (with --slack-channel)')
    .option('--slack-channel <channel>', 'Slack channel, e.g. #gpu-ops')
    .option('--pagerduty-routing-key-file <file>', 'file holding a PagerDuty Events API v2 routing key')
    .action(async (options: AlertmanagerConfigOptions) => {
      await runCommand(async () => {
        const humans = humanReceivers(options);
        const text = renderAlertmanagerConfig({
          webhookUrl: webhookUrl(options.controllerUrl),
          credentialsFile: options.credentialsFile,
          ...(Object.keys(humans).length > 0 ? { humans } : {}),
        });
        if (options.out) {
          writeFileSync(options.out, text);
          process.stdout.write(`Wrote ${options.out}\n`);
        } else {
          process.stdout.write(text);
        }
      });
    });
}
