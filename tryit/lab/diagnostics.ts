/**
 * The lab's stop-time checks (docs/agent.md, diagnose): a reference computation with the node's
 * PyTorch, and its neighbours reachable on the network (their slurmd port), the lab's stand-ins
 * for the GPU tests and the NCCL all-gather with the neighbour.
 */
export const LAB_DIAGNOSTICS = {
  checks: [
    {
      name: 'torch-compute',
      command: [
        '/usr/bin/python3',
        '-c',
        'import torch; torch.manual_seed(0); x = torch.randn(256, 256); assert torch.isfinite(x @ x).all(); print("matmul ok")',
      ],
      timeoutSeconds: 60,
    },
    {
      name: 'peers-reachable',
      command: [
        '/usr/bin/python3',
        '-c',
        'import os, socket\nfor peer in filter(None, os.environ.get("STEADFAST_DIAGNOSE_PEERS", "").split(",")):\n    socket.create_connection((peer, 6818), timeout=5).close()\n    print(peer, "reachable")',
      ],
      timeoutSeconds: 30,
      standby: false,
    },
  ],
};
