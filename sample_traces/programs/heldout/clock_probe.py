"""The GPU's clocks and power while a held-out program runs free, under the profiler, and with a
sync after every pass (issue #24, kv_cache; see pass_probe.py).

``python clock_probe.py OUT.json decode.py --model qwen2 --no-cache ...`` runs the program with its
``harness.record`` replaced: after the warm-up, ``--timing-windows`` rounds of three windows of
``--timed-steps`` steps each, ``free`` (as written), ``profiled`` (inside ``torch.profiler`` with
CUDA activities and ``record_shapes=True``, as ``harness.record`` traces; the trace is discarded)
and ``synced`` (a ``torch.cuda.synchronize()`` after each outermost module call). A thread samples
NVML every 20 ms (SM clock, power, throttle reasons, utilisation). Kept per window: the mean step
(host clock, one sync per step), the GPU's busy time per step where the profiler measured it, and
the NVML samples' medians. A GPU that idles part of each step under the profiler may run its
kernels at other clocks than one kept busy without it.
"""

from __future__ import annotations

import json
import os
import runpy
import statistics
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import pynvml  # noqa: E402
import torch  # noqa: E402
from torch.nn.modules import module as _module  # noqa: E402


class Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        pynvml.nvmlInit()
        self.h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        self.rows: list[tuple[float, int, float, int, int]] = []
        self.stop = False

    def run(self) -> None:
        while not self.stop:
            h = self.h
            self.rows.append((time.perf_counter(), pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                              pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                              pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
                              pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
            time.sleep(0.02)


def main() -> None:
    out, program, *args = sys.argv[1:]
    state = {"depth": 0, "sync": False}

    def pre(*_: Any) -> None:
        state["depth"] += 1

    def post(*_: Any) -> None:
        state["depth"] -= 1
        if state["depth"] == 0 and state["sync"]:
            torch.cuda.synchronize()

    _module.register_module_forward_pre_hook(pre)
    _module.register_module_forward_hook(post)

    def record(a: Any, step: Any, extra: dict[str, Any] | None = None) -> None:
        for _ in range(a.warmup_steps):
            step()
        torch.cuda.synchronize()
        s = Sampler()
        s.start()
        windows: list[dict[str, Any]] = []
        for _ in range(a.timing_windows):
            for mode in ("free", "profiled", "synced"):
                state["sync"] = mode == "synced"
                prof = None
                if mode == "profiled":
                    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                              torch.profiler.ProfilerActivity.CUDA],
                                                  record_shapes=True)
                    prof.__enter__()
                    step()  # the profiler's first step warms it up
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(a.timed_steps):
                    step()
                torch.cuda.synchronize()
                t1 = time.perf_counter()
                busy = None
                if prof is not None:
                    prof.__exit__(None, None, None)
                    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
                    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1000.0 / (a.timed_steps + 1)
                state["sync"] = False
                rows = [r for r in s.rows if t0 <= r[0] <= t1]
                windows.append({"mode": mode, "step_ms": (t1 - t0) * 1e3 / a.timed_steps, "gpu_busy_ms": busy,
                                "sm_mhz": statistics.median(r[1] for r in rows) if rows else None,
                                "power_w": statistics.median(r[2] for r in rows) if rows else None,
                                "throttle": sorted({r[3] for r in rows}), "util": statistics.median(r[4] for r in rows) if rows else None,
                                "samples": len(rows)})
                w = windows[-1]
                print(f"{mode:9s} step {w['step_ms']:.2f} ms, SM {w['sm_mhz']} MHz, {w['power_w']} W, "
                      f"throttle {w['throttle']}, util {w['util']}, busy {busy}", flush=True)
        s.stop = True
        with open(out, "w") as f:
            json.dump({"program": program, "args": args, "windows": windows, **(extra or {})}, f, indent=1)

    harness.record = record
    sys.argv = [program, *args]
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), program), run_name="__main__")


if __name__ == "__main__":
    main()
