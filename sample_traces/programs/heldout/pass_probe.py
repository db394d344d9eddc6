"""The host's own time per forward pass of a held-out decoding program, with the launch queue free
and with it full (issue #24, kv_cache; no profiler).

``python pass_probe.py OUT.json decode.py --model gpt2 --no-cache ...`` runs the program with its
``harness.record`` replaced. Every outermost ``nn.Module`` call (a forward pass of the model) is
timed on the host, from its call to its return, by global module hooks. After the warm-up, windows
of ``--timed-steps`` steps alternate between two modes:

- ``free``: the program as written (no sync inside a step). Where the GPU is behind, a launch
  blocks until CUDA's launch queue has room, and that wait is inside the pass's host time.
- ``synced``: a ``torch.cuda.synchronize()`` after each pass returns (outside its timed span), so
  every pass starts with an empty queue: its host time is the host's own work, beside a GPU that
  runs the pass's kernels as they come.

If the uncached passes' host is longer ``free`` than ``synced``, the host time a busy GPU adds is
the queue's back-pressure, not slower host work. Each step's ``host_ms`` (start to the return of its
last launch) and ``step_ms`` (to the end of its GPU work) are kept too, with the main thread's CPU
time per pass. Nothing is profiled.
"""

from __future__ import annotations

import json
import os
import runpy
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import torch  # noqa: E402
from torch.nn.modules import module as _module  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Passes:
    """Times each outermost module call; optionally syncs after it."""

    def __init__(self) -> None:
        self.depth = 0
        self.t0 = self.c0 = 0.0
        self.sync = False
        self.host: list[float] = []
        self.cpu: list[float] = []

    def pre(self, *_: Any) -> None:
        self.depth += 1
        if self.depth == 1:
            self.t0, self.c0 = time.perf_counter(), time.thread_time()

    def post(self, *_: Any) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.host.append((time.perf_counter() - self.t0) * 1e3)
            self.cpu.append((time.thread_time() - self.c0) * 1e3)
            if self.sync:
                _sync()


def main() -> None:
    out, program, *args = sys.argv[1:]
    passes = Passes()
    _module.register_module_forward_pre_hook(passes.pre)
    _module.register_module_forward_hook(passes.post)

    def record(a: Any, step: Any, extra: dict[str, Any] | None = None) -> None:
        for _ in range(a.warmup_steps):
            step()
        _sync()
        modes: dict[str, dict[str, list[float]]] = {m: {"pass_host_ms": [], "pass_cpu_ms": [], "step_host_ms": [],
                                                         "step_ms": [], "passes": []} for m in ("free", "synced")}
        for w in range(2 * a.timing_windows):
            mode = "free" if w % 2 == 0 else "synced"
            passes.sync = mode == "synced"
            rec = modes[mode]
            for _ in range(a.timed_steps):
                passes.host.clear()
                passes.cpu.clear()
                t0 = time.perf_counter()
                step()
                t1 = time.perf_counter()
                _sync()
                t2 = time.perf_counter()
                rec["pass_host_ms"].append(sum(passes.host))
                rec["pass_cpu_ms"].append(sum(passes.cpu))
                rec["passes"].append(len(passes.host))
                rec["step_host_ms"].append((t1 - t0) * 1e3)
                rec["step_ms"].append((t2 - t0) * 1e3)
        passes.sync = False
        doc: dict[str, Any] = {"program": program, "args": args, **(extra or {})}
        for mode, rec in modes.items():
            doc[mode] = {k: statistics.median(v) for k, v in rec.items()}
            doc[mode + "_all"] = rec
        with open(out, "w") as f:
            json.dump(doc, f, indent=1)
        f_, s_ = doc["free"], doc["synced"]
        print(f"{program} {' '.join(args)}: passes' host free {f_['pass_host_ms']:.2f} ms "
              f"(cpu {f_['pass_cpu_ms']:.2f}), synced {s_['pass_host_ms']:.2f} ms (cpu {s_['pass_cpu_ms']:.2f}); "
              f"step free {f_['step_ms']:.2f}, synced {s_['step_ms']:.2f} ms; {f_['passes']:.0f} passes", flush=True)

    harness.record = record
    sys.argv = [program, *args]
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), program), run_name="__main__")


if __name__ == "__main__":
    main()
