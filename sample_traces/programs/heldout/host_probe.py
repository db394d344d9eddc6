"""The host's own time per step of a held-out program, without the profiler (issue #24, kv_cache).

Runs a held-out program (``python host_probe.py OUT.json decode.py --model gpt2 --no-cache ...``)
with its ``harness.record`` replaced: after the warm-up, each of ``--timed-steps`` × ``--timing-windows``
steps is timed on the host from its start to the return of its last launch (``host_ms``; the
program's own syncs inside a step count in it, so only programs without syncs in a step say the
host's work alone) and to the end of its GPU work after one ``torch.cuda.synchronize()``
(``step_ms``; the GPU idles while the next step's first launches queue, so this is no unprofiled
step time); the main thread's CPU time over the host part too (``cpu_ms``). Nothing is profiled.
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


def main() -> None:
    out, program, *args = sys.argv[1:]

    def sync() -> None:
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def record(a: Any, step: Any, extra: dict[str, Any] | None = None) -> None:
        for _ in range(a.warmup_steps):
            step()
        sync()
        host, cpu, full = [], [], []
        for _ in range(a.timed_steps * a.timing_windows):
            t0, c0 = time.perf_counter(), time.thread_time()
            step()
            t1, c1 = time.perf_counter(), time.thread_time()
            sync()
            t2 = time.perf_counter()
            host.append((t1 - t0) * 1e3)
            cpu.append((c1 - c0) * 1e3)
            full.append((t2 - t0) * 1e3)
        rec = {"program": program, "args": args, "host_ms": statistics.median(host), "cpu_ms": statistics.median(cpu),
               "step_ms": statistics.median(full), "host_ms_all": host, "cpu_ms_all": cpu, "step_ms_all": full,
               **(extra or {})}
        with open(out, "w") as f:
            json.dump(rec, f, indent=1)
        print(f"{program} {' '.join(args)}: host {rec['host_ms']:.2f} ms, cpu {rec['cpu_ms']:.2f} ms, "
              f"synced step {rec['step_ms']:.2f} ms", flush=True)

    harness.record = record
    sys.argv = [program, *args]
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), program), run_name="__main__")


if __name__ == "__main__":
    main()
