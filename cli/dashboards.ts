import { resolve } from 'node:path';
import { Command } from 'commander';
import { DEFAULT_PROMETHEUS_URL, GRAFANA_FOLDER, buildDashboards, writeDashboards } from '../dashboards/index.js';
import { runCommand } from './common.js';

interface DashboardsOptions {
  out: string;
  prometheusUrl: string;
  dashboardsPath?: string;
}

function loadingHelp(outDir: string, dashboardsPath: string): string {
  const jsonFiles = buildDashboards().map(({ uid }) => resolve(outDir, 'dashboards', `${uid}.json`));
  return [
    '',
    'To load them into Grafana, either:',
    `  - provision: copy ${resolve(outDir, 'provisioning')}/{dashboards,datasources}/steadfast.yaml into Grafana's`,
    '    provisioning directory (/etc/grafana/provisioning) and restart Grafana. The provider reads',
    `    ${dashboardsPath} into the "${GRAFANA_FOLDER}" folder. Grafana in a container sees other paths:`,
    '    mount this directory there and write again with --dashboards-path <path inside the container>',
    '    and a --prometheus-url the container can reach;',
    '  - or import: Dashboards > New > Import in the Grafana UI, uploading each JSON file, or the HTTP API:',
    ...jsonFiles.map(
      (file) =>
        `      jq '{dashboard: ., overwrite: true}' ${file} | curl -sS -u admin:admin -H 'Content-Type: application/json' --data-binary @- http://localhost:3000/api/dashboards/db`,
    ),
    'Pick the Prometheus that scrapes the steadfast agents and controller in each dashboard\'s "Prometheus" variable.',
    '',
  ].join('\n');
}

export function dashboardsCommand(): Command {
  return new Command('dashboards')
    .description(
      'Write the steadfast Grafana dashboards as JSON, plus Grafana provisioning files (a dashboard provider and a Prometheus datasource), and print how to load them.',
    )
    .requiredOption('-o, --out <dir>', 'directory to write dashboards/ and provisioning/ into')
    .option('--prometheus-url <url>', 'URL Grafana reaches Prometheus at, for the provisioned datasource', DEFAULT_PROMETHEUS_URL)
    .option('--dashboards-path <path>', 'the dashboards folder as Grafana sees it, for the provider (default: <out>/dashboards, absolute)')
    .action(async (options: DashboardsOptions) => {
      await runCommand(async () => {
        const written = writeDashboards(options.out, { prometheusUrl: options.prometheusUrl, dashboardsPath: options.dashboardsPath });
        process.stdout.write(`Wrote ${written.length} files:\n${written.map((path) => `  ${path}\n`).join('')}`);
        process.stdout.write(loadingHelp(options.out, options.dashboardsPath ?? resolve(options.out, 'dashboards')));
      });
    });
}
