import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../core/paths.js';

/**
 * The example training script's rendezvous, run by the real python3 with a stand-in for
 * torch.distributed whose init_process_group fails as told: a transient failure (c10d's TCP store
 * interrupted, as seen in the lab) is tried again, anything else ends the rank at once.
 */
function rendezvousWith(failures: readonly string[]): { calls: number; error?: string; said: string[] } {
  const script = `
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("train", sys.argv[1])
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
train.time.sleep = lambda seconds: None
failures = json.loads(sys.argv[2])
calls = []
said = []
class Dist:
    def init_process_group(self, *args, **kwargs):
        calls.append(1)
        if len(calls) <= len(failures):
            raise RuntimeError(failures[len(calls) - 1])
try:
    train.rendezvous(Dist(), 1, 2, said.append)
    print(json.dumps({"calls": len(calls), "said": said}))
except RuntimeError as error:
    print(json.dumps({"calls": len(calls), "error": str(error), "said": said}))
`;
  const out = execFileSync('python3', ['-c', script, join(repoRoot(), 'examples', 'pytorch', 'train.py'), JSON.stringify(failures)], { encoding: 'utf8' });
  return JSON.parse(out) as { calls: number; error?: string; said: string[] };
}

describe('the example training script joins its rendezvous', () => {
  it('tries again when the TCP store was interrupted or the master was not listening yet', () => {
    const result = rendezvousWith(['Interrupted system call', 'Connection refused']);
    expect(result).toMatchObject({
      calls: 3,
      said: [expect.stringContaining('attempt 1 of 5 failed (Interrupted system call)'), expect.stringContaining('attempt 2 of 5')],
    });
    expect(result.error).toBeUndefined();
  });

  it('gives up after five transient failures, and at once on any other error', () => {
    expect(rendezvousWith(Array(6).fill('Interrupted system call'))).toMatchObject({ calls: 5, error: 'Interrupted system call' });
    expect(rendezvousWith(['NCCL error: unhandled system error'])).toMatchObject({ calls: 1, error: 'NCCL error: unhandled system error', said: [] });
  });
});
