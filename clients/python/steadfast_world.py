"""The job's world, as the controller's ``GET /api/v1/jobs/:id/world`` describes it: each
shard's node, the spares, and the holders of each shard's replica (for steadfast_hotswap.py).

    {"job": "llama", "epoch": 3, "state": "steady" | "swapping",
     "shards": [{"shard": 0, "node": "node-3"}, ...], "spares": ["node-4"],
     "replicas": [{"shard": 0, "holders": [1, 2]}, ...],
     "swap": null | {"epoch": 3, "replaced": {"node-1": "node-3"}, "openedAt": ISO, "deadline": ISO}}
"""

import time
from datetime import datetime
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["World", "Address", "shards_of", "node_of", "holder_candidates", "deadline_of"]

World = Dict[str, Any]
Address = Tuple[str, int]


def shards_of(world: World, node: str) -> List[int]:
    """The shards on `node`, in rank order: local rank k takes the k-th."""
    return sorted(int(entry["shard"]) for entry in world.get("shards", []) if entry.get("node") == node)


def node_of(world: World, shard: int) -> Optional[str]:
    return next((str(entry["node"]) for entry in world.get("shards", []) if entry.get("shard") == shard), None)


def holder_candidates(world: World, shard: int, own_node: str) -> List[int]:
    """The shards that hold `shard`'s replica, in order: the first whose node is in the world and is
    not `own_node`; the next ones for when it is lost."""
    entry = next((item for item in world.get("replicas", []) if item.get("shard") == shard), {})
    return [int(h) for h in entry.get("holders", []) if node_of(world, int(h)) not in (None, own_node)]


def deadline_of(world: World, fallback_seconds: float) -> float:
    """The swap's deadline as a time.monotonic() value (the controller's clock, at least 5 s on)."""
    swap = world.get("swap")
    if isinstance(swap, dict) and swap.get("epoch") == world.get("epoch") and isinstance(swap.get("deadline"), str):
        try:
            wall = datetime.fromisoformat(swap["deadline"].replace("Z", "+00:00")).timestamp()
            return time.monotonic() + max(5.0, wall - time.time())
        except ValueError:
            pass
    return time.monotonic() + fallback_seconds
