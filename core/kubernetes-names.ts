/**
 * Kubernetes object names and label selectors as the API server validates them
 * (apimachinery validation: IsDNS1123Label, IsQualifiedName, IsValidLabelValue), checked
 * before a job spec is stored and again before a request leaves, so that nothing a client
 * sent can widen a selector or address another object.
 */

/** A namespace: an RFC 1123 label, at most 63 characters. */
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
/** A DNS subdomain (a label key's prefix), at most 253 characters. */
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
/** The name part of a label key, and a label value: at most 63 characters, alphanumeric at both ends. */
const LABEL_NAME = /^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
/** Longest selector accepted; a job selects its pods with one or two terms. */
const MAX_SELECTOR_LENGTH = 1024;

export function isNamespace(text: string): boolean {
  return DNS_LABEL.test(text);
}

/** A label value as a selector term may name it; empty is refused (a template left unfilled, not a choice). */
export function isLabelValue(text: string): boolean {
  return LABEL_NAME.test(text);
}

/** `[prefix/]name`, e.g. `training.kubeflow.org/job-name`. */
export function isLabelKey(text: string): boolean {
  const slash = text.indexOf('/');
  if (slash === -1) return LABEL_NAME.test(text);
  const prefix = text.slice(0, slash);
  return prefix.length <= 253 && DNS_SUBDOMAIN.test(prefix) && LABEL_NAME.test(text.slice(slash + 1));
}

/** Equality terms only (`key=value`, `key==value`, `key!=value`), comma-separated. */
export function isEqualityLabelSelector(selector: string): boolean {
  if (selector.length === 0 || selector.length > MAX_SELECTOR_LENGTH) return false;
  return selector.split(',').every((term) => {
    const match = /^([^=!]+)(==|=|!=)([^=!]*)$/.exec(term);
    return match !== null && isLabelKey(match[1] ?? '') && isLabelValue(match[3] ?? '');
  });
}

export const EQUALITY_SELECTOR_RULE =
  'must be equality terms like training.kubeflow.org/job-name=llama: a label key, "=", "==" or "!=", and a label value of 1-63 letters, digits, "-", "_" or ".", alphanumeric at both ends';
