/**
 * What an Xid code means for a training job, summarised in our own words from NVIDIA's public
 * Xid catalogue (docs.nvidia.com/deploy/xid-errors). The exporter labels counters with the
 * severity; the controller's policy acts on `fatal` (ByteRobust §4: GPU faults with an explicit
 * signal are high-confidence machine faults, evicted without further diagnosis).
 */

export type XidSeverity = 'fatal' | 'warning' | 'info';

/** The remedy NVIDIA's catalogue points to. */
export type XidRemedy = 'reboot_node' | 'reset_gpu' | 'restart_app' | 'watch' | 'none';

export interface XidClass {
  readonly severity: XidSeverity;
  readonly remedy: XidRemedy;
  readonly meaning: string;
}

const CATALOGUE: ReadonlyMap<number, XidClass> = new Map<number, XidClass>([
  [8, { severity: 'warning', remedy: 'restart_app', meaning: 'GPU stopped responding to a channel' }],
  [13, { severity: 'warning', remedy: 'restart_app', meaning: 'graphics engine exception, usually the application' }],
  [31, { severity: 'warning', remedy: 'restart_app', meaning: 'GPU memory page fault, usually the application' }],
  [32, { severity: 'warning', remedy: 'restart_app', meaning: 'corrupted push buffer stream' }],
  [38, { severity: 'warning', remedy: 'reset_gpu', meaning: 'driver firmware error' }],
  [43, { severity: 'info', remedy: 'restart_app', meaning: 'GPU stopped processing a channel after an application fault' }],
  [45, { severity: 'info', remedy: 'none', meaning: 'channel cleaned up after an earlier error' }],
  [48, { severity: 'fatal', remedy: 'reset_gpu', meaning: 'uncorrectable double-bit ECC error' }],
  [61, { severity: 'fatal', remedy: 'reset_gpu', meaning: 'internal micro-controller breakpoint' }],
  [62, { severity: 'fatal', remedy: 'reset_gpu', meaning: 'internal micro-controller halted' }],
  [63, { severity: 'warning', remedy: 'reset_gpu', meaning: 'memory row marked for remapping, takes effect at the next GPU reset' }],
  [64, { severity: 'fatal', remedy: 'reset_gpu', meaning: 'memory row remapping failed' }],
  [68, { severity: 'warning', remedy: 'restart_app', meaning: 'video decoder exception' }],
  [69, { severity: 'warning', remedy: 'restart_app', meaning: 'graphics engine class error' }],
  [74, { severity: 'fatal', remedy: 'reset_gpu', meaning: 'NVLink error' }],
  [79, { severity: 'fatal', remedy: 'reboot_node', meaning: 'GPU has fallen off the bus' }],
  [92, { severity: 'warning', remedy: 'watch', meaning: 'high single-bit ECC error rate' }],
  [94, { severity: 'warning', remedy: 'restart_app', meaning: 'contained ECC error, only the affected application is hit' }],
  [95, { severity: 'fatal', remedy: 'reset_gpu', meaning: 'uncontained ECC error' }],
  [109, { severity: 'warning', remedy: 'restart_app', meaning: 'context switch timeout' }],
  [119, { severity: 'fatal', remedy: 'reset_gpu', meaning: 'GSP firmware RPC timeout' }],
  [120, { severity: 'fatal', remedy: 'reset_gpu', meaning: 'GSP firmware error' }],
  [121, { severity: 'warning', remedy: 'watch', meaning: 'corrected chip-to-chip link error' }],
  [140, { severity: 'fatal', remedy: 'reset_gpu', meaning: 'unrecovered ECC error' }],
  [143, { severity: 'fatal', remedy: 'reset_gpu', meaning: 'GPU initialisation failure' }],
  [154, { severity: 'warning', remedy: 'watch', meaning: 'GPU recovery action changed' }],
]);

/** NVLink5 Xids carry their own verdict in the message (`... Nonfatal XC0 ...` or `... Fatal XC0 ...`). */
const NVLINK5_XIDS = new Set([144, 145, 146, 147, 148, 149, 150]);

/** Xid 154 states in its message the recovery action the driver now requires. */
const RECOVERY_ACTION_XID = 154;

/**
 * The Xid codes whose remedy is `remedy` whatever the message says, ascending: the rules select
 * on the `xid` label with these, so they and the agent's classification cannot disagree. The
 * NVLink5 family and Xid 154 are left out because their remedy comes from the message; their
 * fatal cases reach the rules through the agent's `severity` label instead.
 */
export function xidCodesWithRemedy(remedy: XidRemedy): number[] {
  return [...CATALOGUE]
    .filter(([code, entry]) => entry.remedy === remedy && code !== RECOVERY_ACTION_XID && !NVLINK5_XIDS.has(code))
    .map(([code]) => code)
    .sort((a, b) => a - b);
}

const UNKNOWN: XidClass = { severity: 'warning', remedy: 'watch', meaning: 'Xid not in the catalogue' };

/** How a table by code names an NVLink5 Xid: fatal or not, its message says. */
const NVLINK5_ENTRY: XidClass = { severity: 'warning', remedy: 'watch', meaning: 'NVLink5 error, fatal or non-fatal as its message says' };

/**
 * Whether an Xid's class comes from its message rather than its code (the NVLink5 family and
 * Xid 154): a table by code can only say "by message" for these.
 */
export function xidDecidedByMessage(code: number): boolean {
  return code === RECOVERY_ACTION_XID || NVLINK5_XIDS.has(code);
}

/** Every catalogued Xid with its class as the catalogue states it without a message, ascending; the NVLink5 family included. */
export function catalogueXids(): { readonly code: number; readonly xidClass: XidClass }[] {
  const codes = new Set([...CATALOGUE.keys(), ...NVLINK5_XIDS]);
  return [...codes].sort((a, b) => a - b).map((code) => ({ code, xidClass: NVLINK5_XIDS.has(code) ? NVLINK5_ENTRY : (CATALOGUE.get(code) ?? UNKNOWN) }));
}

/**
 * Classifies one Xid occurrence. The message matters for two families: NVLink5 errors state
 * whether they are fatal, and Xid 154 states the recovery action the driver now requires.
 */
export function classifyXid(code: number, message = ''): XidClass {
  if (NVLINK5_XIDS.has(code)) {
    const fatal = /\bFatal\b/.test(message) && !/\bNonfatal\b/i.test(message);
    return fatal
      ? { severity: 'fatal', remedy: 'reset_gpu', meaning: 'fatal NVLink5 error' }
      : { severity: 'warning', remedy: 'watch', meaning: 'non-fatal NVLink5 error' };
  }
  if (code === RECOVERY_ACTION_XID) {
    const to = /changed from .* to (0x[0-9a-fA-F]+) \(([^)]*)\)/.exec(message);
    const target = to?.[2] ?? '';
    // The meaning names the remedy in our words, never the message's: it ends up in drain reasons.
    if (/reboot/i.test(target)) return { severity: 'fatal', remedy: 'reboot_node', meaning: 'GPU recovery action is now a node reboot' };
    if (/reset|drain/i.test(target)) return { severity: 'fatal', remedy: 'reset_gpu', meaning: 'GPU recovery action is now a GPU reset' };
    return CATALOGUE.get(RECOVERY_ACTION_XID) ?? UNKNOWN;
  }
  return CATALOGUE.get(code) ?? UNKNOWN;
}
