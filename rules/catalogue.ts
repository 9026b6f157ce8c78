import { rules as compat } from './domains/compat.js';
import { rules as gpu } from './domains/gpu.js';
import { rules as network } from './domains/network.js';
import { rules as steadfast } from './domains/steadfast.js';
import { rules as storage } from './domains/storage.js';
import { rules as training } from './domains/training.js';
import { rules as xid } from './domains/xid.js';
import { DOMAINS, type AlertMeaning, type AlertSeverity, type AlertSignalKind, type Domain, type DomainRules } from './spec.js';
import { DEFAULT_THRESHOLDS } from './thresholds.js';

/**
 * The alert catalogue: every alert steadfast's rules define, with the meaning its domain module
 * gives it. The controller reads what an alert means from here (the signal kind it becomes, its
 * fault class, whether it is steadfast's own), and the Alertmanager config's routes are written
 * from it (rules/index.ts): no other table names an alert.
 *
 * Names and meanings do not depend on the thresholds, so the catalogue is read from the rules
 * as the defaults build them.
 */

/** Every domain module, by its domain: a domain without one does not compile. */
const DOMAIN_MODULES: Readonly<Record<Domain, DomainRules>> = { gpu, xid, network, storage, training, steadfast, compat };

export interface CatalogueEntry {
  readonly alert: string;
  /** The alert's `domain` label. */
  readonly domain: Domain;
  readonly severity: AlertSeverity;
  /** File name under docs/runbooks/. */
  readonly runbook: string;
  readonly meaning: AlertMeaning;
}

function buildCatalogue(): ReadonlyMap<string, CatalogueEntry> {
  const entries = new Map<string, CatalogueEntry>();
  for (const domain of DOMAINS) {
    const module = DOMAIN_MODULES[domain];
    if (module.domain !== domain) throw new Error(`rules/domains/${domain}.ts exports the rules of domain ${module.domain}`);
    for (const rule of module.groups(DEFAULT_THRESHOLDS).flatMap((group) => group.rules)) {
      if (rule.kind !== 'alert') continue;
      if (entries.has(rule.alert)) throw new Error(`alert ${rule.alert} is defined twice (the second time in rules/domains/${domain}.ts)`);
      entries.set(
        rule.alert,
        Object.freeze({ alert: rule.alert, domain: rule.domain ?? domain, severity: rule.severity, runbook: rule.runbook, meaning: rule.meaning }),
      );
    }
  }
  return entries;
}

/**
 * Every alert by name, in DOMAINS order. A Map: an alert named `constructor` or `__proto__`
 * must not find an object's inherited members.
 */
export const ALERT_CATALOGUE: ReadonlyMap<string, CatalogueEntry> = buildCatalogue();

/** The catalogue's entry for an alert, or undefined for an alert that is not steadfast's. */
export function catalogueEntry(alertname: string): CatalogueEntry | undefined {
  return ALERT_CATALOGUE.get(alertname);
}

/** The signal kind an alert becomes: its catalogue kind, `alert` for one not in the catalogue. */
export function signalKindOfAlert(alertname: string): AlertSignalKind {
  return catalogueEntry(alertname)?.meaning.signal ?? 'alert';
}

/**
 * The domains of the alerts the controller acts on (every meaning but self-monitoring), in
 * DOMAINS order: the Alertmanager route for faults matches on them, whoever's rules raise them.
 */
export const FAULT_DOMAINS: readonly Domain[] = DOMAINS.filter((domain) =>
  [...ALERT_CATALOGUE.values()].some((entry) => entry.domain === domain && entry.meaning.role !== 'self-monitoring'),
);
