import { z } from 'zod';
import { parseOrThrow } from '../../core/validate.js';

/**
 * The multi-signal detector's settings (detector.ts): the features it scores and how, and the
 * thresholds of its scoring, persistence and own-normal memory, checked once, with their defaults.
 * Their own module so that the scoring (scoring.ts), the Prometheus source (source.ts) and the
 * detector read one definition without importing one another.
 */

export const DIRECTIONS = ['higher', 'lower', 'both'] as const;
/** Which deviations from the peers are bad: above them, below them, or either way. */
export type Direction = (typeof DIRECTIONS)[number];

export const featureSpecSchema = z
  .object({
    name: z.string().min(1).max(128),
    direction: z.enum(DIRECTIONS),
    /** Smallest scale, in the feature's own units: the difference that counts as one "σ" on a flat fleet. */
    minSpread: z.number().positive(),
    /** Smallest scale as a share of |peer median|; the detector's default when left out. */
    relativeSpread: z.number().min(0).optional(),
    /** A level (per device, in the feature's units, in its bad direction) that is strong evidence by itself, whatever the peers read. */
    alarmAt: z.number().optional(),
    /** A level at which the node is raised at once, without peers or persistence (a fatal or repeated Xid). */
    raiseAt: z.number().optional(),
    /**
     * An ordinary activity measure (utilization, traffic, power, clocks, iteration time, metadata
     * latency): what checkpoints, evaluations, data-loader stalls and uneven pipeline stages move
     * on one node now and then. Alone it makes no moment anomalous; a node that stands out on
     * activity features only is raised when that lasts (activityPersistence). Features without it
     * mean hardware (temperatures, throttle reasons, ECC, remaps, replays, link errors, Xids).
     */
    activity: z.boolean().optional(),
  })
  .strict();

export type FeatureSpec = z.input<typeof featureSpecSchema>;

const optionsSchema = z
  .object({
    features: z
      .array(featureSpecSchema)
      .min(1)
      .refine((features) => new Set(features.map((feature) => feature.name)).size === features.length, 'feature names must be unique'),
    /**
     * Fewest nodes of a group that must report a feature for a peer verdict on it. The median and
     * MAD stay put while fewer than half the values are wild; with 5 nodes two deviating ones
     * still leave the reference among the healthy three. With two nodes there is no telling
     * which of them is the odd one.
     */
    minPeers: z.int().min(3).default(5),
    hotZ: z.number().positive().default(3.5),
    clipZ: z.number().positive().default(6),
    minHotFeatures: z.int().min(1).default(2),
    minScore: z.number().min(0).default(8),
    /**
     * How far on the bad side of its peers a device must be now (robust σ of the peers, before
     * its own normal is taken off) for its change against its own normal to count: the own
     * normal forgives a node that always differs, and sharpens the view of one that drifts, but
     * never makes a suspect of a node that is merely at its peers' level.
     */
    minPeerZ: z.number().min(0).default(1),
    /** One feature this far from the node's peers (after its own normal) is enough on its own. */
    strongZ: z.number().positive().default(8),
    persistence: z
      .object({ k: z.int().min(1), n: z.int().min(1).max(1000) })
      .strict()
      .refine((value) => value.k <= value.n, 'k must not exceed n')
      .default({ k: 7, n: 9 }),
    /**
     * A node that stands out on activity features only is raised when it does so in k of the last
     * n evaluations (27 of 30: half an hour at the controller's one a minute), longer than a
     * checkpoint, an evaluation or a loader stall on one node lasts.
     */
    activityPersistence: z
      .object({ k: z.int().min(1), n: z.int().min(1).max(1000) })
      .strict()
      .refine((value) => value.k <= value.n, 'k must not exceed n')
      .default({ k: 27, n: 30 }),
    /** Short episodes that keep coming back: anomalous in `count` of the last `window` evaluations, in ≥ 2 separate runs. */
    episodes: z
      .object({ count: z.int().min(1), window: z.int().min(1).max(1000) })
      .strict()
      .refine((value) => value.count <= value.window, 'count must not exceed window')
      .default({ count: 9, window: 60 }),
    /** A moment where more than this share of a group is anomalous on peer evidence is a job-wide phase. */
    maxAnomalousShare: z.number().gt(0).max(1).default(0.3),
    baseline: z
      .object({
        everyMinutes: z.number().positive().default(5),
        samples: z.int().min(1).max(10_000).default(72),
        minSamples: z.int().min(1).default(6),
      })
      .strict()
      .refine((value) => value.minSamples <= value.samples, 'minSamples must not exceed samples')
      .default({ everyMinutes: 5, samples: 72, minSamples: 6 }),
    /**
     * Judge a node on peer evidence only once its own normal is learnt (baseline.minSamples
     * samples): until then it is judged on known-meaning levels (alarmAt, raiseAt) and silence
     * only. One node in eight or so simply runs warmer or draws differently than its peers; seen
     * for the first time it looks like a fault. The controller's watch learns from Prometheus'
     * history first and sets this; a replay over a window (`detect suspects`) does not, and says
     * how many readings its baseline had.
     */
    ownNormalFirst: z.boolean().default(false),
    /** Evaluations in a row a member of a reporting group may be silent before that is evidence. */
    silenceEvaluations: z.int().min(1).default(4),
    /** relativeSpread of features that do not set their own. */
    relativeSpread: z.number().min(0).default(0.01),
  })
  .strict()
  .refine((options) => options.clipZ >= options.hotZ, { message: 'clipZ must be at least hotZ', path: ['clipZ'] });

export type MultiSignalOptions = z.input<typeof optionsSchema>;
export type MultiSignalSettings = z.output<typeof optionsSchema>;

export function multiSignalSettings(options: MultiSignalOptions): MultiSignalSettings {
  return parseOrThrow(optionsSchema, options, 'multi-signal detector options');
}
