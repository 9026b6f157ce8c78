import { existsSync, readFileSync } from 'node:fs';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { isMap, isScalar, isSeq, parseDocument, type Document, type YAMLMap } from 'yaml';
import { z } from 'zod';
import { parseOrThrow } from '../core/validate.js';
import { FAULT_DOMAINS } from './catalogue.js';
import { HUMANS_RECEIVER, addHumanReceivers, humanReceiversSchema } from './human-receivers.js';
import { DOMAINS, PAGE_HUMANS_LABEL } from './spec.js';

/**
 * The Prometheus rule files and the Alertmanager config steadfast ships, as paths a caller can
 * hand to `prometheus` / `promtool` / `alertmanager`, plus a renderer that points a copy of the
 * Alertmanager config at a particular controller (the demo's loopback one).
 */

/**
 * The YAML files sit next to this module in the source tree. Compiled, this module lives in
 * dist/rules/ while the YAML stays in rules/, so look there when the files are not beside us.
 */
function rulesDirectory(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  return existsSync(join(here, 'alertmanager.yml')) ? here : resolve(here, '..', '..', 'rules');
}

const RULES_DIRECTORY = rulesDirectory();

/**
 * Prometheus rule files, one per domain (rules/<domain>.yml, in DOMAINS order) for every domain
 * whose file has been rendered, for `rule_files:` or `promtool check rules`.
 */
export const RULE_FILES: readonly string[] = Object.freeze(DOMAINS.map((domain) => join(RULES_DIRECTORY, `${domain}.yml`)).filter((path) => existsSync(path)));

/** The reference Alertmanager config (`alertmanager --config.file=...`). */
export const ALERTMANAGER_CONFIG: string = join(RULES_DIRECTORY, 'alertmanager.yml');

/** Where the shipped config sends to the controller, and the token file it names: a controller on the same host. */
export const DEFAULT_WEBHOOK_URL = 'http://127.0.0.1:9400/api/v1/alerts';
export const DEFAULT_CREDENTIALS_FILE = '/etc/steadfast/alertmanager-token';

/** The receiver in ALERTMANAGER_CONFIG that delivers to the steadfast controller's webhook. */
export const CONTROLLER_RECEIVER = 'steadfast-controller';

// Alertmanager's duration syntax (the Prometheus one): units largest first, each at most once.
const DURATION_PATTERN = /^(?:\d+y)?(?:\d+w)?(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?(?:\d+ms)?$/;
const durationSchema = z.string().min(1).regex(DURATION_PATTERN, 'must be a duration like 0s, 30s, 5m or 1h30m');
// Alertmanager refuses a zero group_interval or repeat_interval.
const nonZeroDurationSchema = durationSchema.refine((value) => /[1-9]/.test(value), 'must be longer than zero');

const renderOptionsSchema = z
  .object({
    /** Where Alertmanager POSTs alerts: the controller's `/api/v1/alerts`. */
    webhookUrl: z.url({ protocol: /^https?$/, error: 'must be an http:// or https:// URL' }),
    /** File holding the controller's bearer token; Alertmanager reads it on every send. */
    credentialsFile: z
      .string()
      .refine((path) => isAbsolute(path), 'must be an absolute path')
      .refine((path) => !/[\r\n]/.test(path), 'must not contain line breaks'),
    /** Replaces group_wait, group_interval and repeat_interval on the controller's routes. */
    groupWait: durationSchema.optional(),
    groupInterval: nonZeroDurationSchema.optional(),
    repeatInterval: nonZeroDurationSchema.optional(),
    /** Notifiers added to the humans receiver (rules/human-receivers.ts). */
    humans: humanReceiversSchema.optional(),
  })
  .strict();

export type RenderAlertmanagerOptions = z.input<typeof renderOptionsSchema>;

/**
 * Returns the shipped Alertmanager config (comments kept) with its routes' matchers written from
 * the alert catalogue (writeRouteMatchers), the controller's webhook URL and credentials file
 * replaced, and, where given, the timings of every route to the controller and the notifiers of
 * the humans receiver.
 * Throws an InputError naming the field when an option is malformed.
 */
export function renderAlertmanagerConfig(options: RenderAlertmanagerOptions): string {
  const { webhookUrl, credentialsFile, groupWait, groupInterval, repeatInterval, humans } = parseOrThrow(
    renderOptionsSchema,
    options,
    'Alertmanager render options',
  );
  const document = parseDocument(readFileSync(ALERTMANAGER_CONFIG, 'utf8'));
  writeRouteMatchers(document);

  const webhooks = controllerReceiver(document).get('webhook_configs');
  if (!isSeq(webhooks) || webhooks.items.length === 0) {
    throw new Error(`${ALERTMANAGER_CONFIG}: receiver ${CONTROLLER_RECEIVER} has no webhook_configs`);
  }
  for (const webhook of webhooks.items) {
    if (!isMap(webhook)) throw new Error(`${ALERTMANAGER_CONFIG}: a webhook_configs entry is not a mapping`);
    webhook.set('url', webhookUrl);
    webhook.setIn(['http_config', 'authorization', 'credentials_file'], credentialsFile);
  }

  const timings: ReadonlyArray<readonly [string, string | undefined]> = [
    ['group_wait', groupWait],
    ['group_interval', groupInterval],
    ['repeat_interval', repeatInterval],
  ];
  for (const route of controllerRoutes(document.get('route'))) {
    for (const [key, value] of timings) {
      if (value !== undefined) route.set(key, value);
    }
  }
  if (humans) addHumanReceivers(document, humans, ALERTMANAGER_CONFIG);
  return document.toString();
}

/**
 * What routes each alert is written from the catalogue (rules/catalogue.ts), in the routes under
 * the root: the controller's fault route matches the domains of the alerts the controller acts on
 * (`domain=~"…"`), its route for steadfast's own alerts the other domains (`domain!~"…"`), and the
 * people's route the label an alert routed to people carries (`notify="humans"`). Throws when the
 * config has lost one of those routes.
 */
function writeRouteMatchers(document: Document): void {
  const domains = FAULT_DOMAINS.join('|');
  const routes = document.getIn(['route', 'routes']);
  let faultRoutes = 0;
  let peopleRoutes = 0;
  for (const route of isSeq(routes) ? routes.items : []) {
    const matchers = isMap(route) ? route.get('matchers') : undefined;
    if (!isMap(route) || !isSeq(matchers)) continue;
    const receiver = route.get('receiver');
    if (receiver === HUMANS_RECEIVER) {
      const [matcher] = matchers.items;
      if (matchers.items.length !== 1 || !isScalar(matcher)) throw new Error(`${ALERTMANAGER_CONFIG}: the route to ${HUMANS_RECEIVER} must have one matcher`);
      matcher.value = `${PAGE_HUMANS_LABEL.name}="${PAGE_HUMANS_LABEL.value}"`;
      peopleRoutes++;
      continue;
    }
    if (receiver !== CONTROLLER_RECEIVER) continue;
    for (const matcher of matchers.items) {
      const operator = isScalar(matcher) && typeof matcher.value === 'string' ? /^domain(=~|!~)"/.exec(matcher.value)?.[1] : undefined;
      if (!isScalar(matcher) || operator === undefined) continue;
      matcher.value = `domain${operator}"${domains}"`;
      if (operator === '=~') faultRoutes++;
    }
  }
  if (faultRoutes === 0 || peopleRoutes === 0) {
    throw new Error(`${ALERTMANAGER_CONFIG}: no route to ${CONTROLLER_RECEIVER} on domain=~, or none to ${HUMANS_RECEIVER}`);
  }
}

function controllerReceiver(document: Document): YAMLMap {
  const receivers = document.get('receivers');
  const receiver = isSeq(receivers) ? receivers.items.find((item): item is YAMLMap => isMap(item) && item.get('name') === CONTROLLER_RECEIVER) : undefined;
  if (!receiver) throw new Error(`${ALERTMANAGER_CONFIG}: no receiver named ${CONTROLLER_RECEIVER}`);
  return receiver;
}

/** Every route in the tree (the root included) that delivers to the controller's receiver. */
function controllerRoutes(route: unknown): YAMLMap[] {
  if (!isMap(route)) return [];
  const children = route.get('routes');
  const below = isSeq(children) ? children.items.flatMap(controllerRoutes) : [];
  return route.get('receiver') === CONTROLLER_RECEIVER ? [route, ...below] : below;
}
