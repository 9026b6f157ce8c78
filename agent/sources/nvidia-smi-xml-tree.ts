import { parse as parseXml, type TNode } from 'txml/txml';

/**
 * nvidia-smi's XML document as a tree of plain records, for agent/sources/nvidia-smi-xml.ts:
 * an element holding only text is its text; any other is a record of its attributes (`@_name`)
 * and its child elements by name, a name seen twice an array.
 */

export type XmlNode = Record<string, unknown>;

/**
 * One element as the readers take it: an element holding only text is its text (trimmed
 * later, per field); any other is a record of its attributes (`@_name`) and its child elements by
 * name, a name seen twice an array. Records have no prototype, so an element named `__proto__` or
 * `constructor` is only data. `supported_clocks` (every clock pair a GPU supports) is left out,
 * where withoutSupportedClocks did not already cut it.
 */
function element(node: TNode): unknown {
  const attributes = Object.entries(node.attributes);
  if (attributes.length === 0 && node.children.every((entry) => typeof entry === 'string')) return node.children.join('');
  const record: XmlNode = Object.create(null) as XmlNode;
  for (const [name, value] of attributes) record[`@_${name}`] = value ?? '';
  const texts: string[] = [];
  for (const entry of node.children) {
    if (typeof entry === 'string') {
      texts.push(entry);
      continue;
    }
    if (entry.tagName === 'supported_clocks') continue;
    const value = element(entry);
    const before = Object.hasOwn(record, entry.tagName) ? record[entry.tagName] : undefined;
    record[entry.tagName] = before === undefined ? value : Array.isArray(before) ? [...(before as unknown[]), value] : [before, value];
  }
  if (texts.length > 0) record['#text'] = texts.join('');
  return record;
}

const CLOCKS_OPEN = '<supported_clocks>';
const CLOCKS_CLOSE = '</supported_clocks>';

/**
 * The document without its `supported_clocks` elements (half of an H100's document, read by
 * nothing here), cut out with the string's own search before the parse: parsing them took as long
 * as the rest. Each cut keeps its line breaks, so a parse error names the line of the original.
 */
function withoutSupportedClocks(xml: string): string {
  let kept = '';
  let from = 0;
  for (;;) {
    const start = xml.indexOf(CLOCKS_OPEN, from);
    if (start < 0) break;
    const end = xml.indexOf(CLOCKS_CLOSE, start);
    // Unclosed: left to the parser, which refuses the document.
    if (end < 0) break;
    let lines = 0;
    for (let at = xml.indexOf('\n', start); at >= 0 && at < end; at = xml.indexOf('\n', at + 1)) lines += 1;
    kept += xml.slice(from, start) + '\n'.repeat(lines);
    from = end + CLOCKS_CLOSE.length;
  }
  return from === 0 ? xml : kept + xml.slice(from);
}

/**
 * The element named `rootName` at the top of the document, as a record (undefined when absent).
 * txml scans with the string's own search functions: several times faster than a parser walking
 * characters, which matters to an agent that starts in well under a second and runs without an
 * optimising compiler. No tag is void in nvidia-smi's documents. Throws where the tags do not match.
 */
export function readXmlRoot(xml: string, rootName: string): unknown {
  const top = parseXml(withoutSupportedClocks(xml), { selfClosingTags: [], decodeEntities: true });
  const rootNode = top.find((entry): entry is TNode => typeof entry !== 'string' && entry.tagName === rootName);
  return rootNode === undefined ? undefined : element(rootNode);
}
