import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { describe, expect, it } from 'vitest';
import { ALERT_CATALOGUE, FAULT_DOMAINS, catalogueEntry, signalKindOfAlert } from '../rules/catalogue.js';
import { ALERTMANAGER_CONFIG, RULE_FILES } from '../rules/index.js';
import { PAGE_HUMANS_LABEL, alert } from '../rules/spec.js';

/**
 * The alert catalogue (rules/catalogue.ts) against what ships: the rule files, the runbooks and
 * the Alertmanager config. What the controller makes of each meaning is tested with the
 * controller (test/controller/policy/fault-class.test.ts, test/controller/intake/).
 */

const ROOT = resolve(import.meta.dirname, '..');
const RUNBOOKS = join(ROOT, 'docs', 'runbooks');

const ruleFileSchema = z.object({
  groups: z.array(z.object({ rules: z.array(z.object({ alert: z.string().optional(), labels: z.record(z.string(), z.string()).default({}) }).loose()) })),
});

/** Every alert of the committed rule files with its labels. */
function shippedAlerts(): { readonly alert: string; readonly labels: Readonly<Record<string, string>> }[] {
  return RULE_FILES.flatMap((file) =>
    ruleFileSchema
      .parse(parseYaml(readFileSync(file, 'utf8')))
      .groups.flatMap((group) => group.rules)
      .flatMap((rule) => (rule.alert === undefined ? [] : [{ alert: rule.alert, labels: rule.labels }])),
  );
}

describe('the alert catalogue', () => {
  it('holds exactly the alerts of the rule files, with the domain and severity they are labelled with', () => {
    const shipped = shippedAlerts();
    expect(shipped.length).toBeGreaterThan(25);
    expect([...ALERT_CATALOGUE.keys()].sort()).toEqual(shipped.map((rule) => rule.alert).sort());
    for (const { alert: name, labels } of shipped) {
      const entry = catalogueEntry(name);
      expect({ domain: labels.domain, severity: labels.severity }, name).toEqual({ domain: entry?.domain, severity: entry?.severity });
    }
  });

  it("carries the people's label on exactly the alerts whose meaning routes them to people", () => {
    for (const { alert: name, labels } of shippedAlerts()) {
      const toPeople = catalogueEntry(name)?.meaning.route === 'humans';
      expect(labels[PAGE_HUMANS_LABEL.name], name).toBe(toPeople ? PAGE_HUMANS_LABEL.value : undefined);
    }
  });

  it('names a runbook under docs/runbooks/ for every alert, and every runbook there belongs to an alert', () => {
    const runbooks = [...ALERT_CATALOGUE.values()].map((entry) => entry.runbook);
    for (const runbook of runbooks) expect(existsSync(join(RUNBOOKS, runbook)), `docs/runbooks/${runbook} does not exist`).toBe(true);
    expect(new Set(runbooks).size, 'two alerts share a runbook').toBe(runbooks.length);
    const onDisk = readdirSync(RUNBOOKS).filter((name) => name.startsWith('steadfast-') && name.endsWith('.md'));
    expect(
      onDisk.filter((name) => !runbooks.includes(name)),
      'runbooks no alert links to',
    ).toEqual([]);
  });

  it('states a citation for every fault of a fixed class, and routes every self-monitoring alert to people', () => {
    for (const { alert: name, meaning } of ALERT_CATALOGUE.values()) {
      if (meaning.role === 'fault') expect(meaning.citation.length, name).toBeGreaterThan(10);
      if (meaning.role === 'self-monitoring') expect(meaning.route, name).toBe('humans');
    }
  });

  it("gives an alert that is not steadfast's, or an inherited member's name, no entry and the plain alert kind", () => {
    for (const name of ['SomebodyElsesAlert', 'constructor', '__proto__', 'toString', '']) {
      expect(catalogueEntry(name), name).toBeUndefined();
      expect(signalKindOfAlert(name), name).toBe('alert');
    }
  });

  it('writes the fault route of the shipped Alertmanager config from the domains of the alerts the controller acts on', () => {
    expect(FAULT_DOMAINS).toEqual(['gpu', 'network', 'storage', 'training']);
    const config = readFileSync(ALERTMANAGER_CONFIG, 'utf8');
    expect(config).toContain(`- domain=~"${FAULT_DOMAINS.join('|')}"`);
    expect(config).toContain(`- domain!~"${FAULT_DOMAINS.join('|')}"`);
    expect(config).toContain(`- ${PAGE_HUMANS_LABEL.name}="${PAGE_HUMANS_LABEL.value}"`);
  });

  it('does not compile an alert without a meaning, a fault without its class, or a self-monitoring alert with one', () => {
    const base = { alert: 'SteadfastExample', expr: 'vector(1)', for: '0s', severity: 'warning', summary: 'S.', description: 'D.', runbook: 'x.md' } as const;
    // @ts-expect-error: every alert states its meaning
    alert(base);
    // @ts-expect-error: a fault names its class
    alert({ ...base, meaning: { role: 'fault', signal: 'alert', citation: 'c', route: 'controller' } });
    // @ts-expect-error: a self-monitoring alert is no fault of any class
    alert({ ...base, meaning: { role: 'self-monitoring', signal: 'alert', route: 'humans', faultClass: 'machine' } });
    // @ts-expect-error: an Xid fault says whether it is always fatal
    alert({ ...base, meaning: { role: 'xid-fault', signal: 'xid', route: 'controller' } });
    const fault = alert({ ...base, meaning: { role: 'fault', faultClass: 'transient', signal: 'alert', citation: 'c', route: 'controller' } });
    expect(fault.meaning.role).toBe('fault');
  });
});
