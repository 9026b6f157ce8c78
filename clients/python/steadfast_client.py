"""The training side of steadfast, for a PyTorch (or any Python) training loop.

Standard library only, so it runs under any Python 3.8+ a cluster has. One client per rank:

    from steadfast_client import SteadfastClient
    client = SteadfastClient.from_env(job="llama-70b")   # RANK/SLURM_PROCID, STEADFAST_* env
    client.enable_stack_dumps()                          # kill -USR1 <pid> writes every thread's stack
    plan = client.restore_plan()                         # where to resume, or None
    for step in ...:
        share = client.microbatch_share(dp_rank, default=even_share)
        ...
        client.push_step(step, iteration_seconds=compute_seconds, loss=loss)
        if step % k == 0:
            save(...); client.report_checkpoint(step, tier="disk")
    client.close()

What it talks to (docs/http-api.md):
  - the node's agent: ``POST /api/v1/training`` (step metrics, batched);
  - the controller: ``POST /api/v1/jobs/:id/checkpoints``, ``GET /api/v1/jobs/:id/restore-plan``,
    ``GET /api/v1/jobs/:id/microbatches``, and for hot swap (steadfast_hotswap.py)
    ``GET``/``POST /api/v1/jobs/:id/world``.

The rule it keeps: steadfast must never stop or slow training. Nothing here raises into the
caller. Pushes go through a bounded queue to one background thread, so an iteration never waits
on the network; the two calls that must answer now (restore plan, micro-batches) have a short
timeout, and after a failure an endpoint is left alone for a growing pause instead of costing a
timeout on every iteration. Failures are counted (``client.stats``) and logged at most once a
minute.
"""

import collections
import faulthandler
import json
import logging
import math
import os
import signal
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

__all__ = ["SteadfastClient"]

_LOG = logging.getLogger("steadfast_client")

# Field names the agent's POST /api/v1/training accepts besides job, rank and iteration
# (agent/training-push.ts); anything else would make the agent refuse the whole batch.
_STEP_FIELDS = (
    "iteration_seconds", "loss", "grad_norm", "loss_scale", "learning_rate",
    "samples_per_second", "tflops_per_gpu", "skipped", "nan",
)
_COUNT_FIELDS = ("skipped", "nan")
_TIERS = ("gpu", "host", "disk", "peer", "remote")
# The agent takes at most 1000 steps per POST; the controller a body of modest size.
_BATCH = 200


def _json_float(value):
    """JSON has no NaN or infinity; the agent accepts them spelt as strings."""
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _read_token(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip()


class _Target:
    """One server (agent or controller): its queue of pending bodies and its failure pause."""

    def __init__(self, name, url, token, keep_on_failure, capacity):
        self.name = name
        self.url = url.rstrip("/") if url else None
        self.token = token
        # Steps are gauges: after a failure the next ones supersede them. Checkpoint reports are
        # what a restore is planned from, so they wait for the server to come back.
        self.keep_on_failure = keep_on_failure
        self.pending = collections.deque(maxlen=capacity)
        self.failures = 0
        self.retry_at = 0.0

    def available(self, now):
        return self.url is not None and now >= self.retry_at


class SteadfastClient:
    """Reports a rank's training to steadfast; see the module documentation."""

    def __init__(self, job, rank, agent_url="http://127.0.0.1:9401", controller_url=None,
                 controller_token=None, agent_token=None, node=None, timeout=0.5,
                 queue_size=1000, retry_base=1.0, retry_max=60.0):
        self.job = str(job)
        self.rank = int(rank)
        self.node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        self.timeout = float(timeout)
        self.retry_base = float(retry_base)
        self.retry_max = float(retry_max)
        self.stats = {"sent": 0, "failed": 0, "dropped": 0, "skipped": 0}
        self._agent = _Target("agent", agent_url, agent_token, False, queue_size)
        self._controller = _Target("controller", controller_url, controller_token, True, queue_size)
        # No proxy: these servers are on this node or this cluster, and a proxy from the
        # environment must not receive the job's reports.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._lock = threading.Condition()
        self._in_flight = 0
        self._closed = False
        self._last_log = {}
        self._plan = None
        self._no_microbatches = False
        self._stack_file = None
        self._thread = threading.Thread(target=self._send_loop, name="steadfast-client", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls, job=None, rank=None, **overrides):
        """A client configured from the environment a Slurm or torchrun launch provides.

        STEADFAST_JOB (else SLURM_JOB_NAME), RANK (else SLURM_PROCID), STEADFAST_AGENT_URL,
        STEADFAST_AGENT_TOKEN_FILE, STEADFAST_CONTROLLER_URL, STEADFAST_TOKEN_FILE (else
        STEADFAST_TOKEN), STEADFAST_NODE (else SLURMD_NODENAME, else the host name). A token
        file's path may hold "{node}", replaced by this node's name: the controller token is
        the node's agent token (`steadfast token agent --node NODE`).
        """
        env = os.environ
        settings = {
            "job": job or env.get("STEADFAST_JOB") or env.get("SLURM_JOB_NAME") or "training",
            "rank": rank if rank is not None else int(env.get("RANK", env.get("SLURM_PROCID", "0"))),
            "agent_url": env.get("STEADFAST_AGENT_URL", "http://127.0.0.1:9401"),
            "controller_url": env.get("STEADFAST_CONTROLLER_URL") or None,
            "node": env.get("STEADFAST_NODE") or None,
        }
        # One launch environment serves every node: "{node}" in a token file's path becomes this
        # node's name, so each rank reads its own node's credential (the controller takes a
        # node's agent token for jobs on that node only).
        node = settings["node"] or env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        for key, variable in (("agent_token", "STEADFAST_AGENT_TOKEN_FILE"), ("controller_token", "STEADFAST_TOKEN_FILE")):
            path = env.get(variable)
            if path:
                path = path.replace("{node}", node)
                try:
                    settings[key] = _read_token(path)
                except OSError as error:
                    _LOG.warning("steadfast: cannot read %s=%s: %s", variable, path, error)
        if "controller_token" not in settings and env.get("STEADFAST_TOKEN"):
            settings["controller_token"] = env["STEADFAST_TOKEN"]
        settings.update(overrides)
        return cls(**settings)

    # ---- reports that may wait: queued, sent by the background thread ----

    def push_step(self, iteration, iteration_seconds=None, loss=None, **fields):
        """Queues one step's metrics for the agent. Returns False only if it was not queued."""
        try:
            step = {"job": self.job, "rank": self.rank, "iteration": int(iteration)}
            if iteration_seconds is not None:
                step["iteration_seconds"] = max(0.0, float(iteration_seconds))
            if loss is not None:
                step["loss"] = {str(k): _json_float(v) for k, v in loss.items()} if isinstance(loss, dict) else _json_float(loss)
            for name, value in fields.items():
                if name not in _STEP_FIELDS or value is None:
                    raise ValueError("unknown or empty step field %r" % name)
                step[name] = int(value) if name in _COUNT_FIELDS else _json_float(value)
            return self._enqueue(self._agent, step)
        except Exception as error:  # noqa: BLE001 - a bad value must not stop training either
            self._failed("push_step", error)
            return False

    def report_checkpoint(self, step, tier="disk", holder=None, rank=None):
        """Queues a checkpoint shard report: this rank's state at `step` is saved in `tier`.

        `holder` is the node holding the copy (default: this node); a remote copy has none.
        """
        try:
            if tier not in _TIERS:
                raise ValueError("tier must be one of %s" % ", ".join(_TIERS))
            shard = {"step": int(step), "rank": self.rank if rank is None else int(rank), "tier": tier}
            if tier != "remote":
                shard["holder"] = holder or self.node
            return self._enqueue(self._controller, shard)
        except Exception as error:  # noqa: BLE001
            self._failed("report_checkpoint", error)
            return False

    def flush(self, timeout=2.0):
        """Waits up to `timeout` seconds for queued reports to be sent; True when none are left."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._in_flight or any(t.pending and t.url for t in (self._agent, self._controller)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.notify_all()
                self._lock.wait(min(remaining, 0.05))
        return True

    def close(self, timeout=1.0):
        """Sends what it can within `timeout`, then stops the background thread."""
        self.flush(timeout)
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout=max(0.1, timeout))

    # ---- answers needed now: short timeout, never raised ----

    def restore_plan(self, evicted=()):
        """The step to resume from and where each rank's shard is, or None.

        None when there is no controller, it cannot be reached, or no checkpoint step survives
        (409). The answer is {step, sources: [{rank, tier, holder, local}], skipped}.
        """
        query = "?evicted=" + urllib.parse.quote(",".join(evicted)) if evicted else ""
        status, body = self._get(self._controller, "/api/v1/jobs/%s/restore-plan%s" % (urllib.parse.quote(self.job), query), allow=(409,))
        if status == 200 and isinstance(body, dict) and isinstance(body.get("step"), int):
            return body
        return None

    def microbatches(self):
        """The job's current micro-batch plan, or the last one seen when the controller is away.

        {job, microbatches, dpGroups, assignment, strategy, revision, ...}; None before any, and
        for good once the controller answers 400 (the job was registered without `microbatches`):
        that is an answer, not an outage, so it does not pause the checkpoint reports either.
        """
        if self._no_microbatches:
            return None
        status, body = self._get(self._controller, "/api/v1/jobs/%s/microbatches" % urllib.parse.quote(self.job), allow=(400,))
        if status == 400:
            self._no_microbatches = True
            _LOG.info("steadfast: job %s has no micro-batch plan (%s); using the default share", self.job, body.get("error") if isinstance(body, dict) else body)
            return None
        if status == 200 and isinstance(body, dict) and isinstance(body.get("assignment"), list):
            if self._plan is None or body.get("revision") != self._plan.get("revision"):
                self._plan = body
        return self._plan

    def world(self):
        """The job's hot-swap world (epoch, shards, spares, replicas, swap), or None.

        None when there is no controller, it cannot be reached, or the answer is not a world.
        The caller polls at its own pace (every 100 ms during a swap), so a failure here does not
        pause the controller's other calls the way a failed restore plan does.
        """
        if self._controller.url is None:
            return None
        path = "/api/v1/jobs/%s/world" % urllib.parse.quote(self.job)
        try:
            status, body = self._request(self._controller, "GET", path)
            if status == 200 and isinstance(body, dict) and isinstance(body.get("epoch"), int) and isinstance(body.get("shards"), list):
                return body
            raise RuntimeError("HTTP %d: %s" % (status, body))
        except Exception as error:  # noqa: BLE001 - timeouts, refusals, bad JSON alike
            self._failed("controller GET %s" % path, error)
            return None

    def report_world(self, epoch, event, shard=None, step=None, step_seconds=None, detail=None, missing=None):
        """Reports this rank's part in a world epoch now (joined, stepped, failed, spare).

        Sent at once with the client's timeout, not queued: a `failed` report must be out before
        the rank gives up. True when the controller accepted it (202); never raises.
        """
        body = {"epoch": int(epoch), "node": self.node, "event": str(event)}
        for key, value in (("shard", shard), ("step", step)):
            if value is not None:
                body[key] = int(value)
        if step_seconds is not None:
            body["stepSeconds"] = max(0.0, float(step_seconds))
        if detail:
            body["detail"] = str(detail)[:500]  # the controller takes 512 characters
        if missing:
            body["missing"] = [int(shard) for shard in missing][:1024]  # a failed report: shards that never arrived
        if self._controller.url is None:
            return False
        try:
            status, answer = self._request(self._controller, "POST", "/api/v1/jobs/%s/world" % urllib.parse.quote(self.job), body)
            if status in (200, 202):
                return True
            raise RuntimeError("HTTP %d: %s" % (status, answer))
        except Exception as error:  # noqa: BLE001 - refused, timed out, stale (409): logged, not raised
            self._failed("controller POST world %s" % event, error)
            return False

    @property
    def controller_url(self):
        """The controller this client reports to, or None."""
        return self._controller.url

    def microbatch_share(self, dp_rank, default, plan=None):
        """Micro-batches data-parallel group `dp_rank` runs this iteration (Greyhound §5.2).

        From `plan` when given (the caller just fetched it), else from a fresh `microbatches()`.
        """
        plan = plan if plan is not None else self.microbatches()
        try:
            share = int(plan["assignment"][dp_rank]) if plan else int(default)
            return share if share >= 0 else int(default)
        except (IndexError, KeyError, TypeError, ValueError):
            return int(default)

    # ---- stacks without py-spy ----

    def enable_stack_dumps(self, directory=None, signum=None, on_fatal=True):
        """Writes every thread's Python stack to a file when the process gets `signum`.

        The file is `<directory>/<job>-rank<rank>-pid<pid>.stacks` (directory: $STEADFAST_STACK_DIR,
        else <tmp>/steadfast-stacks); each `kill -USR1 <pid>` appends one dump. With `on_fatal`,
        a segfault or abort also leaves its stack there. Returns the path, or None.
        """
        try:
            signum = signal.SIGUSR1 if signum is None else signum
            directory = directory or os.environ.get("STEADFAST_STACK_DIR") or os.path.join(tempfile.gettempdir(), "steadfast-stacks")
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, "%s-rank%d-pid%d.stacks" % (self.job, self.rank, os.getpid()))
            handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - faulthandler needs it open
            handle.write("# steadfast: job %s rank %d pid %d node %s; one dump per signal %d\n" % (self.job, self.rank, os.getpid(), self.node, signum))
            handle.flush()
            faulthandler.register(signum, file=handle, all_threads=True, chain=False)
            if on_fatal:
                faulthandler.enable(file=handle, all_threads=True)
            self._stack_file = handle  # faulthandler writes to the descriptor: keep it open
            return path
        except Exception as error:  # noqa: BLE001
            self._failed("enable_stack_dumps", error)
            return None

    # ---- plumbing ----

    def _enqueue(self, target, item):
        if target.url is None:
            return False
        with self._lock:
            if len(target.pending) == target.pending.maxlen:
                self.stats["dropped"] += 1  # the deque drops the oldest
            target.pending.append(item)
            self._lock.notify_all()
        return True

    def _backoff(self, target):
        target.failures += 1
        target.retry_at = time.monotonic() + min(self.retry_max, self.retry_base * 2 ** (target.failures - 1))

    def _failed(self, what, error):
        with self._lock:
            self.stats["failed"] += 1
            now = time.monotonic()
            if now - self._last_log.get(what, -math.inf) < 60:
                return
            self._last_log[what] = now
        _LOG.warning("steadfast: %s failed (training goes on; %d failures so far): %s", what, self.stats["failed"], error)

    def _request(self, target, method, path, body=None):
        headers = {"accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["content-type"] = "application/json"
        if target.token:
            headers["authorization"] = "Bearer " + target.token
        request = urllib.request.Request(target.url + path, data=data, headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            try:
                return error.code, json.loads(error.read() or b"null")
            except ValueError:
                return error.code, None
            finally:
                error.close()

    def _get(self, target, path, allow=()):
        if target.url is None:
            return None, None
        if not target.available(time.monotonic()):
            with self._lock:
                self.stats["skipped"] += 1
            return None, None
        try:
            status, body = self._request(target, "GET", path)
            if status == 200 or status in allow:
                target.failures = 0
                return status, body
            raise RuntimeError("HTTP %d: %s" % (status, body))
        except Exception as error:  # noqa: BLE001 - timeouts, refusals, bad JSON alike
            self._backoff(target)
            self._failed("%s GET %s" % (target.name, path.split("?")[0]), error)
            return None, None

    def _next_batch(self):
        """Waits for something sendable; returns (target, items) or None once closed."""
        with self._lock:
            while True:
                now = time.monotonic()
                for target in (self._agent, self._controller):
                    if target.pending and target.available(now):
                        items = [target.pending.popleft() for _ in range(min(_BATCH, len(target.pending)))]
                        self._in_flight += 1
                        return target, items
                if self._closed:
                    return None
                waits = [t.retry_at - now for t in (self._agent, self._controller) if t.pending and t.url]
                self._lock.wait(max(0.01, min(waits)) if waits else 0.5)

    def _send_loop(self):
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            target, items = batch
            try:
                self._send(target, items)
            finally:
                with self._lock:
                    self._in_flight -= 1
                    self._lock.notify_all()

    def _send(self, target, items):
        path = "/api/v1/training" if target is self._agent else "/api/v1/jobs/%s/checkpoints" % urllib.parse.quote(self.job)
        try:
            status, body = self._request(target, "POST", path, items)
            if status in (200, 202):
                target.failures = 0
                with self._lock:
                    self.stats["sent"] += len(items)
                return
            # A refusal of the body itself (400, 401, 404, 413) says the same on every retry.
            retry = status in (408, 429) or status >= 500
            error = RuntimeError("HTTP %d: %s" % (status, body))
        except Exception as failure:  # noqa: BLE001 - refused, timed out, reset: try later
            retry, error = True, failure
        self._backoff(target)
        with self._lock:
            if retry and target.keep_on_failure and not self._closed:
                target.pending.extendleft(reversed(items))
            else:
                self.stats["dropped"] += len(items)
        self._failed("%s POST %s" % (target.name, path), error)
