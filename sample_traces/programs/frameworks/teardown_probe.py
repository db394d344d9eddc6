"""Does a finished torch.profiler session leave the program slower? (#25, the recorder's own effect)

A host-bound loop (``--kernels`` small kernels per step, as the framework programs' launch-bound
steps are), timed step by step: the host's time to launch the step's kernels, and the step's
whole time to a synchronize at its end. Blocks of ``--block`` steps, ``--blocks`` before and
after the middle, which is torch.profiler (CPU + CUDA) over ``--profiled`` steps
(``--mode profile``) or the same steps unprofiled (``--mode control``: the drift of the machine
itself). Prints one JSON line with each block's median launch and step times, the SM clock at
each block's end where NVML is importable, and TEARDOWN_CUPTI as the process saw it. Run with
TEARDOWN_CUPTI unset and =1 (Kineto's switch for calling cuptiFinalize at the profiler's stop).

    python teardown_probe.py --mode profile|control [--kernels 300] [--block 40] [--blocks 3]
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
    p.add_argument("--mode", choices=["profile", "control"], default="profile")
    p.add_argument("--kernels", type=int, default=300)
    p.add_argument("--block", type=int, default=40)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--profiled", type=int, default=4)
    a = p.parse_args()
    x = torch.randn(256, 256, device="cuda")
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        sm_clock = lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)  # noqa: E731
    except Exception:
        sm_clock = lambda: None  # noqa: E731

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        y = x
        for _ in range(a.kernels):
            y = y * 1.0001 + 0.0001
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) * 1000.0, (time.perf_counter() - t0) * 1000.0

    def block() -> dict[str, float | None]:
        s = [step() for _ in range(a.block)]
        return {"launch_ms": round(statistics.median(v[0] for v in s), 4),
                "step_ms": round(statistics.median(v[1] for v in s), 4), "sm_mhz": sm_clock()}

    for _ in range(20):
        step()  # warm-up
    pre = [block() for _ in range(a.blocks)]
    if a.mode == "profile":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]):
            for _ in range(a.profiled):
                step()
    else:
        for _ in range(a.profiled):
            step()
    for _ in range(3):
        step()  # the stop's own aftermath
    post = [block() for _ in range(a.blocks)]
    med = lambda bs, k: statistics.median(b[k] for b in bs)  # noqa: E731
    print(json.dumps({"mode": a.mode, "teardown_cupti": os.environ.get("TEARDOWN_CUPTI"), "torch": torch.__version__,
                      "cuda": torch.version.cuda, "kernels_per_step": a.kernels, "pre": pre, "post": post,
                      "launch_post_over_pre": round(med(post, "launch_ms") / med(pre, "launch_ms"), 4),
                      "step_post_over_pre": round(med(post, "step_ms") / med(pre, "step_ms"), 4)}))


if __name__ == "__main__":
    main()
