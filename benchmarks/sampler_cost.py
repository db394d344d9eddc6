"""CPU cost of the NVML sampler on this machine (run on a GPU machine): total thread CPU per
sample, and how much of it is the NVML reads versus waking up.

    python benchmarks/sampler_cost.py [SECONDS] [GPU,GPU...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from benchmarks.nvml_cost import basic_queries
from gpuprof.record.nvml import Sampler, load_nvml

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
nv = load_nvml()
with tempfile.TemporaryDirectory() as d:
    gpus = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else None  # default: every GPU
    s = Sampler(Path(d) / "n.csv", hz=20.0, nvml=nv, devices=gpus)
    s.start()
    time.sleep(seconds)
    s.stop()
    steady = 100 * s.steady_cpu_seconds / s.steady_seconds if s.steady_seconds else float("nan")
    print(f"sampler thread: {s.samples} samples, {100 * s.cpu_seconds / seconds:.3f}% of one core "
          f"({steady:.3f}% after the first second), "
          f"{s.cpu_seconds / s.samples * 1e6:.1f} us CPU per sample; off: {s.off}")
    print("  split per sample (us CPU): " + ", ".join(f"{k} {v / s.samples * 1e6:.1f}" for k, v in s.cpu_split.items()))
    print(f"  {len(s.devices)} GPU(s); group read cost (us CPU, all GPUs): "
          + ", ".join(f"{g} {v:.0f}" for g, v in s.group_us.items()) + f"; read periods (s): {s.periods_s}")
    t = time.thread_time()
    for _ in range(200):
        s.sample_once()
    print(f"sample_once alone: {(time.thread_time() - t) / 200 * 1e6:.1f} us CPU")
    import threading

    ev = threading.Event()
    t = time.thread_time()
    for _ in range(100):
        ev.wait(0.01)
    print(f"Event.wait(10 ms): {(time.thread_time() - t) / 100 * 1e6:.1f} us CPU per wake-up")
    t = time.thread_time()
    for _ in range(100):
        time.sleep(0.01)
    print(f"time.sleep(10 ms): {(time.thread_time() - t) / 100 * 1e6:.1f} us CPU per wake-up")

# Each query's CPU cost inside a real sample (queries in the sampler's order, 200 samples).
h = nv.nvmlDeviceGetHandleByIndex(0)
order = basic_queries(nv, h)
cost = {k: 0.0 for k in order}
for _ in range(200):
    for k, fn in order.items():
        t = time.thread_time()
        fn()
        cost[k] += time.thread_time() - t
    time.sleep(0.05)
for k, v in cost.items():
    print(f"  in a sample: {k:22s} {v / 200 * 1e6:8.1f} us CPU")
