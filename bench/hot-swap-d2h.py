#!/usr/bin/env python3
"""What the hot swap's per-step copy costs on one GPU, and whether a training step hides it.

Every step, a hot-swap rank copies its model and optimizer state from the GPU into a pinned host
buffer (DeadPool §V-B and §VII-B2: the device-to-host leg of its in-memory checkpoint; ByteRobust
§6.3: every-step in-memory checkpoints). The runtime issues that copy on a side CUDA stream with
``non_blocking=True`` so that it runs under the next step's compute. This bench measures, on the
GPU it runs on:

- the copy alone (a state of ``--gib`` GiB into one of two pinned host buffers),
- a matmul-heavy step alone, sized to take about as long as the copy,
- the step with the copy overlapped on the side stream,

and prints the ratios: how much longer the step takes with the copy under it, and how much of the
copy it hid. Without CUDA it says so, runs the same code path on the CPU with a small state (a dry
run: its figures measure nothing) and exits 0.

    python3 bench/hot-swap-d2h.py [--gib 4] [--repeats 10]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator, List, Optional

import torch

CHUNK_BYTES = 256 * 2**20
"""The state is held as tensors of at most 256 MiB, like the parameters and moments of a model."""

DRY_RUN_BYTES = 16 * 2**20


@dataclass
class Bench:
    """The device, the state on it, the two pinned host buffers and the side stream."""

    device: torch.device
    state: List[torch.Tensor]
    buffers: List[List[torch.Tensor]]
    copy_stream: Optional["torch.cuda.Stream"]
    step_a: torch.Tensor
    step_b: torch.Tensor
    matmuls: int = 1

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def on_copy_stream(self) -> ContextManager[object]:
        if self.copy_stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.copy_stream)

    def copy(self, slot: int) -> None:
        """Starts the copy of the whole state into host buffer `slot` on the side stream."""
        if self.copy_stream is not None:
            # The copy reads what the step before it wrote: it waits for the compute stream.
            self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with self.on_copy_stream():
            for source, target in zip(self.state, self.buffers[slot]):
                target.copy_(source, non_blocking=True)

    def step(self) -> None:
        """A matmul-heavy training step: `matmuls` square products chained on the compute stream."""
        out = self.step_a
        for _ in range(self.matmuls):
            out = torch.mm(out, self.step_b)
            out = out * (1.0 / out.shape[0] ** 0.5)
        self.step_a.copy_(out)


def allocate(device: torch.device, state_bytes: int, step_size: int) -> Bench:
    """The state in chunks, two pinned host buffers of the same shapes, and the step's operands."""
    dtype = torch.float32
    element = torch.tensor([], dtype=dtype).element_size()
    state: List[torch.Tensor] = []
    left = state_bytes
    while left > 0:
        count = min(CHUNK_BYTES, left) // element
        state.append(torch.randn(count, dtype=dtype, device=device))
        left -= count * element
    pin = device.type == "cuda"
    buffers = [[torch.empty(t.shape, dtype=dtype, pin_memory=pin) for t in state] for _ in range(2)]
    stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
    step_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(step_size, step_size, dtype=step_dtype, device=device)
    b = torch.randn(step_size, step_size, dtype=step_dtype, device=device)
    return Bench(device=device, state=state, buffers=buffers, copy_stream=stream, step_a=a, step_b=b)


def timed(bench: Bench, work: Callable[[int], None], repeats: int) -> List[float]:
    """Wall seconds of `work(i)` from a synchronized start to a synchronized end, once per repeat."""
    work(0)  # warm-up: allocator, kernels, first touch of the pinned pages
    bench.synchronize()
    seconds: List[float] = []
    for i in range(repeats):
        started = time.perf_counter()
        work(i)
        bench.synchronize()
        seconds.append(time.perf_counter() - started)
    return seconds


def calibrate(bench: Bench, target_seconds: float) -> None:
    """Sets the step's matmul count so that the step alone takes about `target_seconds`."""
    bench.matmuls = 1
    one = statistics.median(timed(bench, lambda _: bench.step(), 3))
    bench.matmuls = max(1, round(target_seconds / max(one, 1e-9)))


@dataclass
class Figures:
    state_gib: float
    copy_s: float
    step_s: float
    overlapped_s: float
    matmuls: int

    @property
    def slowdown(self) -> float:
        """Step with the copy under it over the step alone: 1.00 when the copy is fully hidden."""
        return self.overlapped_s / self.step_s

    @property
    def hidden(self) -> float:
        """Share of the copy that ran under the step (1: all of it, 0: none, the two in series)."""
        return max(0.0, min(1.0, (self.copy_s + self.step_s - self.overlapped_s) / self.copy_s))

    @property
    def copy_gbps(self) -> float:
        return self.state_gib * 2**30 / self.copy_s / 1e9


def measure(bench: Bench, repeats: int) -> Figures:
    state_bytes = sum(t.numel() * t.element_size() for t in bench.state)
    copy_s = statistics.median(timed(bench, lambda i: bench.copy(i % 2), repeats))
    calibrate(bench, copy_s)
    step_s = statistics.median(timed(bench, lambda _: bench.step(), repeats))

    def both(i: int) -> None:
        bench.copy(i % 2)
        bench.step()

    overlapped_s = statistics.median(timed(bench, both, repeats))
    return Figures(state_gib=state_bytes / 2**30, copy_s=copy_s, step_s=step_s, overlapped_s=overlapped_s, matmuls=bench.matmuls)


def report(figures: Figures, device: str, dry_run: bool) -> Iterator[str]:
    label = "dry run on CPU (figures measure nothing)" if dry_run else device
    yield f"hot-swap d2h: {figures.state_gib:.2f} GiB of state, {label}"
    rows = [
        ("copy alone (pinned, side stream, non_blocking)", figures.copy_s, f"  ({figures.copy_gbps:.1f} GB/s)"),
        (f"step alone ({figures.matmuls} matmuls)", figures.step_s, ""),
        ("step with the copy overlapped", figures.overlapped_s, ""),
    ]
    for label, seconds, note in rows:
        yield f"  {label:<48}{seconds * 1e3:9.1f} ms{note}"
    yield f"  ratio overlapped / step alone: {figures.slowdown:.3f}; share of the copy hidden: {figures.hidden * 100:.0f} %"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=4.0, help="GiB of model+optimizer state to copy each step (default 4)")
    parser.add_argument("--repeats", type=int, default=10, help="timed repeats of each measurement; the median is printed (default 10)")
    parser.add_argument("--step-size", type=int, default=8192, help="side of the step's square matmuls on the GPU (default 8192)")
    args = parser.parse_args(argv)
    if args.gib <= 0 or args.repeats < 1 or args.step_size < 1:
        parser.error("--gib must be positive, --repeats and --step-size at least 1")

    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        bench = allocate(device, int(args.gib * 2**30), args.step_size)
        name = torch.cuda.get_device_name(device)
        for line in report(measure(bench, args.repeats), f"{name}, torch {torch.__version__}", dry_run=False):
            print(line, flush=True)
        return 0

    print("no CUDA device: this bench needs a GPU; dry run of the same code path on the CPU with 16 MiB", flush=True)
    bench = allocate(torch.device("cpu"), DRY_RUN_BYTES, 256)
    for line in report(measure(bench, 3), "cpu", dry_run=True):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
