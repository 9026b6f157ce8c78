import { z } from 'zod';
import { DCGM_MODES } from './validation.js';

// Numbers are coerced so that environment overrides, which are always strings, validate too.
const number = () => z.coerce.number<unknown>();

/**
 * The `validation:` section: before steadfast returns a node to service (after its GPU reset, its
 * reboot, `steadfast resume`) or trusts a warm standby, the node's agent runs a burn under load and,
 * where DCGM is installed, `dcgmi diag -r 2` (core/validation.ts), and the burn's throughput is
 * compared with the node's peers. Off by default: with it off every return to service is as before.
 */
export const validationSchema = z
  .object({
    enabled: z.boolean().default(false),
    /**
     * The whole validation, as the controller waits for it. The default fits the burn (15 s, plus
     * Python's and torch's start) and a `dcgmi diag -r 2`, which NVIDIA gives as about two minutes.
     */
    timeoutSeconds: number().int().min(10).max(3600).default(300),
    /** How long the burn runs on every device at once. */
    burnSeconds: number().min(1).max(600).default(15),
    /** A node whose burn throughput is below this share of its peers' median is slow and fails. */
    minPeerFraction: number().gt(0).max(1).default(0.8),
    /** Peers: other nodes of the same device model validated within this window. */
    peerWindowSeconds: number()
      .int()
      .min(60)
      .max(30 * 86_400)
      .default(7 * 86_400),
    /** With fewer peers than this, only the reference comparison decides. */
    minPeers: number().int().min(1).max(1000).default(3),
    /** Recent throughputs kept per node (bounded in Redis). */
    historyPerNode: number().int().min(1).max(100).default(10),
    dcgm: z.enum(DCGM_MODES).default('auto'),
  })
  .strict();
export type ValidationConfig = z.output<typeof validationSchema>;
