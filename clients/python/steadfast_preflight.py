"""Preflight across nodes: before a job's first iteration, its nodes all-reduce among themselves,
and when that fails or is slow, pairwise tests name the node(s) whose link is bad and the
controller takes them out (ByteRobust §6.2: check the machines before a job runs on them).

Run one process per node, before the training step:

    srun --ntasks-per-node=1 python3 steadfast_preflight.py            # a step of the batch script
    python3 steadfast_preflight.py --nodes "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd,)"
                                                                        # a Slurm prolog (see --prolog)

Rendezvous by the usual environment: MASTER_ADDR and MASTER_PORT (or --port), RANK and
WORLD_SIZE, else SLURM_PROCID and SLURM_NTASKS; with --nodes, the rank is this node's place in
the list. The controller and the credential are found as steadfast_client.py finds them
(STEADFAST_CONTROLLER_URL, STEADFAST_TOKEN_FILE with "{node}", STEADFAST_JOB, STEADFAST_NODE).

Exit codes: 0 every node passed; 10 bad nodes were named (and reported, when a controller is
configured: "reported" in the JSON summary); 11 the all-reduce failed or was slow but no node
could be named (every pair passed: the fabric as a whole, or two nodes that a pair cannot tell
apart); 12 the preflight itself could not run (no torch, bad arguments, a node never reached the
rendezvous). One JSON summary is printed on stdout by every process.

How the bad node is found (`bisect`). A pair test is an all-reduce between two nodes only, in a
process group of their own, with its own timeout; the tests of one round run at the same time,
each node in at most one pair. The rule that makes pairs conclusive: a node with a bad link makes
every pair it is in bad, so a good pair clears both of its nodes.

  round 1   pair the nodes (1,2), (3,4), ...: every good pair clears two nodes. With k bad nodes
            at most 2k suspects remain, from n: the suspects are at least halved once n > 4k.
  round 2+  pair each suspect with a cleared node where one is free, else with a suspect it has
            not met. A suspect bad with a cleared partner is named (its every pair was bad); a
            suspect good with it is cleared. Without a cleared node yet, suspects meet new
            partners until a good pair appears.

A single bad node takes two rounds for an even n (three for an odd n: the node the first round
left out needs a partner of its own); two bad nodes at most ceil(log2 n) + 2. The rounds stop
after ceil(log2 n) + 2 or at the deadline; a suspect still unexplained is reported as
undetermined and not named (two nodes alone cannot tell which of them is bad).

Why process groups are built here rather than with torch.distributed.new_group: new_group needs
every rank of the world to enter it and waits for all of them at the store, so one node with a
broken link would hold every pair of the round. A pair's group here is made from the shared
store by its two members only, so a broken pair costs its own timeout and nothing else.
"""

import argparse
import json
import math
import os
import socket
import statistics
import sys
import time
import urllib.error
import urllib.request
from datetime import timedelta

__all__ = ["bisect", "plan_round", "main", "EXIT_OK", "EXIT_BAD_NODES", "EXIT_UNEXPLAINED", "EXIT_CANNOT_RUN"]

EXIT_OK = 0
EXIT_BAD_NODES = 10
EXIT_UNEXPLAINED = 11
EXIT_CANNOT_RUN = 12


def plan_round(suspects, cleared, met):
    """The pairs of one round: each suspect with a free cleared node, else with a free suspect it
    has not met; every node in at most one pair. Deterministic, so every rank plans the same."""
    busy, pairs = set(), []
    for suspect in suspects:
        if suspect in busy:
            continue
        partner = next((node for node in cleared if node not in busy), None)
        if partner is None:
            partner = next((node for node in suspects if node != suspect and node not in busy and node not in met[suspect]), None)
        if partner is None:
            continue
        busy.update((suspect, partner))
        pairs.append((suspect, partner))
    return pairs


def bisect(nodes, test_pairs, max_rounds=None, deadline=None, clock=time.monotonic):
    """Names the nodes whose link is bad (see the module's documentation).

    `test_pairs(pairs)` runs the pair tests of one round at once and returns {pair: True when the
    pair passed}; a pair missing from the answer failed. Returns a dict: bad (named), cleared,
    undetermined, and rounds (each a list of [a, b, passed]).
    """
    nodes = list(nodes)
    if max_rounds is None:
        max_rounds = math.ceil(math.log2(max(2, len(nodes)))) + 2
    suspects, cleared, bad = list(nodes), [], []
    met = {node: set() for node in nodes}
    bad_with = {node: set() for node in nodes}
    rounds = []
    while suspects and len(rounds) < max_rounds and (deadline is None or clock() < deadline):
        pairs = plan_round(suspects, cleared, met)
        if not pairs:
            break
        results = test_pairs(pairs)
        rounds.append([[a, b, bool(results.get((a, b), False))] for a, b in pairs])
        for a, b in pairs:
            met[a].add(b)
            met[b].add(a)
            if results.get((a, b), False):
                cleared.extend(node for node in (a, b) if node not in cleared)
            else:
                bad_with[a].add(b)
                bad_with[b].add(a)
        # Named only now, against every node cleared so far: a suspect that failed with a partner
        # cleared in this same round (by another pair) is as conclusive as one tested against it.
        for node in suspects:
            if node not in cleared and node not in bad and any(partner in cleared for partner in bad_with[node]):
                bad.append(node)
        suspects = [node for node in suspects if node not in cleared and node not in bad]
    return {"bad": bad, "cleared": cleared, "undetermined": suspects, "rounds": rounds}


# ---- the distributed run --------------------------------------------------------------------


class CannotRun(Exception):
    """The preflight could not run at all (exit 12)."""


def _env_int(env, *names):
    for name in names:
        if env.get(name, "") != "":
            return int(env[name])
    return None


def parse_args(argv, env):
    parser = argparse.ArgumentParser(prog="steadfast_preflight", description="All-reduce preflight across a job's nodes.")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--megabytes", type=float, default=4.0, help="size of the tensor all-reduced (default 4 MiB)")
    parser.add_argument("--iterations", type=int, default=3, help="timed all-reduces after one warm-up (default 3)")
    parser.add_argument("--threshold", type=float, default=None, help="seconds one all-reduce may take (default 1.0)")
    parser.add_argument("--expected", type=float, default=None, help="seconds a healthy all-reduce takes; the threshold is it times --slowdown")
    parser.add_argument("--slowdown", type=float, default=4.0, help="how many times --expected is slow (default 4)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a collective (or a group's connection) may block (default 10)")
    parser.add_argument("--deadline", type=float, default=90.0, help="seconds the whole preflight may take (default 90)")
    parser.add_argument("--port", type=int, default=None, help="the rendezvous port (default STEADFAST_PREFLIGHT_PORT, else MASTER_PORT)")
    parser.add_argument("--nodes", default=None, help="the allocation's nodes, comma-separated, in rank order (a prolog's view)")
    parser.add_argument("--job", default=None, help="the steadfast job (default STEADFAST_JOB, else SLURM_JOB_NAME)")
    parser.add_argument("--no-report", action="store_true", help="only print the summary, report nothing to the controller")
    args = parser.parse_args(argv)
    if args.threshold is None:
        args.threshold = args.expected * args.slowdown if args.expected is not None else 1.0
    if min(args.megabytes, args.threshold, args.timeout, args.deadline, args.slowdown) <= 0 or args.iterations < 1:
        parser.error("--megabytes, --threshold, --expected, --slowdown, --timeout, --deadline and --iterations must be positive")
    args.node = env.get("STEADFAST_NODE") or env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    listed = [name for name in (args.nodes or "").split(",") if name]
    if listed:
        if args.node not in listed:
            parser.error("this node (%s) is not in --nodes" % args.node)
        args.rank, args.world = listed.index(args.node), len(listed)
    else:
        args.rank = _env_int(env, "RANK", "SLURM_PROCID")
        args.world = _env_int(env, "WORLD_SIZE", "SLURM_NTASKS", "SLURM_JOB_NUM_NODES")
    args.master = env.get("MASTER_ADDR") or (listed[0] if listed else None)
    args.port = args.port or _env_int(env, "STEADFAST_PREFLIGHT_PORT", "MASTER_PORT")
    if args.rank is None or args.world is None or args.master is None or args.port is None:
        parser.error("need RANK/WORLD_SIZE (or SLURM_PROCID/SLURM_NTASKS, or --nodes), MASTER_ADDR and a port")
    args.job = args.job or env.get("STEADFAST_JOB") or env.get("SLURM_JOB_NAME")
    args.controller = env.get("STEADFAST_CONTROLLER_URL") or None
    # The run, so that a retried report of it is one signal per node at the controller.
    args.run = env.get("SLURM_JOB_ID") or None
    args.token = _token(env, args.node)
    return args


def _token(env, node):
    """The node's credential, found as steadfast_client.py finds it ("{node}" in the file's path)."""
    path = env.get("STEADFAST_TOKEN_FILE")
    if path:
        try:
            with open(path.replace("{node}", node), encoding="utf-8") as handle:
                return handle.read().strip()
        except OSError as error:
            print("steadfast_preflight: cannot read STEADFAST_TOKEN_FILE: %s" % error, file=sys.stderr)
    return env.get("STEADFAST_TOKEN") or None


class Run:
    """One process's part: the store, the groups, the rounds. Rank 0 hosts the store and decides
    each round's results, so that every rank bisects on the same view."""

    def __init__(self, args, dist, torch):
        self.args, self.dist, self.torch = args, dist, torch
        self.deadline = time.monotonic() + args.deadline
        self.timeout = timedelta(seconds=args.timeout)
        numel = max(1, int(args.megabytes * (1 << 20) / 4))
        device = "cuda" if args.backend == "nccl" else "cpu"
        self.tensor = torch.ones(numel, dtype=torch.float32, device=device)
        self.store = dist.TCPStore(args.master, args.port, args.world, args.rank == 0, timedelta(seconds=args.deadline), False)
        self.names = []

    def left(self):
        return max(0.1, self.deadline - time.monotonic())

    def wait_keys(self, keys, seconds):
        """Waits until `keys` exist or `seconds` pass; returns those that exist."""
        try:
            self.store.wait(keys, timedelta(seconds=min(seconds, self.left())))
            return list(keys)
        except RuntimeError:  # the store's wait timed out: which came?
            return [key for key in keys if self.has(key)]

    def has(self, key):
        try:
            self.store.wait([key], timedelta(milliseconds=1))
            return True
        except RuntimeError:
            return False

    def rendezvous(self):
        self.store.set("node/%d" % self.args.rank, self.args.node)
        keys = ["node/%d" % rank for rank in range(self.args.world)]
        present = self.wait_keys(keys, self.args.deadline / 3)
        if len(present) < len(keys):
            missing = [rank for rank in range(self.args.world) if "node/%d" % rank not in present]
            raise CannotRun("ranks %s did not reach the rendezvous at %s:%d" % (missing, self.args.master, self.args.port))
        self.names = [self.store.get(key).decode() for key in keys]

    def group(self, name, ranks):
        """A process group of `ranks` only, on the shared store, with the preflight's timeout."""
        store = self.dist.PrefixStore("pg/%s/" % name, self.store)
        index, size = ranks.index(self.args.rank), len(ranks)
        if self.args.backend == "gloo":
            return self.dist.ProcessGroupGloo(store, index, size, self.timeout)
        options = self.dist.ProcessGroupNCCL.Options()
        options._timeout = self.timeout
        return self.dist.ProcessGroupNCCL(store, index, size, options)

    def measure(self, name, ranks):
        """(passed, median seconds, error) of an all-reduce among `ranks` (this rank one of them)."""
        try:
            group = self.group(name, ranks)
            group.allreduce([self.tensor]).wait()  # warm-up: the connections
            times = []
            for _ in range(self.args.iterations):
                started = time.monotonic()
                group.allreduce([self.tensor]).wait()
                if self.args.backend == "nccl":
                    self.torch.cuda.synchronize()
                times.append(time.monotonic() - started)
            seconds = statistics.median(times)
            return seconds <= self.args.threshold, seconds, None
        except Exception as error:  # a timeout, a reset connection: the group failed, which is the finding
            return False, None, str(error).splitlines()[0][:300] if str(error) else type(error).__name__

    def decide(self, name, members, wait_seconds):
        """Rank 0 gathers the members' verdicts (a missing one is a failure) and publishes the
        result; every rank returns that result."""
        if self.args.rank == 0:
            keys = ["%s/v/%d" % (name, rank) for rank in members]
            present = set(self.wait_keys(keys, wait_seconds))
            verdicts = {str(rank): json.loads(self.store.get(key)) if key in present else None for rank, key in zip(members, keys)}
            self.store.set("%s/result" % name, json.dumps(verdicts))
        if not self.wait_keys(["%s/result" % name], wait_seconds + self.args.timeout):
            raise CannotRun("no result for %s from rank 0 in time" % name)
        return json.loads(self.store.get("%s/result" % name))

    def test_pairs(self, round_index, pairs):
        """One round of pair tests, at the same time; {pair: passed} as rank 0 decided it."""
        by_rank = {}
        for a, b in pairs:
            ra, rb = self.names.index(a), self.names.index(b)
            by_rank[ra] = by_rank[rb] = (a, b, sorted((ra, rb)))
        mine = by_rank.get(self.args.rank)
        if mine is not None:
            name = "pair/%d/%d-%d" % (round_index, mine[2][0], mine[2][1])
            passed, seconds, error = self.measure(name, mine[2])
            self.store.set("round/%d/v/%d" % (round_index, self.args.rank), json.dumps({"passed": passed, "seconds": seconds, "error": error}))
        verdicts = self.decide("round/%d" % round_index, sorted(by_rank), self.pair_bound())
        results = {}
        for a, b in pairs:
            votes = [verdicts.get(str(self.names.index(node))) for node in (a, b)]
            results[(a, b)] = all(vote is not None and vote["passed"] for vote in votes)
            self.pair_times[(a, b)] = [vote and vote["seconds"] for vote in votes]
        return results

    def pair_bound(self):
        """How long a pair test can take: connecting and the warm-up, then each timed iteration."""
        return self.args.timeout * (2 + self.args.iterations) + 5

    def run(self):
        started = time.monotonic()
        self.rendezvous()
        rendezvous_seconds = time.monotonic() - started
        world = list(range(self.args.world))
        passed, seconds, error = self.measure("all", world)
        self.store.set("all/v/%d" % self.args.rank, json.dumps({"passed": passed, "seconds": seconds, "error": error}))
        verdicts = self.decide("all", world, self.pair_bound())
        all_seconds = [v["seconds"] if v else None for v in verdicts.values()]
        summary = {
            "nodes": self.names,
            "node": self.args.node,
            "rank": self.args.rank,
            "threshold": self.args.threshold,
            "allreduce": {"passed": all(v is not None and v["passed"] for v in verdicts.values()), "seconds": _max(all_seconds),
                          "errors": sorted({v["error"] for v in verdicts.values() if v and v["error"]})},
            "rendezvousSeconds": round(rendezvous_seconds, 3),
        }
        all_done = time.monotonic()
        summary["allreduceSeconds"] = round(all_done - started - rendezvous_seconds, 3)
        if summary["allreduce"]["passed"]:
            summary.update(bad=[], undetermined=[], rounds=[], bisectSeconds=0.0)
        else:
            self.pair_times = {}
            rounds = iter(range(1 << 30))
            found = bisect(self.names, lambda pairs: self.test_pairs(next(rounds), pairs), deadline=self.deadline)
            summary.update(bad=found["bad"], undetermined=found["undetermined"], rounds=[
                [[a, b, ok, self.pair_times.get((a, b))] for a, b, ok in one] for one in found["rounds"]])
            summary["bisectSeconds"] = round(time.monotonic() - all_done, 3)
        summary["seconds"] = round(time.monotonic() - started, 3)
        return summary

    def finish(self, summary):
        """The report, by the lowest rank not named (its link works), then every rank leaves together."""
        bad = summary["bad"]
        healthy = [rank for rank, name in enumerate(self.names) if name not in bad and name not in summary["undetermined"]]
        reporter = healthy[0] if healthy else 0
        if bad and self.args.rank == reporter:
            outcome = report(self.args, summary)
            self.store.set("report", json.dumps(outcome))
        if bad:
            got = self.wait_keys(["report"], 30)
            summary.update(json.loads(self.store.get("report")) if got else {"reported": False, "reportError": "no word from the reporter"})
        self.store.add("done", 1)
        if self.args.rank == 0:
            until = time.monotonic() + 10
            while self.store.add("done", 0) < self.args.world and time.monotonic() < until:
                time.sleep(0.05)


def _max(values):
    present = [value for value in values if value is not None]
    return round(max(present), 4) if present else None


def report(args, summary):
    """POST /api/v1/jobs/:job/preflight with this node's credential; {"reported": bool, ...}."""
    if args.no_report or not args.controller or not args.job:
        return {"reported": False, "reportError": "reporting off (no controller, no job, or --no-report)"}
    detail = "all-reduce among %d nodes %s; pair tests named %s" % (
        len(summary["nodes"]),
        "failed (%s)" % "; ".join(summary["allreduce"]["errors"]) if summary["allreduce"]["errors"] else
        "took %ss against a threshold of %ss" % (summary["allreduce"]["seconds"], args.threshold),
        ", ".join(summary["bad"]))
    fields = {"nodes": summary["bad"], "detail": detail[:2000], "seconds": summary.get("seconds", 0)}
    if args.run:
        fields["run"] = args.run
    body = json.dumps(fields).encode()
    url = "%s/api/v1/jobs/%s/preflight" % (args.controller.rstrip("/"), urllib.request.quote(args.job, safe=""))
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    if args.token:
        request.add_header("Authorization", "Bearer %s" % args.token)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for attempt in range(3):
        try:
            with opener.open(request, timeout=10) as response:
                return {"reported": 200 <= response.status < 300, "reportStatus": response.status}
        except urllib.error.HTTPError as error:
            if error.code < 500:
                return {"reported": False, "reportStatus": error.code, "reportError": error.read().decode(errors="replace")[:500]}
            last = "HTTP %d" % error.code
        except OSError as error:
            last = str(error)
        time.sleep(1 + attempt)
    return {"reported": False, "reportError": last}


def exit_code(summary):
    if summary["allreduce"]["passed"]:
        return EXIT_OK
    return EXIT_BAD_NODES if summary["bad"] else EXIT_UNEXPLAINED


def main(argv=None, env=None):
    env = os.environ if env is None else env
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv, env)
    except SystemExit as stop:
        return EXIT_OK if stop.code == 0 else EXIT_CANNOT_RUN
    try:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        if args.backend == "nccl" and not hasattr(dist, "ProcessGroupNCCL"):
            raise CannotRun("this torch has no NCCL backend")
        preflight = Run(args, dist, torch)
        summary = preflight.run()
        preflight.finish(summary)
        code = exit_code(summary)
    except Exception as error:  # noqa: BLE001 - whatever stopped it, the job must learn it could not run
        summary, code = {"node": args.node, "rank": args.rank, "error": "%s: %s" % (type(error).__name__, error)}, EXIT_CANNOT_RUN
    summary["exitCode"] = code
    print(json.dumps(summary, sort_keys=True), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
