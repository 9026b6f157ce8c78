"""A short burn under load before a node is trusted again: after a GPU reset, a reboot, a hand-off,
``steadfast resume``, and as a warm standby's self-check (ByteRobust §6.2: standbys are
self-checked before they stand in).

Per visible CUDA device, all at once (so that the GPUs draw power and heat together, as in
training), or on the CPU where there is none (the lab, CI), it repeats for ``--seconds`` a fixed,
seeded computation — a chain of ``x = tanh(A @ x)`` with a seeded matrix ``A`` — and judges two
things:

- correctness: a small chain's checksum is compared, every round, with the same chain computed once
  on the CPU in float64 (the reference); and the large chain's checksum, every round, with the
  device's own first round. A device that computes wrong, even once, fails;
- throughput: the large chain's matmul rate in TFLOPS, which the controller compares with the
  node's peers (a GPU that computes right but slowly is a straggler, not a spare).

It prints one JSON line and exits 0 when every device passed, 1 otherwise (2 on a usage error):

    {"ok": true, "seconds": 15.2, "devices": [{"device": "cuda:0", "name": "NVIDIA H100 80GB HBM3",
     "ok": true, "checksum_error": 3.1e-07, "tflops": 48.2, "seconds": 15.0, "rounds": 812}]}

Standard library and torch only; TF32 is switched off so that a float32 result is comparable with
the reference. Run: ``python3 steadfast_burn.py --seconds 15``.
"""

import argparse
import json
import math
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

SEED = 20240917
CHECK_SIZE = 256
CHAIN_STEPS = 8
DEFAULT_SECONDS = 15.0
# About a hundred times float32's own error on these chains (~1e-7), far below what one wrong element moves.
DEFAULT_TOLERANCE = 1e-5
# The large chain: big enough that a GPU's matmul rate is near its peak, small enough for a CPU.
DEFAULT_SIZE_CUDA = 4096
DEFAULT_SIZE_CPU = 512

# A perturbation of a chain's result, for tests: (device name, round, result) -> result.
Perturb = Callable[[str, int, Any], Any]


def _torch() -> Any:
    import torch  # imported here so that --help and usage errors work without torch

    return torch


def seeded_inputs(size: int, dtype: Any, columns: int = 16, seed: int = SEED) -> "tuple[Any, Any]":
    """The chain's matrix (scaled so that ``A @ x`` stays of order one) and start block of ``columns`` vectors, on the CPU."""
    torch = _torch()
    generator = torch.Generator().manual_seed(seed + size)
    matrix = torch.randn(size, size, generator=generator, dtype=torch.float64) / math.sqrt(size)
    start = torch.randn(size, columns, generator=generator, dtype=torch.float64)
    return matrix.to(dtype), start.to(dtype)


def chain(matrix: Any, start: Any, steps: int = CHAIN_STEPS) -> Any:
    """The reference computation: ``steps`` times ``x = tanh(A @ x)``. tanh keeps it bounded, so errors show instead of overflowing."""
    torch = _torch()
    x = start
    for _ in range(steps):
        x = torch.tanh(matrix @ x)
    return x


def checksum(result: Any) -> float:
    """A weighted sum in float64: a wrong element anywhere moves it, and a transposed block as well."""
    torch = _torch()
    flat = result.detach().to("cpu", torch.float64).reshape(-1)
    weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64) / flat.numel()
    return float((flat * weights).sum())


def relative_error(value: float, reference: float) -> float:
    """How far a checksum is from its reference, relative to it (absolute near zero); NaN and inf are infinitely far."""
    if not math.isfinite(value):
        return math.inf
    return abs(value - reference) / max(abs(reference), 1.0)


def reference_checksum(size: int = CHECK_SIZE, steps: int = CHAIN_STEPS) -> float:
    """The small chain computed on the CPU in float64: what every device must reproduce."""
    torch = _torch()
    matrix, start = seeded_inputs(size, torch.float64)
    return checksum(chain(matrix, start, steps))


def visible_devices() -> List[str]:
    """Every visible CUDA device, or the CPU where there is none."""
    torch = _torch()
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    return ["cpu"]


def burn_device(
    device: str,
    seconds: float,
    size: int,
    reference: float,
    tolerance: float = DEFAULT_TOLERANCE,
    perturb: Optional[Perturb] = None,
) -> Dict[str, Any]:
    """Runs the chains on one device until ``seconds`` have passed (at least one round) and reports it."""
    torch = _torch()
    started = time.monotonic()
    report: Dict[str, Any] = {"device": device, "name": device, "ok": False, "checksum_error": None, "tflops": 0.0, "seconds": 0.0, "rounds": 0}
    try:
        target = torch.device(device)
        if target.type == "cuda":
            torch.cuda.set_device(target)
            report["name"] = torch.cuda.get_device_name(target)
        check_matrix, check_start = (tensor.to(target) for tensor in seeded_inputs(CHECK_SIZE, torch.float32))
        # Square: a full matrix multiply, whose rate is the device's, not its memory's.
        big_matrix, big_start = (tensor.to(target) for tensor in seeded_inputs(size, torch.float32, columns=size))
        first: Optional[float] = None
        worst = 0.0
        flops = 0.0
        busy = 0.0
        rounds = 0
        deadline = started + seconds
        while rounds == 0 or time.monotonic() < deadline:
            small = chain(check_matrix, check_start)
            if perturb is not None:
                small = perturb(device, rounds, small)
            error = relative_error(checksum(small), reference)
            worst = max(worst, error)
            if error > tolerance:
                report["reason"] = f"round {rounds}: checksum off the CPU reference by {error:.3g} (tolerance {tolerance:g})"
                break
            _sync(torch, target)
            began = time.monotonic()
            big = chain(big_matrix, big_start)
            _sync(torch, target)
            busy += time.monotonic() - began
            flops += CHAIN_STEPS * 2.0 * size * size * big_start.shape[1]
            value = checksum(big)
            if first is None:
                first = value
            drift = relative_error(value, first)
            worst = max(worst, drift)
            if drift > tolerance:
                report["reason"] = f"round {rounds}: large chain differs from its first round by {drift:.3g} (tolerance {tolerance:g})"
                break
            rounds += 1
        else:
            report["ok"] = True
        report["checksum_error"] = worst if math.isfinite(worst) else None
        report["tflops"] = flops / busy / 1e12 if busy > 0 else 0.0
        report["rounds"] = rounds
    except Exception as error:  # a CUDA fault, out of memory: the device failed the burn
        report["reason"] = f"{type(error).__name__}: {error}"
    report["seconds"] = round(time.monotonic() - started, 3)
    return report


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_burn(
    devices: List[str],
    seconds: float,
    size: Optional[int] = None,
    tolerance: float = DEFAULT_TOLERANCE,
    perturb: Optional[Perturb] = None,
) -> Dict[str, Any]:
    """Burns every device at once, one thread each (torch releases the GIL in its kernels)."""
    started = time.monotonic()
    reference = reference_checksum()
    reports: List[Optional[Dict[str, Any]]] = [None] * len(devices)

    def work(index: int, device: str) -> None:
        chosen = size if size is not None else (DEFAULT_SIZE_CUDA if device.startswith("cuda") else DEFAULT_SIZE_CPU)
        reports[index] = burn_device(device, seconds, chosen, reference, tolerance, perturb)

    threads = [threading.Thread(target=work, args=(index, device), daemon=True) for index, device in enumerate(devices)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done = [report for report in reports if report is not None]
    return {"ok": len(done) == len(devices) and all(report["ok"] for report in done), "seconds": round(time.monotonic() - started, 3), "devices": done}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="A short burn under load with a reference comparison; prints one JSON line.")
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="how long each device burns (all at once); default %(default)s")
    parser.add_argument("--size", type=int, default=None, help=f"the large chain's matrix size (default {DEFAULT_SIZE_CUDA} on a GPU, {DEFAULT_SIZE_CPU} on the CPU)")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="largest relative checksum error that passes; default %(default)s")
    parser.add_argument("--device", default="auto", help="auto (every CUDA device, else the CPU), cpu, or cuda:N")
    options = parser.parse_args(argv)
    if not 0 < options.seconds <= 3600 or (options.size is not None and not 16 <= options.size <= 16384) or not 0 < options.tolerance < 1:
        parser.print_usage(sys.stderr)
        print("steadfast_burn: --seconds must be in (0, 3600], --size in [16, 16384], --tolerance in (0, 1)", file=sys.stderr)
        return 2
    try:
        torch = _torch()
    except ImportError as error:
        print(json.dumps({"ok": False, "seconds": 0.0, "devices": [], "error": f"torch is not importable: {error}"}))
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    devices = visible_devices() if options.device == "auto" else [options.device]
    result = run_burn(devices, options.seconds, options.size, options.tolerance)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
