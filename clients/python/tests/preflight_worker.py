"""One node's process of test_steadfast_preflight.py's runs: steadfast_preflight as a node runs it,
with this node's link made slow or broken inside the process (the test has one machine, so the
fault is put where the all-reduce enters the network).

Environment: the preflight's own (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, STEADFAST_NODE,
STEADFAST_CONTROLLER_URL, STEADFAST_TOKEN_FILE, STEADFAST_JOB) and TEST_SLOW_NODES (each
collective on these nodes starts 0.6 s late: a slow link), TEST_BROKEN_NODES (each collective on
these nodes fails at once, leaving the partner to its timeout: a broken link).
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import steadfast_preflight  # noqa: E402


class _FaultyLink:
    def __init__(self, group, slow, broken):
        self.group, self.slow, self.broken = group, slow, broken

    def allreduce(self, tensors):
        if self.broken:
            raise RuntimeError("Connection reset by peer (the test's broken link)")
        if self.slow:
            time.sleep(0.6)
        return self.group.allreduce(tensors)


def main():
    node = os.environ["STEADFAST_NODE"]
    slow = node in os.environ.get("TEST_SLOW_NODES", "").split(",")
    broken = node in os.environ.get("TEST_BROKEN_NODES", "").split(",")
    make = steadfast_preflight.Run.group
    steadfast_preflight.Run.group = lambda self, name, ranks: _FaultyLink(make(self, name, ranks), slow, broken)
    sys.exit(steadfast_preflight.main())


if __name__ == "__main__":
    main()
