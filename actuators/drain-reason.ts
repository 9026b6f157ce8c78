/**
 * Whose drain is it? A scheduler keeps one reason per node (Slurm's Reason, steadfast's reason
 * annotation on Kubernetes), and an administrator, another tool or Slurm's node health check may
 * have taken the node out before steadfast did. steadfast's own words always start with
 * `steadfast:`; anything in front of them is someone else's and is kept, first, as they wrote
 * it (NVSentinel, NVIDIA/NVSentinel#1424 and #1633: a remedy tool that overwrote or resumed an
 * administrator's drain put a node under repair back into service).
 */

/** How every reason steadfast writes begins. */
export const OWN_REASON_PREFIX = 'steadfast:';

/** Between someone else's reason and steadfast's, when both are kept on one node. */
export const REASON_SEPARATOR = '; ';

/**
 * Words Slurm itself puts in front of a reason while carrying out steadfast's own request
 * (`scontrol reboot ASAP` shows `Reboot ASAP : <reason>`): not someone else's drain.
 */
const SCHEDULER_OWN_WORDS = /^(reboot asap|reboot issued|reboot requested)\s*:?\s*$/i;

export interface SplitReason {
  /** Someone else's part, as they wrote it; undefined when the reason is steadfast's alone (or absent). */
  readonly foreign?: string | undefined;
  /** steadfast's part, from its `steadfast:` on; undefined when steadfast wrote none. */
  readonly own?: string | undefined;
}

/**
 * Splits a node's reason at steadfast's part: the first `steadfast:` at the start or after a
 * separator (`;`, `:` or a space). Everything before it is someone else's.
 */
export function splitReason(reason: string | undefined): SplitReason {
  const text = reason?.trim() ?? '';
  if (text === '') return {};
  const match = /(^|[;:,\s])steadfast:/.exec(text);
  if (match === null) return { foreign: text };
  const start = match.index + match[1]!.length;
  const own = text.slice(start).trim();
  const before = text
    .slice(0, start)
    .replace(/[;,\s]+$/, '')
    .trim();
  return { foreign: before === '' || SCHEDULER_OWN_WORDS.test(before) ? undefined : before, own };
}

/** The reason to write when steadfast drains a node now: someone else's kept first, steadfast's after it. */
export function appendOwnReason(current: string | undefined, own: string): string {
  const { foreign } = splitReason(current);
  return foreign === undefined ? own : `${foreign}${REASON_SEPARATOR}${own}`;
}
