"""Tests of hot swap (steadfast_hotswap.py, steadfast_replica.py): the two host buffers' commit
rule, the replica server, replica placement, and the epoch protocol with real processes: ranks
under torch.distributed gloo on 127.0.0.1, a TCPStore server process, and a stand-in for the
controller's world endpoint, with ranks killed by SIGKILL.

Run alone: /usr/bin/python3 -m unittest discover -s clients/python/tests -p 'test_steadfast_hotswap.py' -v
"""

import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402

from steadfast_client import SteadfastClient  # noqa: E402
from steadfast_hotswap import HotSwap, HotSwapUsageError  # noqa: E402
from steadfast_replica import HostSnapshots, ReplicaError, ReplicaServer, get_replica, list_replicas, put_replica  # noqa: E402
from steadfast_world import holder_candidates  # noqa: E402

JOB = "hs"
logging.getLogger("steadfast_client").addHandler(logging.NullHandler())
logging.getLogger("steadfast_client").propagate = False  # the refused report is on purpose
WORKER = os.path.join(HERE, "hotswap_worker.py")
HOTSWAP = os.path.join(HERE, "..", "steadfast_hotswap.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition: Callable[[], Any], seconds: float, what: str, lock: Optional[threading.Condition] = None) -> Any:
    """Waits on `lock` (notified when the state changes) until `condition()` is truthy."""
    lock = lock or threading.Condition()
    deadline = time.monotonic() + seconds
    with lock:
        while True:
            value = condition()
            if value:
                return value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError("timed out after %.0f s waiting for %s" % (seconds, what))
            lock.wait(min(remaining, 0.05))


class WorldStandIn:
    """The controller's GET/POST /api/v1/jobs/hs/world, on loopback, with the reports it got."""

    def __init__(self, world: Dict[str, Any]) -> None:
        self.world = world
        self.reports: List[Dict[str, Any]] = []
        self.changed = threading.Condition()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path != "/api/v1/jobs/%s/world" % JOB:
                    return self._answer(404, {"error": "not the world"})
                with stand_in.changed:
                    world = json.loads(json.dumps(stand_in.world))
                self._answer(200, world)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                if self.path != "/api/v1/jobs/%s/world" % JOB or not isinstance(body, dict):
                    return self._answer(404, {"error": "not the world"})
                with stand_in.changed:
                    body["receivedAt"] = time.monotonic()
                    stand_in.reports.append(body)
                    stand_in.changed.notify_all()
                self._answer(202, {"accepted": True})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def set(self, world: Dict[str, Any]) -> None:
        with self.changed:
            self.world = world

    def report(self, event: str, epoch: int, node: str) -> Optional[Dict[str, Any]]:
        return next((r for r in self.reports if r["event"] == event and r["epoch"] == epoch and r["node"] == node), None)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Process:
    """A child process whose stdout lines are collected as they come."""

    def __init__(self, argv: List[str], env: Dict[str, str]) -> None:
        self.lines: List[str] = []
        self.changed = threading.Condition()
        self.errors: List[str] = []
        self.popen = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.readers = [threading.Thread(target=self._read, args=(self.popen.stdout, self.lines), daemon=True),
                        threading.Thread(target=self._read, args=(self.popen.stderr, self.errors), daemon=True)]
        for reader in self.readers:
            reader.start()

    def _read(self, stream: Any, into: List[str]) -> None:
        for line in stream:
            with self.changed:
                into.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    @property
    def stderr(self) -> str:
        with self.changed:
            return "\n".join(self.errors)

    def wait_line(self, predicate: Callable[[str], bool], seconds: float, what: str) -> str:
        return wait_until(lambda: next((line for line in self.lines if predicate(line)), None)
                          or (self.popen.poll() is not None and self._died(what)), seconds, what, self.changed)

    def _died(self, what: str) -> None:
        raise AssertionError("process exited (%s) before %s:\n%s\n%s" % (self.popen.returncode, what, "\n".join(self.lines), self.stderr))

    def iterations(self) -> List[Dict[str, Any]]:
        with self.changed:
            return [json.loads(line) for line in self.lines if line.startswith('{"shard"')]

    def finish(self, seconds: float) -> int:
        code = self.popen.wait(timeout=seconds)
        for reader in self.readers:
            reader.join(timeout=5)
        return code

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)
        for reader in self.readers:
            reader.join(timeout=5)
        for stream in (self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()


class Cluster:
    """A store server, a world stand-in, and one worker process per node."""

    def __init__(self, test: unittest.TestCase, nodes: List[str], spares: List[str], iterations: int, pause: float) -> None:
        self.processes: List[Process] = []
        test.addCleanup(self.close)
        shards = [{"shard": index, "node": node} for index, node in enumerate(nodes)]
        replicas = [{"shard": index, "holders": [(index + 1) % len(nodes)] + [s for s in range(len(nodes)) if s not in (index, (index + 1) % len(nodes))]} for index in range(len(nodes))]
        self.stand_in = WorldStandIn({"job": JOB, "epoch": 0, "state": "steady", "shards": shards, "spares": spares, "replicas": replicas, "swap": None})
        store = Process([sys.executable, HOTSWAP, "store", "--host", "127.0.0.1", "--port", "0"], dict(os.environ))
        self.processes.append(store)
        line = store.wait_line(lambda text: text.startswith("store listening on "), 20, "the store to listen")
        hosts = ",".join("%s=127.0.0.1:%d" % (node, free_port()) for node in nodes + spares)
        self.by_node: Dict[str, Process] = {}
        for node in nodes + spares:
            env = dict(os.environ, STEADFAST_NODE=node, STEADFAST_CONTROLLER_URL=self.stand_in.url, STEADFAST_AGENT_URL="",
                       STEADFAST_RENDEZVOUS=line.rsplit(" ", 1)[1], STEADFAST_REPLICA_HOSTS=hosts, GLOO_SOCKET_IFNAME="lo",
                       TEST_ITERATIONS=str(iterations), TEST_STEP_PAUSE=str(pause), PYTHONDONTWRITEBYTECODE="1")
            env.pop("SLURM_JOB_ID", None)
            self.by_node[node] = Process([sys.executable, WORKER], env)
            self.processes.append(self.by_node[node])

    def open_epoch(self, epoch: int, replaced: Dict[str, str], seconds: float) -> float:
        """Moves the replaced nodes' shards to their spares, as the controller's hot_swap step does."""
        world = json.loads(json.dumps(self.stand_in.world))
        for entry in world["shards"]:
            entry["node"] = replaced.get(entry["node"], entry["node"])
        deadline = time.time() + seconds
        iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(deadline)) + ".%03dZ" % (deadline % 1 * 1000)
        world.update(epoch=epoch, state="swapping", spares=[s for s in world["spares"] if s not in replaced.values()],
                     swap={"epoch": epoch, "replaced": replaced, "openedAt": iso, "deadline": iso})
        self.stand_in.set(world)
        return time.monotonic() + seconds

    def losses(self) -> Dict[Any, float]:
        """Each (shard, iteration)'s loss as last printed (a replayed iteration prints again)."""
        return {(item["shard"], item["iteration"]): item["loss"] for p in self.by_node.values() for item in p.iterations()}

    def close(self) -> None:
        for process in self.processes:
            process.kill()
        self.stand_in.close()


class HostSnapshotsTest(unittest.TestCase):
    def test_a_failure_mid_copy_leaves_the_committed_buffer_whole_and_committed(self) -> None:
        snapshots = HostSnapshots()
        snapshots.write(1, {"w": torch.full((4,), 1.0)})
        snapshots.write(2, {"w": torch.full((4,), 2.0)})
        self.assertEqual(snapshots.steps(), [1, 2])

        class Exploding:
            def __deepcopy__(self, memo: Any) -> Any:
                raise MemoryError("the host ran out of memory mid-copy")

        # The copy of step 3 goes into step 1's buffer and fails after its tensor was overwritten.
        with self.assertRaises(MemoryError):
            snapshots.write(3, {"w": torch.full((4,), 3.0), "z": Exploding()})
        self.assertEqual(snapshots.steps(), [2])
        self.assertEqual(snapshots.committed_step(), 2)
        self.assertTrue(torch.equal(snapshots.state_at(2)["w"], torch.full((4,), 2.0)))
        self.assertIsNone(snapshots.state_at(1))
        snapshots.write(3, {"w": torch.full((4,), 3.0)})
        self.assertEqual(snapshots.steps(), [2, 3])

    def test_a_committed_copy_does_not_change_when_the_live_state_does(self) -> None:
        live = {"w": torch.zeros(3)}
        snapshots = HostSnapshots()
        snapshots.write(7, live)
        live["w"].add_(5)
        self.assertTrue(torch.equal(snapshots.state_at(7)["w"], torch.zeros(3)))


class ReplicaServerTest(unittest.TestCase):
    def setUp(self) -> None:
        self.server = ReplicaServer("127.0.0.1", 0, max_frame=1 << 20)
        self.addCleanup(self.server.close)
        self.address = ("127.0.0.1", self.server.port)

    def test_the_holder_keeps_the_last_two_committed_replicas_per_shard(self) -> None:
        for step in (4, 5, 6):
            put_replica(self.address, 0, step, b"shard0-%d" % step)
        put_replica(self.address, 1, 5, b"shard1-5")
        self.assertEqual(list_replicas(self.address, 0), [5, 6])
        self.assertEqual(list_replicas(self.address, 1), [5])
        self.assertEqual(get_replica(self.address, 0, 6), b"shard0-6")
        with self.assertRaisesRegex(ReplicaError, "no replica of shard 0 at step 4"):
            get_replica(self.address, 0, 4)
        # After a restore to step 5 in epoch 1 the next PUT is 6 again: the abandoned 6 is replaced.
        put_replica(self.address, 0, 6, b"again", epoch=1)
        self.assertEqual(list_replicas(self.address, 0), [5, 6])
        self.assertEqual(get_replica(self.address, 0, 6), b"again")
        # A late send from epoch 0 (a rank that left it) replaces nothing.
        with self.assertRaisesRegex(ReplicaError, r"a replica of shard 0 from epoch 0 is stale \(held from epoch 1\)"):
            put_replica(self.address, 0, 6, b"late", epoch=0)
        self.assertEqual(get_replica(self.address, 0, 6), b"again")

    def test_a_put_cut_off_mid_transfer_commits_nothing(self) -> None:
        put_replica(self.address, 0, 1, b"whole")
        with socket.create_connection(self.address, timeout=5) as sock:
            header = json.dumps({"op": "put", "shard": 0, "step": 2, "epoch": 0, "bytes": 1000}).encode()
            sock.sendall(struct.pack(">Q", len(header)) + header + struct.pack(">Q", 1000) + b"only part")
        wait_until(lambda: self.server.steps(0) == [1] and list_replicas(self.address, 0) == [1], 5, "the server to drop the torn PUT")

    def test_a_frame_over_the_limit_is_refused_with_a_message(self) -> None:
        with self.assertRaisesRegex(ReplicaError, r"a replica of 1048577 bytes exceeds this server's limit of 1048576 bytes"):
            put_replica(self.address, 0, 1, b"x" * ((1 << 20) + 1))
        self.assertEqual(list_replicas(self.address, 0), [])


class PlacementTest(unittest.TestCase):
    WORLD = {
        "epoch": 2,
        "shards": [{"shard": 0, "node": "n1"}, {"shard": 1, "node": "n1"}, {"shard": 2, "node": "n2"}, {"shard": 3, "node": "n3"}],
        "replicas": [{"shard": 0, "holders": [1, 2, 3]}, {"shard": 2, "holders": [3, 0]}],
    }

    def test_the_holder_is_on_another_node_and_the_next_one_stands_in_when_it_is_lost(self) -> None:
        # Shard 1 shares shard 0's node, so it cannot hold shard 0's replica: node n2's shard 2 does.
        self.assertEqual(holder_candidates(self.WORLD, 0, "n1"), [2, 3])
        self.assertEqual(holder_candidates(self.WORLD, 2, "n2"), [3, 0])
        lost_n3 = dict(self.WORLD, shards=[entry for entry in self.WORLD["shards"] if entry["node"] != "n3"])
        self.assertEqual(holder_candidates(lost_n3, 2, "n2"), [0])
        self.assertEqual(holder_candidates(self.WORLD, 3, "n3"), [])


class StepRuleTest(unittest.TestCase):
    def test_a_step_that_never_called_before_sync_is_refused(self) -> None:
        runtime = HotSwap(client=None, job=JOB, node="node-a", rendezvous=("127.0.0.1", 1))
        with self.assertRaisesRegex(HotSwapUsageError, r"step 1 ended without runtime.before_sync\(\)"):
            with runtime.step():
                pass


@unittest.skipUnless(os.environ.get("STEADFAST_TEST_CONTROLLER_URL"), "needs a real controller (test/lab/python-client.test.ts starts one)")
class RealControllerWorldTest(unittest.TestCase):
    """Against the controller's own world routes, with job pyhotswap: swap-1 and swap-2, spare swap-3."""

    def client(self, node: str) -> SteadfastClient:
        client = SteadfastClient("pyhotswap", 0, agent_url=None, controller_url=os.environ["STEADFAST_TEST_CONTROLLER_URL"],
                                 controller_token=os.environ.get("STEADFAST_TEST_CONTROLLER_TOKEN"), node=node, timeout=5.0)
        self.addCleanup(client.close, 0.1)
        return client

    def test_the_real_controllers_world_places_each_replica_on_another_node_and_takes_reports(self) -> None:
        rank = self.client("swap-1")
        world = rank.world()
        assert world is not None
        self.assertEqual(world["shards"], [{"shard": 0, "node": "swap-1"}, {"shard": 1, "node": "swap-2"}])
        self.assertEqual(world["spares"], ["swap-3"])
        self.assertEqual(world["state"], "steady")
        self.assertEqual(holder_candidates(world, 0, "swap-1"), [1])
        self.assertEqual(holder_candidates(world, 1, "swap-2"), [0])
        self.assertTrue(rank.report_world(world["epoch"], "joined", shard=0, step=0))
        self.assertTrue(rank.report_world(world["epoch"], "stepped", shard=0, step=1, step_seconds=0.05))
        self.assertTrue(self.client("swap-3").report_world(world["epoch"], "spare"))
        # swap-1 does not hold shard 1: refused (400), and not raised.
        self.assertFalse(rank.report_world(world["epoch"], "joined", shard=1, step=0))


class EpochProtocolTest(unittest.TestCase):
    """Two ranks (node-a, node-b) and a spare (node-c), node-b's rank killed with SIGKILL."""

    ITERATIONS = 30
    _reference: Dict[Any, float] = {}

    def reference(self) -> Dict[Any, float]:
        """Each iteration's loss in an unfaulted run (run once, by the first test that asks)."""
        if not EpochProtocolTest._reference:
            cluster = Cluster(self, ["node-a", "node-b"], [], self.ITERATIONS, 0.0)
            for process in cluster.by_node.values():
                self.assertEqual(process.finish(60), 0, process.stderr)
            EpochProtocolTest._reference = cluster.losses()
        return EpochProtocolTest._reference

    def test_an_epoch_with_the_same_shards_is_met_at_a_step_boundary_and_both_ranks_resume_from_memory(self) -> None:
        # The controller's answer to a transient communication fault: no node changes, every rank
        # leaves at its next step boundary (or when the first to leave breaks its collective).
        expected = self.reference()
        cluster = Cluster(self, ["node-a", "node-b"], [], self.ITERATIONS, 0.05)
        cluster.by_node["node-b"].wait_line(lambda text: '"iteration": 8,' in text, 30, "node-b's rank to reach iteration 8")
        cluster.open_epoch(1, {}, 30)
        for process in cluster.by_node.values():
            self.assertEqual(process.finish(60), 0, process.stderr)
            swapped = process.wait_line(lambda text: "hot swap:" in text, 1, "the hot swap line")
            self.assertRegex(swapped, r"^\[rank [01]\] hot swap: epoch 1, world 2, resumed from step \d+ \(restored from own memory\)$")
        self.assertEqual(cluster.losses(), expected)

    def test_the_spare_takes_the_killed_ranks_shard_and_the_losses_equal_an_unfaulted_run(self) -> None:
        expected = self.reference()
        cluster = Cluster(self, ["node-a", "node-b"], ["node-c"], self.ITERATIONS, 0.05)
        spare, survivor, victim = cluster.by_node["node-c"], cluster.by_node["node-a"], cluster.by_node["node-b"]
        spare.wait_line(lambda text: text.startswith("[spare] pid ") and "on node-c: idle spare of hs, epoch 0" in text, 30, "the spare to idle")
        victim.wait_line(lambda text: '"iteration": 10,' in text, 30, "node-b's rank to reach iteration 10")
        victim.kill()
        cluster.open_epoch(1, {"node-b": "node-c"}, 30)
        self.assertEqual(survivor.finish(60), 0, survivor.stderr)
        self.assertEqual(spare.finish(60), 0, spare.stderr)

        swapped = spare.wait_line(lambda text: "hot swap:" in text, 1, "the spare's hot swap line")
        self.assertRegex(swapped, r"^\[rank 1\] hot swap: epoch 1, world 2, resumed from step (\d+) \(restored from replica on node-a\)$")
        own = survivor.wait_line(lambda text: "hot swap:" in text, 1, "the survivor's hot swap line")
        self.assertRegex(own, r"^\[rank 0\] hot swap: epoch 1, world 2, resumed from step (\d+) \(restored from own memory\)$")
        resumed = int(swapped.split("resumed from step ")[1].split(" ")[0])
        self.assertEqual(own.split(" (")[0].rsplit(" ", 1)[1], str(resumed))
        self.assertGreaterEqual(resumed, 9, "node-b had committed step 9 at its holder before it reached iteration 10")
        for node, shard in (("node-a", 0), ("node-c", 1)):
            joined, stepped = cluster.stand_in.report("joined", 1, node), cluster.stand_in.report("stepped", 1, node)
            self.assertEqual((joined or {}).get("shard"), shard)
            self.assertEqual((joined or {}).get("step"), resumed)
            self.assertEqual((stepped or {}).get("step"), resumed + 1)
        self.assertIsNotNone(cluster.stand_in.report("spare", 0, "node-c"))
        self.assertEqual(cluster.losses(), expected, "every iteration's loss on both shards equals the unfaulted run's")

    def test_when_the_spare_dies_mid_swap_the_survivor_reports_failed_within_the_bound(self) -> None:
        cluster = Cluster(self, ["node-a", "node-b"], ["node-c"], 1000, 0.05)
        spare, survivor, victim = cluster.by_node["node-c"], cluster.by_node["node-a"], cluster.by_node["node-b"]
        spare.wait_line(lambda text: text.startswith("[spare] "), 30, "the spare to idle")
        victim.wait_line(lambda text: '"iteration": 5,' in text, 30, "node-b's rank to reach iteration 5")
        victim.kill()
        deadline = cluster.open_epoch(1, {"node-b": "node-c"}, 6)
        spare.kill()
        failed = wait_until(lambda: cluster.stand_in.report("failed", 1, "node-a"), 20, "the survivor's failed report", cluster.stand_in.changed)
        self.assertLessEqual(failed["receivedAt"], deadline + 2.0, "reported within the swap's bound")
        self.assertEqual(failed["shard"], 0)
        self.assertRegex(failed["detail"], r"rendezvous of epoch 1 timed out|bound passed|shard\(s\) \[1\] did not arrive")
        self.assertNotEqual(survivor.finish(30), 0)
        self.assertIn("HotSwapFailed: hot swap to epoch 1 failed", survivor.stderr)

    def test_when_the_replica_holder_dies_mid_swap_the_spare_reports_failed_within_the_bound(self) -> None:
        # node-a holds node-b's replica and is the only other member: the spare cannot form the epoch.
        cluster = Cluster(self, ["node-a", "node-b"], ["node-c"], 1000, 0.05)
        spare, holder, victim = cluster.by_node["node-c"], cluster.by_node["node-a"], cluster.by_node["node-b"]
        spare.wait_line(lambda text: text.startswith("[spare] "), 30, "the spare to idle")
        victim.wait_line(lambda text: '"iteration": 5,' in text, 30, "node-b's rank to reach iteration 5")
        victim.kill()
        holder.kill()
        deadline = cluster.open_epoch(1, {"node-b": "node-c"}, 6)
        failed = wait_until(lambda: cluster.stand_in.report("failed", 1, "node-c"), 20, "the spare's failed report", cluster.stand_in.changed)
        self.assertLessEqual(failed["receivedAt"], deadline + 2.0, "reported within the swap's bound")
        self.assertEqual(failed["shard"], 1)
        self.assertRegex(failed["detail"], r"rendezvous of epoch 1 timed out after \d+ s: shard\(s\) \[0\] did not arrive")
        self.assertNotEqual(spare.finish(30), 0)
        self.assertIn("HotSwapFailed: hot swap to epoch 1 failed", spare.stderr)


if __name__ == "__main__":
    unittest.main()
