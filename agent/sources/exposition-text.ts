/**
 * A parser of the Prometheus text exposition format (version 0.0.4), for reading another
 * exporter's /metrics (dcgm-exporter, for the `gpu` collector). Lenient per line: one bad line
 * costs that sample, never the rest of the scrape.
 */

export interface ExpositionSample {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
  /** Milliseconds since the epoch, when the line carries one. */
  readonly timestampMs?: number | undefined;
}

export interface ExpositionLineError {
  /** 1-based. */
  readonly line: number;
  readonly message: string;
}

export interface ExpositionText {
  readonly samples: readonly ExpositionSample[];
  /** `# TYPE` lines: metric family name → type. */
  readonly types: ReadonlyMap<string, string>;
  /** The first MAX_KEPT_ERRORS lines that were not valid; each was skipped. */
  readonly errors: readonly ExpositionLineError[];
  readonly errorCount: number;
}

/** Enough to say what is wrong with an endpoint without keeping a whole garbage body in memory. */
const MAX_KEPT_ERRORS = 20;

const METRIC_NAME = '[a-zA-Z_:][a-zA-Z0-9_:]*';
const LABEL_NAME = '[a-zA-Z_][a-zA-Z0-9_]*';
const FLOAT = /^(?:[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?Inf|NaN)$/i;
const TIMESTAMP = /^-?\d{1,19}$/;

class LineError extends Error {}

/** Reads one sample line with a cursor; every method throws LineError on bad input. */
class SampleLineReader {
  private position = 0;

  constructor(private readonly line: string) {}

  read(): ExpositionSample {
    const name = this.token(METRIC_NAME, 'metric name');
    let labels: Record<string, string> = {};
    if (this.line[this.position] === '{') labels = this.labels();
    if (this.line[this.position] !== ' ' && this.line[this.position] !== '\t') throw new LineError(`expected a space at column ${this.position + 1}`);
    const [valueText = '', timestampText, ...extra] = this.line
      .slice(this.position)
      .trim()
      .split(/[ \t]+/);
    if (!FLOAT.test(valueText)) throw new LineError(`value "${valueText.slice(0, 40)}" is not a number`);
    if (timestampText !== undefined && !TIMESTAMP.test(timestampText)) throw new LineError(`timestamp "${timestampText.slice(0, 40)}" is not an integer`);
    if (extra.length > 0) throw new LineError('unexpected text after the timestamp');
    return { name, labels, value: parseFloatToken(valueText), timestampMs: timestampText === undefined ? undefined : Number(timestampText) };
  }

  private token(source: string, what: string): string {
    // A fresh sticky expression per call: a shared one would carry lastIndex between callers.
    const pattern = new RegExp(source, 'y');
    pattern.lastIndex = this.position;
    const match = pattern.exec(this.line);
    if (!match) throw new LineError(`expected a ${what} at column ${this.position + 1}`);
    this.position = pattern.lastIndex;
    return match[0];
  }

  private skipBlanks(): void {
    while (this.line[this.position] === ' ' || this.line[this.position] === '\t') this.position += 1;
  }

  private expect(character: string): void {
    if (this.line[this.position] !== character) throw new LineError(`expected "${character}" at column ${this.position + 1}`);
    this.position += 1;
  }

  private labels(): Record<string, string> {
    const labels: Record<string, string> = Object.create(null) as Record<string, string>;
    this.expect('{');
    for (;;) {
      this.skipBlanks();
      if (this.line[this.position] === '}') break;
      const name = this.token(LABEL_NAME, 'label name');
      if (Object.hasOwn(labels, name)) throw new LineError(`label "${name}" given twice`);
      this.skipBlanks();
      this.expect('=');
      this.skipBlanks();
      labels[name] = this.quoted();
      this.skipBlanks();
      if (this.line[this.position] === ',') {
        this.position += 1;
        continue;
      }
      if (this.line[this.position] !== '}') throw new LineError(`expected "," or "}" at column ${this.position + 1}`);
    }
    this.position += 1;
    return { ...labels };
  }

  /** A label value: `\\`, `\"` and `\n` are the only escapes the format has. */
  private quoted(): string {
    this.expect('"');
    let value = '';
    for (;;) {
      const character = this.line[this.position];
      if (character === undefined) throw new LineError('label value has no closing quote');
      this.position += 1;
      if (character === '"') return value;
      if (character !== '\\') {
        value += character;
        continue;
      }
      const escaped = this.line[this.position];
      this.position += 1;
      if (escaped === '\\' || escaped === '"') value += escaped;
      else if (escaped === 'n') value += '\n';
      else throw new LineError(`unknown escape "\\${escaped ?? ''}" in a label value`);
    }
  }
}

function parseFloatToken(token: string): number {
  const lower = token.toLowerCase();
  if (lower === 'nan') return Number.NaN;
  if (lower.endsWith('inf')) return lower.startsWith('-') ? Number.NEGATIVE_INFINITY : Number.POSITIVE_INFINITY;
  return Number(token);
}

/**
 * Parses Prometheus text exposition. Never throws: a line that is not valid is skipped and
 * listed in `errors`, so one bad line from an exporter does not lose the rest of the scrape.
 */
export function parseExpositionText(text: string): ExpositionText {
  const samples: ExpositionSample[] = [];
  const types = new Map<string, string>();
  const errors: ExpositionLineError[] = [];
  let errorCount = 0;
  const lines = text.split('\n');
  for (let index = 0; index < lines.length; index += 1) {
    const line = (lines[index] ?? '').replace(/\r$/, '');
    if (line.trim() === '') continue;
    if (line.startsWith('#')) {
      const type = /^#[ \t]+TYPE[ \t]+([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t]+(\w+)[ \t]*$/.exec(line);
      if (type?.[1] !== undefined && type[2] !== undefined) types.set(type[1], type[2]);
      // HELP and any other comment carry nothing the mapping needs.
      continue;
    }
    try {
      samples.push(new SampleLineReader(line).read());
    } catch (error) {
      if (!(error instanceof LineError)) throw error;
      errorCount += 1;
      if (errors.length < MAX_KEPT_ERRORS) errors.push({ line: index + 1, message: error.message });
    }
  }
  return { samples, types, errors, errorCount };
}
