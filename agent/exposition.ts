import type { Metric, Registry } from 'prom-client';

/**
 * Prometheus text exposition (format 0.0.4) of a prom-client registry, byte for byte what
 * `registry.metrics()` writes. prom-client keeps the metric state; this only encodes it, without
 * the per-sample label-object allocations that made its encoder a fifth of the agent's scrape
 * CPU (bench/scrape.ts). test/agent/exposition.test.ts pins the equality.
 */

const NEEDS_ESCAPE = /[\\\n"]/;

function escapeText(text: string): string {
  return text.replace(/\\/g, '\\\\').replace(/\n/g, '\\n');
}

function escapeLabelValue(value: string): string {
  return NEEDS_ESCAPE.test(value) ? escapeText(value).replace(/"/g, '\\"') : value;
}

function formatValue(value: number): string {
  if (Number.isNaN(value)) return 'Nan';
  if (!Number.isFinite(value)) return value < 0 ? '-Inf' : '+Inf';
  return `${value}`;
}

function formatLabels(labels: Readonly<Record<string, string | number | undefined>>): string {
  let text = '';
  for (const name in labels) {
    const value = labels[name];
    text += `${text === '' ? '{' : ','}${name}="${typeof value === 'string' ? escapeLabelValue(value) : String(value)}"`;
  }
  return text === '' ? '' : `${text}}`;
}

export async function encodeExposition(registry: Registry): Promise<string> {
  const blocks = await Promise.all(
    // prom-client types the registered metrics as plain descriptions; they are Metric instances.
    (registry.getMetricsAsArray() as unknown as Metric[]).map(async (metric) => {
      const data = await metric.get();
      const name = escapeText(data.name);
      let block = `# HELP ${name} ${escapeText(data.help)}\n# TYPE ${name} ${data.type}`;
      for (const sample of data.values as { value: number; labels: Record<string, string | number | undefined>; metricName?: string }[]) {
        block += `\n${sample.metricName ?? name}${formatLabels(sample.labels)} ${formatValue(sample.value)}`;
      }
      return block;
    }),
  );
  return `${blocks.join('\n\n')}\n`;
}
