"""Runs examples/pytorch/train.py as it is, with the hot swap's one wait timed (bench/hot-swap-overhead.ts).

``HotSwap.before_sync`` waits until the previous step's host copy and its replica are committed
(clients/python/steadfast_hotswap.py); the runtime does not report how long. This wraps it and
prints one line per call, ``[probe] rank R before_sync wait S s``, then hands over to train.py
with the same arguments. Without --hot-swap nothing is wrapped that the run calls.

    /usr/bin/python3 bench/hot_swap_probe.py [train.py's arguments]
"""

import os
import runpy
import sys
import time
from typing import Any

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TRAIN = os.path.join(ROOT, "examples", "pytorch", "train.py")
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

import steadfast_hotswap  # noqa: E402

_before_sync = steadfast_hotswap.HotSwap.before_sync


def _timed_before_sync(self: Any) -> None:
    started = time.perf_counter()
    try:
        _before_sync(self)
    finally:
        print("[probe] rank %s before_sync wait %.6fs" % (self.shard, time.perf_counter() - started), flush=True)


steadfast_hotswap.HotSwap.before_sync = _timed_before_sync  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.argv = [TRAIN] + sys.argv[1:]
    runpy.run_path(TRAIN, run_name="__main__")
