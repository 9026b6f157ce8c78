"""One process of test_steadfast_hotswap.py's jobs: a tiny DDP loop under HotSwap, as a user's
train.py would run it, printing one JSON line per completed iteration (and the runtime's lines).

Environment: the runtime's (STEADFAST_NODE, STEADFAST_CONTROLLER_URL, STEADFAST_RENDEZVOUS,
STEADFAST_REPLICA_HOSTS) and TEST_ITERATIONS, TEST_STEP_PAUSE (seconds between iterations, so
that a test can act while the job trains).
"""

import json
import os
import sys
import time
from datetime import timedelta

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from steadfast_client import SteadfastClient  # noqa: E402
from steadfast_hotswap import HotSwap  # noqa: E402


def main() -> None:
    iterations = int(os.environ["TEST_ITERATIONS"])
    pause = float(os.environ.get("TEST_STEP_PAUSE", "0"))
    torch.set_num_threads(1)
    client = SteadfastClient.from_env(job="hs", rank=0, timeout=2.0)
    runtime = HotSwap.from_env(client, timeout=timedelta(seconds=15), swap_wait=30.0, poll_seconds=0.2)
    if runtime.join() is None:
        print(json.dumps({"released": True}), flush=True)
        return
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    # Momentum: the optimizer's own state must come back with the model for the losses to match.
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    runtime.protect(net, optimizer, wrap=lambda module, group: DistributedDataParallel(module, process_group=group))
    while runtime.iteration <= iterations:
        with runtime.step() as iteration:
            data = torch.Generator().manual_seed(iteration * 1009 + runtime.shard)
            x = torch.randn(16, 8, generator=data)
            y = x.sum(dim=1, keepdim=True).sin()
            optimizer.zero_grad()
            model = runtime.model
            with model.no_sync():
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
            runtime.before_sync()
            (model(torch.zeros(1, 8)).sum() * 0).backward()  # the gradient all-reduce
            optimizer.step()
            del model
            print(json.dumps({"shard": runtime.shard, "iteration": iteration, "loss": loss.item(), "epoch": runtime.epoch}), flush=True)
        if pause:
            time.sleep(pause)  # pacing, not a wait
    torch.distributed.barrier()
    runtime.finish()
    client.close(0.5)


if __name__ == "__main__":
    main()
