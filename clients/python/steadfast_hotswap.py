"""Hot swap for a data-parallel PyTorch job: a spare takes a failed node's ranks while the others
keep their state in memory, instead of a stop, an eviction and a relaunch from disk.

DeadPool §V-C, §VI (a spare swapped into the running job, state rebuilt from replicas);
ByteRobust §6.2, §6.3 (every-step in-memory checkpoints with backups on another node). The user's
loop stays theirs (docs/lab.md shows the diff):

    runtime = HotSwap.from_env(client, job)          # STEADFAST_RENDEZVOUS, STEADFAST_REPLICA_PORT
    joined = runtime.join()                          # (shard, world); a spare waits here; None: done
    model = build(); optimizer = make(model)
    runtime.protect(model, optimizer, wrap=lambda m, group: DistributedDataParallel(m, process_group=group))
    while runtime.iteration <= last:
        with runtime.step() as iteration:
            loss = runtime.model(batch(iteration, runtime.shard)) ...   # forward/backward, no_sync
            runtime.before_sync()                    # before the gradient all-reduce
            ... the all-reduce ...; optimizer.step()
    runtime.finish()

The world (epoch, each shard's node, spares, replica holders) comes from the controller's
``GET /api/v1/jobs/:id/world``. A communication error inside ``with runtime.step()`` (a collective
whose peer died: gloo's closed connection, an NCCL error; any other exception, a CUDA fault or a
bug, goes up to the loop as without hot swap, for the controller's ladder) or a newer epoch seen at a step boundary makes the runtime leave its process group,
wait for the controller's recovery epoch, meet the epoch's members under a fresh prefix of one
long-lived TCPStore, agree on the newest step every shard can restore, restore it, and go on: the
loop runs again from the step after. A swap that cannot finish (no common step, the rendezvous
timed out, a replica missing) is reported ``failed`` and raised as ``HotSwapFailed``: the
controller falls back to the plain relaunch.

Gloo cannot abort a collective blocked on a peer that hangs without dying: such a rank waits for
the process group's own timeout (the user's), not the swap's bound. A dead peer's closed sockets
fail the collective at once. Run ``python3 steadfast_hotswap.py store --host H --port P`` where no
rank runs; see steadfast_replica.py for the replicas and their trust model.
"""

import argparse
import contextlib
import gc
import os
import re
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from steadfast_replica import ReplicaLink, ReplicaServer, deserialize_state, get_replica
from steadfast_world import Address, World, deadline_of, shards_of

__all__ = ["HotSwap", "HotSwapFailed", "HotSwapUsageError"]


class HotSwapFailed(Exception):
    """The swap could not complete; the controller relaunches the job (not a RuntimeError, so that
    it is never taken for a failed collective)."""

    missing: Optional[List[int]] = None  # shards that never arrived at the epoch's rendezvous


class HotSwapUsageError(Exception):
    """The loop broke the runtime's rule (a step without ``before_sync``)."""


class HotSwap:
    """One rank's (or spare's) hot-swap runtime; see the module documentation."""

    def __init__(self, client: Any, job: str, node: str, rendezvous: Address, local_rank: int = 0,
                 replica_port: int = 29600, replica_hosts: Optional[Dict[str, Address]] = None, run_id: str = "run",
                 timeout: timedelta = timedelta(minutes=30), swap_wait: float = 120.0, poll_seconds: float = 1.0) -> None:
        self.client, self.job, self.node, self.local_rank = client, job, node, int(local_rank)
        self.rendezvous, self.run_id, self.timeout = rendezvous, run_id, timeout
        self.swap_wait, self.poll_seconds = float(swap_wait), float(poll_seconds)
        self.shard: Optional[int] = None
        self.world: World = {}
        self.epoch = -1
        self.iteration = 1
        self.swapped_in = False  # joined a running job as a spare: restore, do not resume from disk
        self.replicas = ReplicaLink(replica_port, replica_hosts or {})
        self._latest: Optional[World] = None
        self._pending: Optional[str] = None
        self._synced = False
        self._report_stepped = False
        self._restored_from = -1
        self._wrapper: Any = None
        self._module: Any = None
        self._optimizer: Any = None
        self._wrap: Callable[[Any, Any], Any] = lambda module, group: module
        self._extra: Optional[Callable[[], Any]] = None
        self._load_extra: Optional[Callable[[Any], None]] = None
        self._store: Any = None
        self._stop = threading.Event()
        self._watchdog: Optional[threading.Timer] = None
        self._failed_epoch = -1
        self._failed_lock = threading.Lock()
        self._server: Optional[ReplicaServer] = None

    @classmethod
    def from_env(cls, client: Any, job: Optional[str] = None, **overrides: Any) -> "HotSwap":
        """A runtime from the launch environment: STEADFAST_RENDEZVOUS=host:port (required),
        STEADFAST_REPLICA_PORT (29600; this rank listens on it + local rank), LOCAL_RANK (else
        SLURM_LOCALID), SLURM_JOB_ID (the rendezvous prefix), the node as the client resolved it.
        STEADFAST_REPLICA_HOSTS="node=host:port,…" maps node names to addresses where they do not
        resolve (one host running several "nodes": tests, a laptop)."""
        env = os.environ
        host, _, port = env.get("STEADFAST_RENDEZVOUS", "").rpartition(":")
        if not host or not port.isdigit():
            raise HotSwapFailed("hot swap needs STEADFAST_RENDEZVOUS=host:port, the store of steadfast_hotswap.py store")
        hosts = {}
        for item in filter(None, env.get("STEADFAST_REPLICA_HOSTS", "").split(",")):
            name, _, address = item.partition("=")
            where, _, number = address.rpartition(":")
            hosts[name] = (where, int(number))
        settings: Dict[str, Any] = {
            "client": client, "job": job or client.job, "node": client.node, "rendezvous": (host, int(port)),
            "local_rank": int(env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))),
            "replica_port": int(env.get("STEADFAST_REPLICA_PORT", "29600")), "replica_hosts": hosts,
            "run_id": env.get("SLURM_JOB_ID") or "run",
        }
        settings.update(overrides)
        return cls(**settings)

    # ---- joining --------------------------------------------------------------------------

    def join(self) -> Optional[Tuple[int, int]]:
        """Takes this process's shard and joins its epoch's process group: (shard, world size).

        A process on a spare node logs ``[spare] …``, reports ``spare`` and waits (polling every
        100 ms) until an epoch puts a shard on its node; None when the job finished first.
        """
        self._server = ReplicaServer("0.0.0.0", self.replicas.own_port(self.node, self.local_rank))
        world = self._poll_world(lambda w: True, time.monotonic() + self.swap_wait, "the job's world")
        if not shards_of(world, self.node) and self.node in world.get("spares", []):
            print("[spare] pid %d on %s: idle spare of %s, epoch %d" % (os.getpid(), self.node, self.job, world["epoch"]), flush=True)
            self.client.report_world(world["epoch"], "spare")
            store = self._connect(timedelta(seconds=self.swap_wait))
            while len(shards_of(world, self.node)) <= self.local_rank:
                if store.add("%s/finished" % self.run_id, 0) > 0:
                    return None
                self._stop.wait(0.1)
                world = self.client.world() or world
            self.swapped_in = True
        local = shards_of(world, self.node)
        if len(local) <= self.local_rank:
            raise HotSwapFailed("node %s (local rank %d) has no shard in epoch %d of %s and is not its spare" % (self.node, self.local_rank, world["epoch"], self.job))
        if self.swapped_in:
            with self._failing(world["epoch"], local[self.local_rank], deadline_of(world, self.swap_wait)) as deadline:
                self._enter(world, local[self.local_rank], deadline)
        else:
            self._enter(world, local[self.local_rank], deadline_of(world, self.timeout.total_seconds()))
        threading.Thread(target=self._watch_world, name="steadfast-world", daemon=True).start()
        return self.shard, self.world_size  # type: ignore[return-value]

    @property
    def world_size(self) -> int:
        return len(self.world.get("shards", []))

    @property
    def model(self) -> Any:
        """The wrapped model of the current epoch: take it anew every step (a swap rebuilds it)."""
        return self._wrapper

    def _connect(self, timeout: timedelta) -> Any:
        self._store = dist.TCPStore(self.rendezvous[0], self.rendezvous[1], None, False, timeout)
        return self._store

    def _enter(self, world: World, shard: int, deadline: float) -> None:
        """Meets the epoch's other members under its own prefix, then forms the gloo group."""
        epoch, size = int(world["epoch"]), len(world["shards"])
        self.world, self.epoch, self.shard = world, epoch, shard
        # Half a second before the bound, so that the reason reported is this one, not the watchdog's.
        remaining = timedelta(seconds=max(1.0, deadline - time.monotonic() - 0.5))
        store = dist.PrefixStore("%s/epoch-%d" % (self.run_id, epoch), self._connect(remaining))
        store.add("arrived/%d" % shard, 1)
        try:
            store.wait(["arrived/%d" % s for s in range(size)], remaining)
        except RuntimeError as error:
            missing = [s for s in range(size) if store.add("arrived/%d" % s, 0) == 0]
            failure = HotSwapFailed("rendezvous of epoch %d timed out after %.0f s: shard(s) %s did not arrive" % (epoch, remaining.total_seconds(), missing))
            failure.missing = missing  # the controller evicts a spare of the swap that never came
            raise failure from error
        dist.init_process_group("gloo", store=store, rank=shard, world_size=size, timeout=self.timeout)

    # ---- protecting ----------------------------------------------------------------------------

    def protect(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, wrap: Callable[[Any, Any], Any],
                first: int = 1, extra_state: Optional[Callable[[], Any]] = None,
                load_extra_state: Optional[Callable[[Any], None]] = None) -> Any:
        """Takes the rank's state under protection and returns the wrapped model.

        `wrap(module, group)` builds the data-parallel wrapper (again after every swap). `first`
        is the first iteration of a fresh start (after a resume from disk); a process that joined
        as a spare restores from its replica instead. `extra_state()` returns any other picklable
        state to keep with each step; `load_extra_state(value)` puts it back after a swap.
        """
        self._module, self._optimizer, self._wrap = module, optimizer, wrap
        self._extra, self._load_extra = extra_state, load_extra_state
        self.iteration = int(first)
        if self.swapped_in:
            with self._failing(self.epoch, self.shard or 0, None):
                self._restore()
        else:
            self._wrapper = wrap(module, dist.group.WORLD)
            self._restored_from = self.iteration - 1
            # Protected from the start: a fault in the first step restores the state it began from.
            self.replicas.start(world=self.world, shard=self.shard or 0, node=self.node, step=self._restored_from, state=self._state(self._restored_from))
            self.client.report_world(self.epoch, "joined", shard=self.shard, step=self._restored_from)
            self._report_stepped = True
        return self._wrapper

    def resume_step(self) -> int:
        """The step the state resumed from: the swap's agreed step, else `first` - 1."""
        return self._restored_from

    def step(self) -> "_Step":
        """``with runtime.step() as iteration:`` one training iteration; see the module docs."""
        return _Step(self)

    def before_sync(self) -> None:
        """Waits until the previous step's local copy and its replica at the holder are committed.

        Call it before this step's gradient all-reduce, not merely before ``optimizer.step()``.
        Each rank holds two buffers and each holder two replicas per shard, so a rank holds only
        its two newest steps. Suppose rank r applied step P while rank q's replica of P-1 had not
        landed: r's buffers hold P and P-1 (P-2 overwritten), q's holder at best P-2 and P-3; if
        q's node dies now, no step is restorable by both. Waiting before the all-reduce prevents
        it: no rank passes all-reduce P before every rank entered it, and each entered only after
        committing P-1 locally and at its holder. So when anyone passed all-reduce P, every rank
        committed P-1 in both places, and a rank overwrites P-1 only after passing all-reduce
        P+1, i.e. after P is committed everywhere. Every survivor therefore holds P-1 (and maybe
        P), every holder the last two, and a common step always exists. Waiting merely before
        ``optimizer.step()`` orders only this rank's own events, after the all-reduce.
        """
        self.replicas.wait()
        self._synced = True

    def finish(self) -> None:
        """Ends the run: releases the spares (shard 0), stops the threads, leaves the group."""
        self.replicas.settle(60.0, acked=True)
        if self.shard == 0 and self._store is not None:
            self._store.add("%s/finished" % self.run_id, 1)
        self._stop.set()
        self._wrapper = None
        if dist.is_initialized():
            dist.destroy_process_group()
        if self._server is not None:
            self._server.close()

    # ---- every step -------------------------------------------------------------------------

    def _state(self, step: int) -> Dict[str, Any]:
        state = {"model": self._module.state_dict(), "optimizer": self._optimizer.state_dict(), "iteration": step}
        if self._extra is not None:
            state["extra"] = self._extra()
        return state

    def _watch_world(self) -> None:
        """Polls the world: every poll_seconds while steady, every 100 ms while swapping or unreachable."""
        while not self._stop.is_set():
            world = self.client.world()
            if world is not None and world["epoch"] > max(self.epoch, (self._latest or {}).get("epoch", -1)):
                self._latest = world
            self._stop.wait(0.1 if world is None or world.get("state") == "swapping" else self.poll_seconds)

    def _poll_world(self, accept: Callable[[World], bool], deadline: float, what: str) -> World:
        while True:
            world = self.client.world()
            if world is not None and accept(world):
                return world
            if time.monotonic() >= deadline:
                raise HotSwapFailed("waited %.0f s for %s from the controller" % (self.swap_wait, what))
            self._stop.wait(0.1)

    # ---- recovering -------------------------------------------------------------------------

    def _recover(self, reason: str) -> None:
        """Leaves the epoch, waits for the next one, meets it and restores the agreed step."""
        print("[rank %d] %s; leaving epoch %d" % (self.shard, reason, self.epoch), flush=True)
        if not self.replicas.settle(60.0, acked=False):  # its replica may never land: the holder may be lost
            raise HotSwapFailed("the local copy of the last step did not finish")
        self._wrapper = None
        gc.collect()  # the old wrapper's gradient hooks go with it
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except RuntimeError as error:  # a broken group may fail to close; it is dropped all the same
                print("[rank %d] leaving the process group: %s" % (self.shard, error), flush=True)
        world = self._poll_world(lambda w: w["epoch"] > self.epoch, time.monotonic() + self.swap_wait,
                                 "a recovery epoch after epoch %d, where %s" % (self.epoch, reason))
        local = shards_of(world, self.node)
        if len(local) <= self.local_rank:
            raise HotSwapFailed("node %s has no shard in epoch %d: replaced" % (self.node, world["epoch"]))
        with self._failing(world["epoch"], local[self.local_rank], deadline_of(world, self.swap_wait)) as deadline:
            self._enter(world, local[self.local_rank], deadline)
            self._restore()

    @contextlib.contextmanager
    def _failing(self, epoch: int, shard: int, deadline: Optional[float]) -> Iterator[float]:
        """Reports `failed` (once per epoch) when the block raises, or when `deadline` passes first
        (a watchdog: gloo may wait on a dead spare for its own, longer, timeout); raises HotSwapFailed."""
        if deadline is not None:
            self._watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), self._report_failed,
                                             (epoch, shard, "the swap's bound passed before epoch %d formed" % epoch))
            self._watchdog.daemon = True
            self._watchdog.start()
        try:
            yield deadline or 0.0
        except Exception as error:
            self._report_failed(epoch, shard, str(error), getattr(error, "missing", None))
            raise HotSwapFailed("hot swap to epoch %d failed: %s" % (epoch, error)) from error

    def _report_failed(self, epoch: int, shard: int, detail: str, missing: Optional[List[int]] = None) -> None:
        with self._failed_lock:  # the watchdog's thread and the main thread: one report
            if self._failed_epoch == epoch:
                return
            self._failed_epoch = epoch
        if missing is None:
            missing = self._not_arrived(epoch)
        self.client.report_world(epoch, "failed", shard=shard, detail=detail, missing=missing)

    def _not_arrived(self, epoch: int) -> Optional[List[int]]:
        """The shards of `epoch` that never arrived at its rendezvous, asked on a connection of its
        own (the watchdog's thread); None when the store cannot say."""
        try:
            store = dist.PrefixStore("%s/epoch-%d" % (self.run_id, epoch), dist.TCPStore(self.rendezvous[0], self.rendezvous[1], None, False, timedelta(seconds=2)))
            return [s for s in range(len(self.world.get("shards", []))) if store.add("arrived/%d" % s, 0) == 0]
        except Exception:  # noqa: BLE001 - a report without them still ends the swap
            return None

    def _restore(self) -> None:
        """Agrees with every member on the newest step all shards hold, and restores it."""
        own = self.replicas.shard == self.shard
        steps, address, holder = (self.replicas.snapshots.steps(), None, "") if own else self.replicas.find(self.world, self.shard or 0, self.node)
        gathered: List[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, {"shard": self.shard, "steps": steps})
        common = set.intersection(*(set(item["steps"]) for item in gathered))
        if not common:
            held = ", ".join("shard %d: %s" % (item["shard"], item["steps"] or "no replica") for item in gathered)
            raise HotSwapFailed("no step every shard can restore (%s)" % held)
        step = max(common)
        if own:
            state, source = self.replicas.snapshots.state_at(step), "own memory"
        else:
            assert address is not None
            state, source = deserialize_state(get_replica(address, self.shard or 0, step)), "replica on %s" % holder
        assert state is not None
        self._module.load_state_dict(state["model"])
        self._optimizer.load_state_dict(state["optimizer"])
        if self._load_extra is not None and "extra" in state:
            self._load_extra(state["extra"])
        self.replicas.snapshots.discard()
        self.iteration = int(state["iteration"]) + 1
        # Held again, and at the (maybe new) holder, before anything else runs.
        self.replicas.start(world=self.world, shard=self.shard or 0, node=self.node, step=step, state=self._state(step))
        self.replicas.wait_copied(60.0)
        self._wrapper = self._wrap(self._module, dist.group.WORLD)
        self._restored_from = step
        if self._watchdog is not None:
            self._watchdog.cancel()
        self.client.report_world(self.epoch, "joined", shard=self.shard, step=step)
        self._report_stepped = True
        print("[rank %d] hot swap: epoch %d, world %d, resumed from step %d (restored from %s)" % (self.shard, self.epoch, self.world_size, step, source), flush=True)


# What a collective raises when a peer is gone or the communicator broke (gloo's transport, NCCL,
# c10d's store and timeouts): the errors a swap recovers from. Anything else is the program's own.
COMMUNICATION_FAILURE = re.compile(r"gloo|NCCL|nccl|ProcessGroup|c10d|[Cc]onnection (?:closed|reset|refused)|[Bb]roken pipe|[Tt]imed out|[Tt]imeout")


class _Step:
    """The context of one iteration: a failed collective inside it starts a recovery."""

    def __init__(self, runtime: HotSwap) -> None:
        self.runtime = runtime
        self.started = 0.0

    def __enter__(self) -> int:
        runtime = self.runtime
        if runtime._pending is not None:
            reason, runtime._pending = runtime._pending, None
            runtime._recover(reason)
        elif runtime._latest is not None and runtime._latest["epoch"] > runtime.epoch:
            runtime._recover("epoch %d opened" % runtime._latest["epoch"])
        runtime._synced = False
        self.started = time.perf_counter()
        return runtime.iteration

    def __exit__(self, kind: Any, error: Optional[BaseException], traceback: Any) -> bool:
        runtime = self.runtime
        if error is None:
            if not runtime._synced:
                raise HotSwapUsageError("step %d ended without runtime.before_sync() before its gradient all-reduce" % runtime.iteration)
            runtime.replicas.start(world=runtime.world, shard=runtime.shard or 0, node=runtime.node, step=runtime.iteration, state=runtime._state(runtime.iteration))
            if runtime._report_stepped:
                runtime._report_stepped = False
                runtime.client.report_world(runtime.epoch, "stepped", shard=runtime.shard, step=runtime.iteration, step_seconds=time.perf_counter() - self.started)
            runtime.iteration += 1
            return False
        if isinstance(error, RuntimeError) and COMMUNICATION_FAILURE.search(str(error)):
            # Recovered at the next __enter__, once this exception (and the frames holding the
            # old wrapper) is gone. The loop runs the same iteration number again, or the agreed.
            runtime._pending = "step %d failed (%s)" % (runtime.iteration, str(error).splitlines()[0] if str(error) else type(error).__name__)
            return True
        return False


def serve_store(host: str, port: int) -> None:
    """The rendezvous store of every epoch: a TCPStore server, until SIGTERM or SIGINT."""
    store = dist.TCPStore(host, port, None, True, timedelta(seconds=300), wait_for_workers=False)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    print("store listening on %s:%d" % (host, store.port), flush=True)
    while not stop.wait(1.0):
        pass


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="steadfast hot swap: the rendezvous store")
    commands = parser.add_subparsers(dest="command", required=True)
    store = commands.add_parser("store", help="run the TCPStore every epoch meets in (foreground)")
    store.add_argument("--host", default="0.0.0.0")
    store.add_argument("--port", type=int, default=29400, help="0: any free port (printed)")
    args = parser.parse_args(argv)
    serve_store(args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
