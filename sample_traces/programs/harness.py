"""The shared recording loop of the sample programs (hf.py, cnn.py, mlp.py).

Each program builds a model and a ``step()`` that runs one training (or inference) step, then
calls :func:`record`. It warms up, times ``--timing-windows`` (2) windows of ``--timed-steps`` steps without the
profiler (one ``torch.cuda.synchronize()`` at each end of a window, never one per step: the
realised step time includes the GPU's work), writes them to ``--timing-out``, and records a
torch.profiler trace of ``--active`` steps after ``wait=1, warmup=2``.

Profiler switches shared by every program: ``--with-stack`` (Python frames), ``--gpu-only``
(``activities=[CUDA]``: no CPU ops or runtime calls), ``--profile-memory`` (``[memory]`` events).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="trace path (.json.gz)")
    p.add_argument("--timing-out", help="JSON file for the unprofiled step timing")
    p.add_argument("--timed-steps", type=int, default=20)
    p.add_argument("--timing-windows", type=int, default=2, help="timed windows (each --timed-steps steps)")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--active", type=int, default=3)
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--with-stack", action="store_true")
    p.add_argument("--gpu-only", action="store_true")
    p.add_argument("--profile-memory", action="store_true")
    p.add_argument("--device", default="cuda")
    p.add_argument("--region-times", help="JSON file: host wall time per step of each region the program marks "
                                          "(REGIONS.mark), in the timed windows and in the profiled steps")
    p.add_argument("--nvtx-step", type=int, default=-1,
                   help="wrap this step of the first timed window in an NVTX range 'ncu_step' and cudaProfilerStart/Stop (for ncu)")


class Regions:
    """Host wall time per region of a step: ``mark(name)`` closes the region that began at the last
    mark (``mark(None)`` opens one). Summed per bucket: ``"timed"`` (the unprofiled windows) and
    ``"profiled"`` (the recorded steps); does nothing while no bucket is set (no ``--region-times``)."""

    def __init__(self) -> None:
        self.ms: dict[str, dict[str, float]] = {"timed": {}, "profiled": {}}
        self.steps = {"timed": 0, "profiled": 0}
        self.bucket: str | None = None
        self._last = 0.0

    def mark(self, name: str | None) -> None:
        if self.bucket is None:
            return
        now = time.perf_counter()
        if name is not None:
            d = self.ms[self.bucket]
            d[name] = d.get(name, 0.0) + (now - self._last) * 1000.0
        self._last = now

    def step_done(self) -> None:
        if self.bucket is not None:
            self.steps[self.bucket] += 1

    def write(self, path: str) -> None:
        per_step = {b: {k: v / max(self.steps[b], 1) for k, v in self.ms[b].items()} for b in self.ms}
        with open(path, "w") as f:
            json.dump({"ms_per_step": per_step, "steps": self.steps}, f, indent=1)


REGIONS = Regions()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def capture_graph(fn: Callable[[], Any], warmup: int = 3) -> torch.cuda.CUDAGraph:
    """``fn`` run ``warmup`` times on a side stream (as CUDA-graph capture needs: the allocator
    and lazy inits settle off the capture stream), then captured once; replay the returned graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_steps(step: Callable[[], Any], n: int, device: str, nvtx_step: int = -1) -> float:
    """Mean wall time of ``n`` steps in ms, GPU work included (one sync at each end)."""
    sync(device)
    t0 = time.perf_counter()
    for i in range(n):
        if i == nvtx_step:  # for ncu: an NVTX range and, process-wide, cudaProfilerStart/Stop
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            torch.cuda.nvtx.range_push("ncu_step")
        step()
        if i == nvtx_step:
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
    sync(device)
    return (time.perf_counter() - t0) * 1000.0 / n


def record(a: argparse.Namespace, step: Callable[[], Any], extra: dict[str, Any] | None = None) -> None:
    for _ in range(a.warmup_steps):
        step()
    nvtx = a.nvtx_step if a.device.startswith("cuda") else -1
    REGIONS.bucket = "timed" if a.region_times else None
    runs = [time_steps(step, a.timed_steps, a.device, nvtx if w == 0 else -1) for w in range(a.timing_windows)]
    REGIONS.bucket = None
    step_ms = sum(runs) / len(runs)
    if a.timing_out:
        rec = {
            "argv": vars(a),
            "step_ms": step_ms,
            "step_ms_runs": runs,
            "timed_steps": a.timed_steps,
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
            **(extra or {}),
        }
        with open(a.timing_out, "w") as f:
            json.dump(rec, f, indent=1)
    print(f"step {step_ms:.3f} ms (runs {', '.join(f'{r:.3f}' for r in runs)})", flush=True)
    if a.no_profile:
        if a.region_times:
            REGIONS.write(a.region_times)
        return
    acts = [torch.profiler.ProfilerActivity.CUDA] if a.gpu_only else [torch.profiler.ProfilerActivity.CPU]
    if a.device.startswith("cuda") and not a.gpu_only:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(
        activities=acts,
        schedule=torch.profiler.schedule(wait=1, warmup=2, active=a.active, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(a.out),
        record_shapes=True,
        with_stack=a.with_stack,
        profile_memory=a.profile_memory,
    )
    with prof:
        for i in range(3 + a.active):
            REGIONS.bucket = "profiled" if a.region_times and i >= 3 else None  # the recorded (active) steps
            step()
            prof.step()
    REGIONS.bucket = None
    sync(a.device)
    if a.region_times:
        REGIONS.write(a.region_times)
