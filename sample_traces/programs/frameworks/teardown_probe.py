"""Does a finished torch.profiler session leave the program slower? (#25, the recorder's own effect)

A host-bound loop (many small kernels per step, as the framework programs' launch-bound steps
are) timed step by step on the host clock with a synchronize at each step end: PRE steps, then
torch.profiler (CPU + CUDA) over PROFILED steps, then POST steps. Prints one JSON line:
the median step time before and after the profiled steps, and TEARDOWN_CUPTI as the process saw it.
Run it with TEARDOWN_CUPTI unset and =1 (Kineto's switch for calling cuptiFinalize at the stop).

    python teardown_probe.py [--pre 80] [--post 80] [--kernels 300]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pre", type=int, default=80)
    p.add_argument("--post", type=int, default=80)
    p.add_argument("--profiled", type=int, default=4)
    p.add_argument("--kernels", type=int, default=300)
    a = p.parse_args()
    x = torch.randn(256, 256, device="cuda")

    def step() -> float:
        t0 = time.perf_counter()
        y = x
        for _ in range(a.kernels):
            y = y * 1.0001 + 0.0001
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1000.0

    for _ in range(20):
        step()  # warm-up
    pre = [step() for _ in range(a.pre)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(a.profiled):
            step()

    for _ in range(3):
        step()  # the stop's own aftermath
    post = [step() for _ in range(a.post)]
    print(json.dumps({"teardown_cupti": os.environ.get("TEARDOWN_CUPTI"), "torch": torch.__version__,
                      "cuda": torch.version.cuda, "kernels_per_step": a.kernels,
                      "pre_median_ms": round(statistics.median(pre), 4),
                      "post_median_ms": round(statistics.median(post), 4),
                      "post_over_pre": round(statistics.median(post) / statistics.median(pre), 4)}))


if __name__ == "__main__":
    main()
