"""Per-step in-memory checkpoints for hot swap: the two host buffers and the replica server.

Every step a rank copies its state into host memory (``HostSnapshots``) and sends a serialized
copy to its holder's ``ReplicaServer`` on another node (``put_replica``). A spare that takes the
rank's shard after a machine fault reads it back (``list_replicas``, ``get_replica``): ByteRobust
§6.3 (every-step in-memory checkpoints, backups outside the rank's own node), DeadPool §V-C.

The wire: every message is a frame, an 8-byte big-endian length then that many bytes. A request
is a JSON frame ``{"op": "put"|"list"|"get", "shard": S, "step": N}`` (a put adds its world
``"epoch"``); the answer is a JSON frame
``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``, followed for ``get`` by the payload frame.
A ``put`` names its size (``"bytes": L``); the server first answers whether it takes that much,
then reads the payload frame and answers once it is committed. The server never unpickles anything: it stores bytes.

Trust: the payload is what ``torch.save`` wrote, and the spare that restores it runs
``torch.load`` on it, which unpickles (torch 1.13 has no ``weights_only``). A compromised node
of the job could send a malicious pickle that runs code in the spare. The servers listen on the
job's nodes only and take no address from any report, but they do not authenticate peers: run
hot swap on a cluster network you trust as much as the job's own gloo traffic.
"""

import copy
import io
import json
import socket
import socketserver
import struct
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch

from steadfast_world import Address, World, holder_candidates, node_of, shards_of

__all__ = [
    "HostSnapshots", "ReplicaLink", "ReplicaServer", "ReplicaError", "put_replica", "list_replicas", "get_replica",
    "serialize_state", "deserialize_state", "MAX_FRAME_BYTES",
]

#: The largest payload a server takes or a client reads (8 GiB); bigger frames are refused.
MAX_FRAME_BYTES = 8 << 30
#: The largest JSON request or answer frame.
MAX_HEADER_BYTES = 64 << 10
#: Replicas a server keeps per shard: the newest two committed (see HotSwap.before_sync).
KEEP_PER_SHARD = 2
_LENGTH = struct.Struct(">Q")



class ReplicaError(RuntimeError):
    """A replica server could not be reached or refused the request (the message says why).

    A RuntimeError, like a failed collective: inside ``with runtime.step()`` it starts recovery.
    """


# ---- the two host buffers -------------------------------------------------------------------


def _copy_to_host(source: Any, reuse: Any) -> Any:
    """A host-memory copy of `source` (nested dicts/lists of tensors and plain values).

    Tensors are copied into `reuse`'s tensor at the same place when shape and dtype match, so a
    steady run allocates its two buffers once.
    """
    if isinstance(source, torch.Tensor):
        if isinstance(reuse, torch.Tensor) and reuse.shape == source.shape and reuse.dtype == source.dtype and reuse.device.type == "cpu":
            return reuse.copy_(source.detach())
        return source.detach().to("cpu", copy=True)
    if isinstance(source, dict):
        old = reuse if isinstance(reuse, dict) else {}
        copied = type(source)((key, _copy_to_host(value, old.get(key))) for key, value in source.items())
        if hasattr(source, "_metadata"):  # a module's state_dict: load_state_dict reads its versions
            copied._metadata = copy.deepcopy(source._metadata)  # type: ignore[attr-defined]
        return copied
    if isinstance(source, (list, tuple)):
        old = reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(source) else [None] * len(source)
        values = [_copy_to_host(value, previous) for value, previous in zip(source, old)]
        return type(source)(*values) if hasattr(source, "_fields") else type(source)(values)
    return copy.deepcopy(source)


class _Slot:
    __slots__ = ("step", "state")

    def __init__(self) -> None:
        self.step: Optional[int] = None  # None while empty or being written: never restored from
        self.state: Optional[Dict[str, Any]] = None


class HostSnapshots:
    """Two host buffers of one rank's state: one committed, the other being written.

    The commit rule: ``write`` marks the other buffer invalid, copies into it, and only once the
    copy is complete swaps it in as the committed one. A failure mid-copy (an exception, the
    process dying) leaves the committed buffer whole and still committed; the torn one is never
    listed. So the rank always holds its newest committed step, and the one before it unless a
    copy of a later step was torn.
    """

    def __init__(self) -> None:
        self._slots = (_Slot(), _Slot())
        self._committed: Optional[int] = None  # index into _slots
        self._lock = threading.Lock()

    def write(self, step: int, state: Dict[str, Any]) -> None:
        """Copies `state` (of `step`) into the uncommitted buffer, then commits it."""
        with self._lock:
            target = 1 if self._committed == 0 else 0
            slot = self._slots[target]
            slot.step = None
        slot.state = _copy_to_host(state, slot.state)
        with self._lock:
            slot.step = int(step)
            self._committed = target  # the atomic swap: readers see the old or the new, whole

    def steps(self) -> List[int]:
        """The steps held whole, oldest first."""
        with self._lock:
            return sorted(slot.step for slot in self._slots if slot.step is not None)

    def committed_step(self) -> Optional[int]:
        with self._lock:
            return None if self._committed is None else self._slots[self._committed].step

    def state_at(self, step: int) -> Optional[Dict[str, Any]]:
        """The held state of `step` (not a copy: load it, do not change it), or None."""
        with self._lock:
            for slot in self._slots:
                if slot.step == step:
                    return slot.state
        return None

    def discard(self) -> None:
        """Forgets both buffers (after a restore from another timeline)."""
        with self._lock:
            for slot in self._slots:
                slot.step = None


def serialize_state(state: Dict[str, Any]) -> memoryview:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getbuffer()


def deserialize_state(data: bytes) -> Dict[str, Any]:
    """Unpickles a peer's replica: see the module's note on trust."""
    return torch.load(io.BytesIO(data), map_location="cpu")


# ---- frames ---------------------------------------------------------------------------------


def _recv_exact(sock: socket.socket, size: int) -> bytearray:
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        count = sock.recv_into(view[got:], min(size - got, 1 << 24))
        if count == 0:
            raise ReplicaError("connection closed after %d of %d bytes" % (got, size))
        got += count
    return data


def _send_frame(sock: socket.socket, data: Any) -> None:
    view = memoryview(data)
    sock.sendall(_LENGTH.pack(view.nbytes))
    sock.sendall(view)


def _recv_length(sock: socket.socket, limit: int, what: str) -> int:
    (length,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size))
    if length > limit:
        raise ReplicaError("%s of %d bytes exceeds the limit of %d bytes" % (what, length, limit))
    return length


def _send_json(sock: socket.socket, value: Dict[str, Any]) -> None:
    _send_frame(sock, json.dumps(value).encode("utf-8"))


def _recv_json(sock: socket.socket) -> Dict[str, Any]:
    value = json.loads(bytes(_recv_exact(sock, _recv_length(sock, MAX_HEADER_BYTES, "header"))))
    if not isinstance(value, dict):
        raise ReplicaError("a frame that is not a JSON object")
    return value


# ---- the server -----------------------------------------------------------------------------


class ReplicaServer:
    """Holds peers' replicas, the newest ``KEEP_PER_SHARD`` committed per shard, on one port.

    A PUT is committed (and acknowledged) only once its whole payload arrived; a connection lost
    mid-transfer leaves what was held. A PUT of step N first drops any held step ≥ N of that
    shard: after a restore to an older step the newer ones belong to an abandoned timeline. A PUT
    from an older world epoch than the shard's last one is refused: a late send of a rank that
    has since left that epoch must not replace what the new one committed.
    """

    def __init__(self, host: str = "0.0.0.0", port: int = 0, max_frame: int = MAX_FRAME_BYTES) -> None:
        self.max_frame = int(max_frame)
        self._held: Dict[int, List[Tuple[int, bytes]]] = {}
        self._epochs: Dict[int, int] = {}  # per shard, the newest epoch a PUT came from
        self._lock = threading.Lock()
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        self._server = Server((host, port), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="steadfast-replicas", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stops serving; idempotent."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def steps(self, shard: int) -> List[int]:
        with self._lock:
            return [step for step, _ in self._held.get(shard, [])]

    def _serve(self, sock: socket.socket) -> None:
        try:
            request = _recv_json(sock)
            op, shard, step = request.get("op"), request.get("shard"), request.get("step")
            if not isinstance(shard, int) or (op != "list" and not isinstance(step, int)):
                _send_json(sock, {"ok": False, "error": "shard (and step) must be integers"})
            elif op == "put":
                size, epoch = request.get("bytes"), request.get("epoch")
                if not isinstance(size, int) or not 0 <= size <= self.max_frame:
                    _send_json(sock, {"ok": False, "error": "a replica of %s bytes exceeds this server's limit of %d bytes" % (size, self.max_frame)})
                elif not isinstance(epoch, int) or self._stale(shard, epoch):
                    _send_json(sock, {"ok": False, "error": "a replica of shard %d from epoch %s is stale (held from epoch %s)" % (shard, epoch, self._epochs.get(shard))})
                else:
                    _send_json(sock, {"ok": True})
                    committed = self._commit(shard, epoch, step, bytes(_recv_exact(sock, _recv_length(sock, size, "replica"))))
                    _send_json(sock, {"ok": True, "steps": self.steps(shard)} if committed else {"ok": False, "error": "stale"})
            elif op == "list":
                _send_json(sock, {"ok": True, "steps": self.steps(shard)})
            elif op == "get":
                with self._lock:
                    data = next((held for held_step, held in self._held.get(shard, []) if held_step == step), None)
                if data is None:
                    _send_json(sock, {"ok": False, "error": "no replica of shard %d at step %d here (held: %s)" % (shard, step, self.steps(shard))})
                else:
                    _send_json(sock, {"ok": True, "bytes": len(data)})
                    _send_frame(sock, data)
            else:
                _send_json(sock, {"ok": False, "error": "unknown op %r" % (op,)})
        except (OSError, ValueError, ReplicaError):
            return  # the peer went away or spoke nonsense; nothing was committed

    def _stale(self, shard: int, epoch: int) -> bool:
        with self._lock:
            return epoch < self._epochs.get(shard, epoch)

    def _commit(self, shard: int, epoch: int, step: int, data: bytes) -> bool:
        with self._lock:
            if epoch < self._epochs.get(shard, epoch):
                return False
            self._epochs[shard] = epoch
            held = [item for item in self._held.get(shard, []) if item[0] < step]
            held.append((step, data))
            self._held[shard] = held[-KEEP_PER_SHARD:]
            return True


# ---- the client side ------------------------------------------------------------------------


def _exchange(address: Address, request: Dict[str, Any], payload: Any = None, timeout: float = 30.0,
              max_frame: int = MAX_FRAME_BYTES) -> Tuple[Dict[str, Any], Optional[bytearray]]:
    try:
        with socket.create_connection(address, timeout=min(timeout, 5.0)) as sock:
            sock.settimeout(timeout)
            _send_json(sock, request)
            answer = _recv_json(sock)
            if payload is not None and answer.get("ok"):
                _send_frame(sock, payload)
                answer = _recv_json(sock)
            if not answer.get("ok"):
                raise ReplicaError("replica server %s:%d: %s" % (address[0], address[1], answer.get("error")))
            data = bytes(_recv_exact(sock, _recv_length(sock, max_frame, "replica"))) if request["op"] == "get" else None
            return answer, data
    except OSError as error:
        raise ReplicaError("replica server %s:%d: %s" % (address[0], address[1], error)) from error


def put_replica(address: Address, shard: int, step: int, data: Any, epoch: int = 0, timeout: float = 30.0) -> List[int]:
    """Sends a replica of `shard` at `step`, made in world `epoch`; returns once the holder
    committed it (the steps it now holds)."""
    size = memoryview(data).nbytes
    request = {"op": "put", "shard": int(shard), "step": int(step), "epoch": int(epoch), "bytes": size}
    answer, _ = _exchange(address, request, data, timeout)
    return [int(step) for step in answer.get("steps", [])]


def list_replicas(address: Address, shard: int, timeout: float = 5.0) -> List[int]:
    """The steps of `shard` the holder at `address` has committed."""
    answer, _ = _exchange(address, {"op": "list", "shard": int(shard)}, timeout=timeout)
    return [int(step) for step in answer.get("steps", [])]


def get_replica(address: Address, shard: int, step: int, timeout: float = 30.0) -> bytes:
    """The bytes of `shard` at `step` from the holder at `address`."""
    _, data = _exchange(address, {"op": "get", "shard": int(shard), "step": int(step)}, timeout=timeout)
    assert data is not None
    return bytes(data)


# ---- one rank's side: its buffers and its replica at the holder -------------------------------


class _Snapshot:
    """One step's local copy and replica, made in a background thread."""

    def __init__(self) -> None:
        self.copied = threading.Event()  # the local copy is committed (or failed)
        self.done = threading.Event()  # and the holder acknowledged its replica (or it failed)
        self.error: Optional[BaseException] = None


class ReplicaLink:
    """A rank's copies of its state: its two host buffers, and its replica at the holder.

    Peers listen on ``<node name>:<port + the shard's index on its node>``; `hosts` maps a node
    name to (host, port) where names do not resolve (several "nodes" on one host).
    """

    def __init__(self, port: int, hosts: Dict[str, Address]) -> None:
        self.snapshots = HostSnapshots()
        self.shard: Optional[int] = None  # whose state the buffers hold
        self.port, self.hosts = int(port), dict(hosts)
        self._current: Optional[_Snapshot] = None
        self._lost: Dict[int, set] = {}  # holders lost, per world epoch

    def own_port(self, node: str, local_rank: int) -> int:
        return self.hosts.get(node, ("", self.port))[1] + local_rank

    def address(self, world: World, shard: int) -> Address:
        node = node_of(world, shard) or ""
        host, base = self.hosts.get(node, (node, self.port))
        return host, base + shards_of(world, node).index(shard)

    def start(self, world: World, shard: int, node: str, step: int, state: Dict[str, Any]) -> None:
        """Copies `state` of `step` into the buffers, then sends it to the holder, in the background."""
        self.settle(None, acked=True)
        snapshot = self._current = _Snapshot()

        def run() -> None:
            try:
                self.snapshots.write(step, state)
                self.shard = shard
                # Serialized before `copied`: once that is set the buffers may be reused (a
                # restore), and what is still being sent is this whole payload, not a torn slot.
                data = serialize_state(self.snapshots.state_at(step) or {})
                snapshot.copied.set()
                self._send(world, shard, node, step, data)
            except BaseException as error:  # noqa: BLE001 - handed to wait(), which raises it
                snapshot.error = error
            finally:
                snapshot.copied.set()
                snapshot.done.set()

        threading.Thread(target=run, name="steadfast-snapshot", daemon=True).start()

    def wait(self) -> None:
        """Waits for the last step's copy and replica; raises what failed (a RuntimeError)."""
        snapshot = self._current
        if snapshot is not None:
            snapshot.done.wait()
            if snapshot.error is not None:
                raise snapshot.error

    def wait_copied(self, seconds: float) -> bool:
        """Waits up to `seconds` for the last step's local copy; False on time out."""
        snapshot = self._current
        return snapshot is None or snapshot.copied.wait(seconds)

    def settle(self, seconds: Optional[float], acked: bool) -> bool:
        """Waits up to `seconds` for the last copy (and its ack), then forgets it; False on time out."""
        snapshot, self._current = self._current, None
        return snapshot is None or (snapshot.done if acked else snapshot.copied).wait(seconds)

    def _send(self, world: World, shard: int, node: str, step: int, data: Any) -> None:
        """PUT to the first holder not lost; a failed holder is lost for the epoch, the next tried."""
        lost = self._lost.setdefault(int(world.get("epoch", -1)), set())
        errors = []
        for holder in holder_candidates(world, shard, node):
            if holder in lost:
                continue
            try:
                put_replica(self.address(world, holder), shard, step, data, epoch=int(world.get("epoch", 0)))
                return
            except ReplicaError as error:
                lost.add(holder)
                errors.append("%s: %s" % (node_of(world, holder), error))
        if errors:
            raise ReplicaError("no replica holder of shard %d took step %d (%s)" % (shard, step, "; ".join(errors)))

    def find(self, world: World, shard: int, node: str) -> Tuple[List[int], Optional[Address], str]:
        """LISTs `shard`'s holders, then every other node's ranks: (steps, address, holder node or why not)."""
        candidates = holder_candidates(world, shard, node)
        others = [s for s in range(len(world.get("shards", []))) if s not in candidates and s != shard and node_of(world, s) != node]
        errors = []
        for holder in candidates + others:
            address = self.address(world, holder)
            try:
                steps = list_replicas(address, shard)
            except ReplicaError as error:
                errors.append(str(error))
                continue
            if steps:
                return steps, address, node_of(world, holder) or "?"
        return [], None, "; ".join(errors)
