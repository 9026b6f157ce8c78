import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

const run = promisify(execFile);

// The probe runs in a process of its own, so that the load a bench makes in its own process does not delay it.
const PROBE_SCRIPT = `
const [url, count] = process.argv.slice(1);
const latencies = [];
for (let index = 0; index < Number(count); index += 1) {
  const started = performance.now();
  const response = await fetch(url + '/healthz');
  await response.arrayBuffer();
  latencies.push(performance.now() - started);
  await new Promise((resolve) => setTimeout(resolve, 10));
}
console.log(JSON.stringify(latencies));
`;

/** `count` sequential GET /healthz of the controller at `url`, 10 ms apart: their latencies in ms, sorted. */
export async function probeHealthz(url: string, count: number): Promise<number[]> {
  const { stdout } = await run(process.execPath, ['--input-type=module', '-e', PROBE_SCRIPT, url, String(count)]);
  return (JSON.parse(stdout) as number[]).sort((a, b) => a - b);
}
