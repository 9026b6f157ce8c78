/**
 * Synthetic `py-spy dump` text for stack-aggregation tests, shaped like a Megatron-LM rank under
 * torchrun: a `Process`/`Python` header, the training MainThread, and the helper threads a real
 * dump shows beside it (pin memory, an async checkpoint writer, an idle compile-worker reader).
 * Frames are `function (file:line)`, innermost first.
 */

const TRAIN_LOOP = [
  'forward_backward_pipelining_without_interleaving (megatron/core/pipeline_parallel/schedules.py:1412)',
  'train_step (megatron/training/training.py:1186)',
  'train (megatron/training/training.py:1654)',
  'pretrain (megatron/training/training.py:398)',
  '<module> (pretrain_gpt.py:283)',
];

/** Healthy ranks of ByteRobust Fig. 7: backward done, gradient synchronisation in the optimiser. */
export const GRAD_SYNC = [
  'wait (torch/distributed/distributed_c10d.py:3942)',
  'finish_grad_sync (megatron/core/distributed/param_and_grad_buffer.py:512)',
  'finish_grad_sync (megatron/core/distributed/distributed_data_parallel.py:421)',
  'finalize_model_grads (megatron/core/distributed/finalize_model_grads.py:262)',
  ...TRAIN_LOOP,
];

/** Last stage stuck producing activation gradients (Fig. 7, machine 15). */
export const STUCK_ALL_GATHER = [
  'all_gather_into_tensor (torch/distributed/distributed_c10d.py:3711)',
  'wrapper (torch/distributed/c10d_logger.py:83)',
  '_gather_along_first_dim (megatron/core/tensor_parallel/mappings.py:116)',
  'backward (megatron/core/tensor_parallel/mappings.py:301)',
  'apply (torch/autograd/function.py:307)',
  'backward (torch/autograd/__init__.py:347)',
  'backward (torch/_tensor.py:626)',
  'backward_step (megatron/core/pipeline_parallel/schedules.py:366)',
  ...TRAIN_LOOP,
];

function p2p(op: 'isend' | 'irecv', caller: string): string[] {
  return [
    `${op} (torch/distributed/distributed_c10d.py:${op === 'isend' ? 2103 : 2151})`,
    '_batched_p2p_ops (megatron/core/pipeline_parallel/p2p_communication.py:214)',
    '_communicate (megatron/core/pipeline_parallel/p2p_communication.py:410)',
    `${caller} (megatron/core/pipeline_parallel/p2p_communication.py:528)`,
    ...TRAIN_LOOP,
  ];
}

/** Fig. 7 machine 14 and machines 12-13. */
export const STUCK_ISEND = p2p('isend', 'send_backward_recv_forward');
export const STUCK_IRECV = p2p('irecv', 'recv_backward');

const PIN_MEMORY_THREAD = [
  'get (queue.py:180)',
  '_pin_memory_loop (torch/utils/data/_utils/pin_memory.py:53)',
  'run (threading.py:982)',
  '_bootstrap_inner (threading.py:1045)',
  '_bootstrap (threading.py:1002)',
];

const CHECKPOINT_WRITER_THREAD = [
  'write_items (torch/distributed/checkpoint/filesystem.py:422)',
  '_write_files_from_queue (torch/distributed/checkpoint/filesystem.py:375)',
  'run (threading.py:982)',
  '_bootstrap_inner (threading.py:1045)',
  '_bootstrap (threading.py:1002)',
];

export interface DumpOptions {
  /** Write install prefixes as a real `--full-filenames` dump would. */
  readonly fullPaths?: boolean;
  /** Added to every line number: another build of the same code. */
  readonly lineShift?: number;
}

function renderFrame(frame: string, options: DumpOptions): string {
  const match = /^(.*) \((.*):(\d+)\)$/.exec(frame);
  if (!match) return `    ${frame}`;
  const [, name = '', file = '', line = '0'] = match;
  const prefixed =
    options.fullPaths && /^(torch|megatron)\//.test(file)
      ? `/usr/local/lib/python3.10/dist-packages/${file}`
      : options.fullPaths && !file.includes('/') && !file.startsWith('pretrain')
        ? `/usr/lib/python3.10/${file}`
        : file;
  return `    ${name} (${prefixed}:${Number(line) + (options.lineShift ?? 0)})`;
}

/** One rank's dump: header, training MainThread with `main` frames, then helper threads. */
export function rankDump(pid: number, main: readonly string[], options: DumpOptions = {}): string {
  const thread = (id: number, state: string, name: string, frames: readonly string[]): string[] => [
    `Thread ${id} (${state}): "${name}"`,
    ...frames.map((frame) => renderFrame(frame, options)),
  ];
  return [
    `Process ${pid}: /usr/bin/python3 -u pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4`,
    'Python v3.10.12 (/usr/bin/python3.10)',
    '',
    ...thread(pid, 'active', 'MainThread', main),
    ...thread(pid + 17, 'idle', 'Thread-2 (_pin_memory_loop)', PIN_MEMORY_THREAD),
    ...thread(pid + 18, 'active', 'Thread-3 (_write_files_from_queue)', CHECKPOINT_WRITER_THREAD),
    '',
  ].join('\n');
}
