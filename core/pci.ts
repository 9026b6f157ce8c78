/** PCI bus ids of GPUs, as the agent and the controller spell them. */

/** PCI bus id of a GPU as the driver logs it: `dddd:bb:dd`, lower case, no function digit. */
export const PCI_BUS_ID_PATTERN = /^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}$/;

/**
 * Normalises the PCI address spellings seen in the wild to `dddd:bb:dd`:
 * `PCI:0000:3b:00` (Xid lines), `0000:b3:00.0` (kernel messages), `00000000:3B:00.0`
 * (nvidia-smi, 8-digit domain). Returns undefined for anything else.
 */
export function normalizePciBusId(raw: string): string | undefined {
  const match = /^(?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?$/.exec(raw.trim());
  if (!match) return undefined;
  const [, domain = '', bus = '', device = ''] = match;
  return `${domain.slice(-4)}:${bus}:${device}`.toLowerCase();
}
