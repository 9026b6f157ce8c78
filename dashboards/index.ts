/**
 * Every steadfast dashboard as Grafana JSON, plus the provisioning files that load them.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { stringify } from 'yaml';
import { InputError } from '../core/errors.js';
import { STEADFAST_TAG } from './frame.js';
import { fleetDashboard } from './fleet.js';
import { networkDashboard } from './network.js';
import { nodeDashboard } from './node.js';
import { selfDashboard } from './self.js';
import { storageDashboard } from './storage.js';
import { trainingDashboard } from './training.js';

export interface BuiltDashboard {
  uid: string;
  title: string;
  json: object;
}

export const DEFAULT_PROMETHEUS_URL = 'http://127.0.0.1:9090';
/** Grafana folder the provisioned dashboards appear in. */
export const GRAFANA_FOLDER = STEADFAST_TAG;
export const PROVISIONED_DATASOURCE_UID = 'steadfast-prometheus';

/**
 * The schema version written into every dashboard: Grafana 10.0's. The SDK writes the newest it
 * knows (Grafana 12's); Grafana 10 and 11 load a dashboard from a newer schema without running
 * any migration and without checking it, while from 38 each runs its own migrations forward.
 */
export const GRAFANA_SCHEMA_VERSION = 38;

export function buildDashboards(): BuiltDashboard[] {
  return [fleetDashboard(), nodeDashboard(), trainingDashboard(), networkDashboard(), storageDashboard(), selfDashboard()].map((dashboard) => {
    const { uid, title } = dashboard;
    if (!uid || !title) throw new Error('every dashboard needs a uid and a title');
    // A JSON round trip leaves the plain object Grafana reads, without undefined fields.
    const json = { ...(JSON.parse(JSON.stringify(dashboard)) as object), schemaVersion: GRAFANA_SCHEMA_VERSION };
    return { uid, title, json };
  });
}

export interface WriteOptions {
  /** URL Grafana reaches Prometheus at (default http://127.0.0.1:9090). */
  prometheusUrl?: string;
  /**
   * The dashboards folder as Grafana sees it; differs from `<outDir>/dashboards` when Grafana
   * runs in a container with the folder mounted elsewhere. Default: that folder, absolute.
   */
  dashboardsPath?: string;
}

function checkUrl(url: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new InputError(`Prometheus URL "${url}" is not a URL`, 'prometheusUrl');
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
    throw new InputError(`Prometheus URL "${url}" must use http or https`, 'prometheusUrl');
  }
  return url;
}

export function dashboardProvider(dashboardsPath: string): object {
  return {
    apiVersion: 1,
    providers: [
      {
        name: 'steadfast',
        orgId: 1,
        folder: GRAFANA_FOLDER,
        type: 'file',
        disableDeletion: false,
        allowUiUpdates: false,
        updateIntervalSeconds: 30,
        options: { path: dashboardsPath, foldersFromFilesStructure: false },
      },
    ],
  };
}

export function prometheusDatasource(url: string): object {
  return {
    apiVersion: 1,
    datasources: [
      {
        name: 'steadfast Prometheus',
        uid: PROVISIONED_DATASOURCE_UID,
        type: 'prometheus',
        access: 'proxy',
        url: checkUrl(url),
        editable: true,
      },
    ],
  };
}

/**
 * Writes `<outDir>/dashboards/<uid>.json` for every dashboard and the Grafana provisioning files
 * `<outDir>/provisioning/{dashboards,datasources}/steadfast.yaml`. Returns the written paths.
 */
export function writeDashboards(outDir: string, options: WriteOptions = {}): string[] {
  const dashboardsDir = resolve(outDir, 'dashboards');
  const datasources = prometheusDatasource(options.prometheusUrl ?? DEFAULT_PROMETHEUS_URL);
  const files: [string, string][] = buildDashboards().map(({ uid, json }) => [join(dashboardsDir, `${uid}.json`), `${JSON.stringify(json, null, 2)}\n`]);
  files.push(
    [resolve(outDir, 'provisioning', 'dashboards', 'steadfast.yaml'), stringify(dashboardProvider(options.dashboardsPath ?? dashboardsDir))],
    [resolve(outDir, 'provisioning', 'datasources', 'steadfast.yaml'), stringify(datasources)],
  );
  for (const [path, text] of files) {
    mkdirSync(dirname(path), { recursive: true });
    writeFileSync(path, text);
  }
  return files.map(([path]) => path);
}
