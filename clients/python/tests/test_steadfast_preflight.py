"""Tests of the preflight (steadfast_preflight.py): the bisection as a pure function over a link
test, and whole runs of four node processes under real gloo on 127.0.0.1 with one node's link
made slow or broken, reporting to a stand-in controller.

Run alone: /usr/bin/python3 -m unittest discover -s clients/python/tests -p 'test_steadfast_preflight.py' -v
"""

import itertools
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from steadfast_preflight import EXIT_BAD_NODES, EXIT_CANNOT_RUN, EXIT_OK, EXIT_UNEXPLAINED, bisect, main  # noqa: E402

WORKER = os.path.join(HERE, "preflight_worker.py")


def link_test(bad, calls=None):
    """A test of pairs where a pair fails exactly when it holds a node of `bad`."""
    def test(pairs):
        if calls is not None:
            calls.append(list(pairs))
        for a, b in pairs:
            assert len({a, b}) == 2, "a node paired with itself"
        nodes = [node for pair in pairs for node in pair]
        assert len(nodes) == len(set(nodes)), "a node in two pairs of one round: %s" % pairs
        return {(a, b): a not in bad and b not in bad for a, b in pairs}
    return test


def names(count):
    return ["n%02d" % index for index in range(count)]


class BisectionTest(unittest.TestCase):
    def test_a_single_bad_node_is_named_in_two_rounds_three_for_odd_counts_wherever_it_is_among_3_to_64_nodes(self):
        for count in list(range(3, 18)) + [32, 64]:
            nodes = names(count)
            for culprit in nodes:
                found = bisect(nodes, link_test({culprit}))
                self.assertEqual(found["bad"], [culprit], (count, culprit))
                self.assertEqual(found["undetermined"], [])
                self.assertEqual(sorted(found["cleared"]), sorted(set(nodes) - {culprit}))
                self.assertLessEqual(len(found["rounds"]), 2 if count % 2 == 0 else 3, (count, culprit, found["rounds"]))

    def test_two_bad_nodes_are_both_named_within_log2_n_plus_2_rounds_and_no_good_node_is(self):
        for count in (4, 5, 6, 8, 9, 16):
            nodes = names(count)
            for pair in itertools.combinations(nodes, 2):
                found = bisect(nodes, link_test(set(pair)))
                self.assertEqual(sorted(found["bad"]), sorted(pair), (count, pair, found))
                self.assertEqual(found["undetermined"], [])
                self.assertLessEqual(len(found["rounds"]), math.ceil(math.log2(count)) + 2)

    def test_the_first_round_tests_disjoint_pairs_and_leaves_only_the_failed_pairs_suspect(self):
        calls = []
        found = bisect(names(8), link_test({"n05"}, calls))
        self.assertEqual(calls[0], [("n00", "n01"), ("n02", "n03"), ("n04", "n05"), ("n06", "n07")])
        # Round 2: the two suspects, each against a node the first round cleared.
        self.assertEqual(calls[1], [("n04", "n00"), ("n05", "n01")])
        self.assertEqual(found["bad"], ["n05"])

    def test_two_nodes_alone_cannot_tell_which_is_bad_and_name_neither(self):
        found = bisect(names(2), link_test({"n01"}))
        self.assertEqual(found["bad"], [])
        self.assertEqual(sorted(found["undetermined"]), ["n00", "n01"])

    def test_when_every_pair_passes_no_node_is_named(self):
        found = bisect(names(6), link_test(set()))
        self.assertEqual(found["bad"], [])
        self.assertEqual(found["undetermined"], [])
        self.assertEqual(len(found["rounds"]), 1)

    def test_a_bad_link_between_two_good_nodes_names_neither_of_them(self):
        def test(pairs):
            return {(a, b): {a, b} != {"n02", "n03"} for a, b in pairs}
        found = bisect(names(6), test)
        self.assertEqual(found["bad"], [])
        self.assertEqual(found["undetermined"], [])

    def test_a_pair_missing_from_the_answer_counts_as_failed(self):
        found = bisect(names(4), lambda pairs: {pair: "n03" not in pair for pair in pairs if "n03" not in pair})
        self.assertEqual(found["bad"], ["n03"])

    def test_the_deadline_stops_the_rounds_and_leaves_the_rest_undetermined(self):
        clock = iter([0.0, 100.0, 100.0])
        found = bisect(names(4), link_test({"n00", "n02"}), deadline=50.0, clock=lambda: next(clock))
        self.assertEqual(len(found["rounds"]), 1)
        self.assertEqual(found["bad"], [])
        self.assertEqual(sorted(found["undetermined"]), ["n00", "n01", "n02", "n03"])


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StandInController:
    """Takes POST /api/v1/jobs/:job/preflight and keeps what came, with the credential."""

    def __init__(self):
        self.reports = []
        reports = self.reports

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server interface
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                reports.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": json.loads(body)})
                self.send_response(202)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"accepted":true}')

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class WholeRunTest(unittest.TestCase):
    """Four node processes, gloo on 127.0.0.1, each with its own node name and token."""

    def setUp(self):
        self.controller = StandInController()
        self.dir = tempfile.mkdtemp(prefix="steadfast-preflight-")
        for index in range(4):
            with open(os.path.join(self.dir, "token-node-%d" % index), "w") as handle:
                handle.write("token-of-node-%d\n" % index)

    def tearDown(self):
        self.controller.close()

    def run_nodes(self, slow=(), broken=(), extra=()):
        port = free_port()
        processes = []
        for rank in range(4):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       STEADFAST_NODE="node-%d" % rank, STEADFAST_JOB="pf", STEADFAST_CONTROLLER_URL=self.controller.url,
                       STEADFAST_TOKEN_FILE=os.path.join(self.dir, "token-{node}"), TEST_SLOW_NODES=",".join(slow),
                       TEST_BROKEN_NODES=",".join(broken), PYTHONDONTWRITEBYTECODE="1")
            argv = [sys.executable, WORKER, "--megabytes", "0.25", "--iterations", "2", "--threshold", "0.3", "--timeout", "2", *extra]
            processes.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results = []
        for process in processes:
            out, err = process.communicate(timeout=120)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            self.assertTrue(lines, "no summary; stderr: %s" % err[-2000:])
            results.append((process.returncode, json.loads(lines[-1])))
        return results

    def test_healthy_nodes_pass_with_exit_0_and_report_nothing(self):
        results = self.run_nodes()
        self.assertEqual([code for code, _ in results], [EXIT_OK] * 4)
        self.assertTrue(results[0][1]["allreduce"]["passed"])
        self.assertEqual(results[0][1]["nodes"], ["node-0", "node-1", "node-2", "node-3"])
        self.assertEqual(self.controller.reports, [])

    def test_a_slow_node_is_named_by_every_process_and_reported_once_with_a_healthy_nodes_credential(self):
        started = time.monotonic()
        results = self.run_nodes(slow=["node-2"])
        elapsed = time.monotonic() - started
        self.assertEqual([code for code, _ in results], [EXIT_BAD_NODES] * 4)
        for _, summary in results:
            self.assertEqual(summary["bad"], ["node-2"])
            self.assertFalse(summary["allreduce"]["passed"])
            self.assertTrue(summary["reported"])
            self.assertEqual(len(summary["rounds"]), 2)
        self.assertEqual(len(self.controller.reports), 1)
        sent = self.controller.reports[0]
        self.assertEqual(sent["path"], "/api/v1/jobs/pf/preflight")
        self.assertEqual(sent["auth"], "Bearer token-of-node-0")
        self.assertEqual(sent["body"]["nodes"], ["node-2"])
        self.assertIn("node-2", sent["body"]["detail"])
        self.assertLess(elapsed, 60)

    def test_a_broken_node_costs_each_pair_its_timeout_and_is_named_without_hanging_the_run(self):
        results = self.run_nodes(broken=["node-0"])
        self.assertEqual([code for code, _ in results], [EXIT_BAD_NODES] * 4)
        self.assertEqual(results[1][1]["bad"], ["node-0"])
        # node-0 is named: a node whose link works reports.
        self.assertEqual(self.controller.reports[0]["auth"], "Bearer token-of-node-1")
        self.assertLess(results[1][1]["seconds"], 30)

    def test_with_reporting_off_the_named_node_is_printed_and_not_sent(self):
        results = self.run_nodes(slow=["node-3"], extra=["--no-report"])
        self.assertEqual(results[0][0], EXIT_BAD_NODES)
        self.assertEqual(results[0][1]["bad"], ["node-3"])
        self.assertFalse(results[0][1]["reported"])
        self.assertEqual(self.controller.reports, [])


class CannotRunTest(unittest.TestCase):
    def test_without_a_rank_or_a_rendezvous_it_exits_with_its_cannot_run_code(self):
        self.assertEqual(main([], env={"STEADFAST_NODE": "x"}), EXIT_CANNOT_RUN)
        self.assertNotEqual(EXIT_UNEXPLAINED, EXIT_CANNOT_RUN)

    def test_a_rank_no_other_joins_gives_up_at_the_deadline_with_the_cannot_run_code(self):
        env = {"STEADFAST_NODE": "alone", "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        started = time.monotonic()
        self.assertEqual(main(["--deadline", "3"], env=env), EXIT_CANNOT_RUN)
        self.assertLess(time.monotonic() - started, 10)


if __name__ == "__main__":
    unittest.main()
