import { Counter, Gauge, type Registry } from 'prom-client';

/**
 * A series several parts of the agent may ask for on one registry (collectors sharing the GPU
 * source, a second collector of a kind in tests): the one already registered under the name, or
 * a new one registered there.
 */

interface SharedMetric<L extends string> {
  readonly name: string;
  readonly help: string;
  readonly labelNames?: readonly L[];
}

export function sharedGauge<L extends string = never>(registry: Registry, metric: SharedMetric<L>): Gauge<L> {
  const existing = registry.getSingleMetric(metric.name);
  if (existing instanceof Gauge) return existing as Gauge<L>;
  return new Gauge<L>({ ...metric, labelNames: metric.labelNames ?? [], registers: [registry] });
}

export function sharedCounter<L extends string = never>(registry: Registry, metric: SharedMetric<L>): Counter<L> {
  const existing = registry.getSingleMetric(metric.name);
  if (existing instanceof Counter) return existing as Counter<L>;
  return new Counter<L>({ ...metric, labelNames: metric.labelNames ?? [], registers: [registry] });
}
