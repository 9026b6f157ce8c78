"""Tests of steadfast_client: against a small local stand-in server, and against the real agent
and controller when test/lab/python-client.test.ts starts them and passes their addresses.

Run alone: /usr/bin/python3 -m unittest discover -s clients/python/tests -v
"""

import json
import logging
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from steadfast_client import SteadfastClient  # noqa: E402

# The client logs each failure kind once a minute; these tests make failures on purpose.
logging.getLogger("steadfast_client").addHandler(logging.NullHandler())
logging.getLogger("steadfast_client").propagate = False


class StandIn:
    """An HTTP server on loopback that records requests and answers from a table of routes."""

    def __init__(self):
        self.requests = []
        self.routes = {}  # (method, path without query) -> callable(request) -> (status, body)
        self.hang = threading.Event()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, method):
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                record = {"method": method, "path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": json.loads(raw) if raw else None}
                stand_in.requests.append(record)
                if stand_in.hang.is_set():
                    time.sleep(2)
                route = stand_in.routes.get((method, self.path.split("?")[0]))
                status, body = route(record) if route else (404, {"error": "no such endpoint"})
                data = json.dumps(body).encode() if not isinstance(body, bytes) else body
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer("GET")

            def do_POST(self):
                self._answer("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.hang.clear()
        self.server.shutdown()
        self.server.server_close()

    def posted(self, path):
        return [item for r in self.requests if r["method"] == "POST" and r["path"] == path for item in (r["body"] if isinstance(r["body"], list) else [r["body"]])]


def closed_port_url():
    """A loopback URL nothing listens on: connecting is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return "http://127.0.0.1:%d" % sock.getsockname()[1]


class StandInTest(unittest.TestCase):
    def setUp(self):
        self.server = StandIn()
        self.server.routes[("POST", "/api/v1/training")] = lambda r: (202, {"accepted": len(r["body"])})
        self.server.routes[("POST", "/api/v1/jobs/llama/checkpoints")] = lambda r: (202, {"accepted": len(r["body"])})
        self.client = SteadfastClient("llama", 3, agent_url=self.server.url, controller_url=self.server.url,
                                      controller_token="controller-token-0123456789", agent_token="agent-token-0123456789",
                                      node="node-7", timeout=0.3, retry_base=0.05, retry_max=0.2)

    def tearDown(self):
        self.client.close(0.5)
        self.server.close()

    def test_pushes_steps_in_the_agents_schema_in_batches(self):
        self.client.push_step(1, iteration_seconds=0.25, loss=2.5, grad_norm=1.0, learning_rate=3e-4)
        self.client.push_step(2, loss=float("nan"), skipped=1)
        self.client.push_step(3, loss={"lm loss": float("inf")})
        self.assertTrue(self.client.flush(2))
        steps = self.server.posted("/api/v1/training")
        self.assertEqual(steps[0], {"job": "llama", "rank": 3, "iteration": 1, "iteration_seconds": 0.25, "loss": 2.5, "grad_norm": 1.0, "learning_rate": 3e-4})
        self.assertEqual(steps[1], {"job": "llama", "rank": 3, "iteration": 2, "loss": "nan", "skipped": 1})
        self.assertEqual(steps[2]["loss"], {"lm loss": "inf"})
        self.assertEqual(self.server.requests[0]["headers"].get("authorization"), "Bearer agent-token-0123456789")
        for i in range(4, 104):
            self.client.push_step(i, iteration_seconds=0.1)
        self.assertTrue(self.client.flush(2))
        self.assertEqual([s["iteration"] for s in self.server.posted("/api/v1/training")], list(range(1, 104)))
        self.assertLess(len(self.server.requests), 103, "steps go in batches, not one request each")
        self.assertEqual(self.client.stats["sent"], 103)

    def test_refuses_unknown_fields_locally_without_raising(self):
        self.assertFalse(self.client.push_step(1, not_a_field=3))
        self.assertEqual(self.client.stats["failed"], 1)

    def test_reports_checkpoint_shards_to_the_controller(self):
        self.client.report_checkpoint(10)
        self.client.report_checkpoint(10, tier="remote", rank=4)
        self.assertTrue(self.client.flush(2))
        self.assertEqual(self.server.posted("/api/v1/jobs/llama/checkpoints"), [
            {"step": 10, "rank": 3, "tier": "disk", "holder": "node-7"},
            {"step": 10, "rank": 4, "tier": "remote"},
        ])
        request = [r for r in self.server.requests if r["path"].endswith("/checkpoints")][0]
        self.assertEqual(request["headers"].get("authorization"), "Bearer controller-token-0123456789")
        self.assertFalse(self.client.report_checkpoint(11, tier="tape"))

    def test_keeps_checkpoint_reports_until_the_controller_takes_them(self):
        answers = iter([(503, {"error": "redis down"}), (503, {"error": "redis down"})])
        self.server.routes[("POST", "/api/v1/jobs/llama/checkpoints")] = lambda r: next(answers, (202, {"accepted": len(r["body"])}))
        self.client.report_checkpoint(20)
        self.assertTrue(self.client.flush(3))
        self.assertEqual(self.server.posted("/api/v1/jobs/llama/checkpoints"), [{"step": 20, "rank": 3, "tier": "disk", "holder": "node-7"}] * 3)
        self.assertEqual(self.client.stats["sent"], 1)

    def test_restore_plan(self):
        plan = {"step": 40, "sources": [{"rank": 3, "tier": "disk", "holder": "node-7", "local": True}], "skipped": []}
        self.server.routes[("GET", "/api/v1/jobs/llama/restore-plan")] = lambda r: (200, plan)
        self.assertEqual(self.client.restore_plan(), plan)
        self.assertEqual(self.client.restore_plan(evicted=["node-2", "node-5"]), plan)
        self.assertTrue(self.server.requests[-1]["path"].endswith("?evicted=node-2%2Cnode-5"))
        self.server.routes[("GET", "/api/v1/jobs/llama/restore-plan")] = lambda r: (409, {"error": "no checkpoint step survives"})
        self.assertIsNone(self.client.restore_plan())
        self.assertEqual(self.client.stats["failed"], 0, "409 is an answer: nothing to restore")

    def test_follows_microbatch_revisions_and_keeps_the_last_plan_when_the_controller_is_away(self):
        plans = {"now": {"revision": 0, "assignment": [4, 4], "strategy": "even"}}
        self.server.routes[("GET", "/api/v1/jobs/llama/microbatches")] = lambda r: (200, plans["now"])
        self.assertEqual(self.client.microbatch_share(1, default=2), 4)
        plans["now"] = {"revision": 1, "assignment": [6, 2], "strategy": "rebalanced"}
        self.assertEqual(self.client.microbatch_share(1, default=2), 2)
        self.server.routes[("GET", "/api/v1/jobs/llama/microbatches")] = lambda r: (500, {"error": "boom"})
        self.assertEqual(self.client.microbatch_share(0, default=2), 6)
        self.assertEqual(self.client.microbatch_share(7, default=2), 2, "a group the plan does not name gets the default")

    def test_a_job_without_a_microbatch_plan_is_asked_once_and_its_checkpoint_reports_go_out_at_once(self):
        self.server.routes[("GET", "/api/v1/jobs/llama/microbatches")] = lambda r: (400, {"error": "job llama was registered without microbatches.perIteration"})
        self.assertIsNone(self.client.microbatches())
        self.assertEqual(self.client.microbatch_share(0, default=4), 4)
        self.client.report_checkpoint(20, tier="remote")
        self.assertTrue(self.client.flush(0.5), "a 400 is an answer, not an outage: no pause for the controller")
        self.assertEqual(self.server.posted("/api/v1/jobs/llama/checkpoints"), [{"step": 20, "rank": 3, "tier": "remote"}])
        asked = [r for r in self.server.requests if r["path"] == "/api/v1/jobs/llama/microbatches"]
        self.assertEqual(len(asked), 1)
        self.assertEqual(self.client.stats["failed"], 0)

    def test_a_hung_controller_costs_one_timeout_then_is_left_alone(self):
        self.server.routes[("GET", "/api/v1/jobs/llama/restore-plan")] = lambda r: (200, {"step": 1})
        self.server.hang.set()
        started = time.monotonic()
        self.assertIsNone(self.client.restore_plan())
        self.assertLess(time.monotonic() - started, 1.0)
        started = time.monotonic()
        self.assertIsNone(self.client.microbatches())
        self.assertLess(time.monotonic() - started, 0.05, "inside the pause, no second timeout")
        self.assertEqual(self.client.stats["skipped"], 1)

    def test_stack_dumps_on_sigusr1(self):
        with tempfile.TemporaryDirectory() as directory:
            path = self.client.enable_stack_dumps(directory)
            self.assertEqual(os.path.dirname(path), directory)
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.1)
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            self.assertIn("job llama rank 3", text)
            self.assertIn("test_stack_dumps_on_sigusr1", text)
            self.assertRegex(text, r"Thread 0x[0-9a-f]+")


class DownServersTest(unittest.TestCase):
    def test_nothing_raises_and_nothing_waits_when_agent_and_controller_are_down(self):
        client = SteadfastClient("llama", 0, agent_url=closed_port_url(), controller_url=closed_port_url(), timeout=0.3)
        started = time.monotonic()
        for i in range(200):
            self.assertTrue(client.push_step(i, iteration_seconds=0.1, loss=1.0))
        client.report_checkpoint(5)
        self.assertLess(time.monotonic() - started, 0.2, "pushing never waits on the network")
        self.assertIsNone(client.restore_plan())
        self.assertEqual(client.microbatch_share(0, default=3), 3)
        client.close(0.5)
        self.assertGreaterEqual(client.stats["failed"], 2)

    def test_from_env(self):
        with tempfile.NamedTemporaryFile("w", suffix=".token") as token:
            token.write("secret-token-0123456789\n")
            token.flush()
            env = {"STEADFAST_JOB": "gpt", "SLURM_PROCID": "5", "STEADFAST_AGENT_URL": "http://10.0.0.1:9401",
                   "STEADFAST_CONTROLLER_URL": "http://10.0.0.2:9400", "STEADFAST_TOKEN_FILE": token.name, "SLURMD_NODENAME": "node-9"}
            with mock.patch.dict(os.environ, env):
                os.environ.pop("RANK", None)
                client = SteadfastClient.from_env()
            self.assertEqual((client.job, client.rank, client.node), ("gpt", 5, "node-9"))
            self.assertEqual(client._controller.token, "secret-token-0123456789")
            client.close(0.1)

    def test_from_env_reads_the_token_file_of_its_own_node(self):
        with tempfile.TemporaryDirectory() as directory:
            for node in ("node-1", "node-2"):
                with open(os.path.join(directory, "token-" + node), "w", encoding="utf-8") as handle:
                    handle.write(node + ".0123456789abcdef\n")
            env = {"STEADFAST_TOKEN_FILE": os.path.join(directory, "token-{node}"), "STEADFAST_NODE": "node-2",
                   "STEADFAST_CONTROLLER_URL": "http://10.0.0.2:9400"}
            with mock.patch.dict(os.environ, env):
                client = SteadfastClient.from_env()
            self.assertEqual(client._controller.token, "node-2.0123456789abcdef")
            client.close(0.1)


@unittest.skipUnless(os.environ.get("STEADFAST_TEST_AGENT_URL"), "the real agent: run by test/lab/python-client.test.ts")
class RealAgentTest(unittest.TestCase):
    def test_pushed_steps_become_the_agents_training_series(self):
        url = os.environ["STEADFAST_TEST_AGENT_URL"]
        token = os.environ.get("STEADFAST_TEST_AGENT_TOKEN")
        clients = [SteadfastClient("pyclient", rank, agent_url=url, controller_url=None, agent_token=token) for rank in (0, 1)]
        for client in clients:
            for step in range(1, 8):
                client.push_step(step, iteration_seconds=0.5 + client.rank, loss={"lm loss": 2.0 / step}, grad_norm=float("nan"))
        for client in clients:
            self.assertTrue(client.flush(5))
            self.assertEqual(client.stats, {"sent": 7, "failed": 0, "dropped": 0, "skipped": 0})
            client.close(0.5)
        with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
            metrics = response.read().decode()
        for rank, seconds in ((0, "0.5"), (1, "1.5")):
            self.assertRegex(metrics, r'steadfast_training_iteration\{training_job="pyclient",rank="%d"\} 7\n' % rank)
            self.assertRegex(metrics, r'steadfast_training_iteration_seconds\{training_job="pyclient",rank="%d"\} %s\n' % (rank, re.escape(seconds)))
            self.assertRegex(metrics, r'steadfast_training_iterations_total\{training_job="pyclient",rank="%d"\} 7\n' % rank)
        self.assertRegex(metrics, r'steadfast_training_grad_norm\{training_job="pyclient",rank="0"\} (?i:nan)\n', "prom-client spells it Nan; Prometheus reads either")


@unittest.skipUnless(os.environ.get("STEADFAST_TEST_CONTROLLER_URL"), "the real controller: run by test/lab/python-client.test.ts")
class RealControllerTest(unittest.TestCase):
    """Against a controller where the test registered job `pyclient` on node-1, node-2 (one rank each)."""

    def client(self, rank, node):
        return SteadfastClient("pyclient", rank, agent_url=None, controller_url=os.environ["STEADFAST_TEST_CONTROLLER_URL"],
                               controller_token=os.environ["STEADFAST_TEST_CONTROLLER_TOKEN"], node=node)

    def test_checkpoint_reports_make_the_restore_plan(self):
        first, second = self.client(0, "node-1"), self.client(1, "node-2")
        self.assertIsNone(first.restore_plan(), "nothing reported yet")
        for client in (first, second):
            client.report_checkpoint(10)
        first.report_checkpoint(20)  # rank 1 never finished step 20
        second.report_checkpoint(20, tier="remote", rank=1)
        second.report_checkpoint(30, rank=1)
        for client in (first, second):
            self.assertTrue(client.flush(5))
        plan = first.restore_plan()
        self.assertEqual(plan["step"], 20)
        self.assertEqual(plan["skipped"], [{"step": 30, "missingRank": 0}])
        self.assertEqual(first.restore_plan(evicted=["node-2"])["step"], 20, "rank 1's step 20 is remote")
        self.assertIsNone(first.restore_plan(evicted=["node-1"]), "rank 0's shards were all on node-1's disk")
        for client in (first, second):
            self.assertEqual(client.stats["failed"], 0)
            client.close(0.5)

    def test_microbatch_plan(self):
        client = self.client(0, "node-1")
        plan = client.microbatches()
        self.assertEqual((plan["strategy"], plan["assignment"], plan["revision"]), ("even", [4, 4], 0))
        self.assertEqual(client.microbatch_share(1, default=1), 4)
        client.close(0.5)


if __name__ == "__main__":
    unittest.main()
