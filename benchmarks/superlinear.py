"""Inputs that used to cost superlinear time, each at growing sizes: the time should grow about
in proportion to the size (a ratio near 10 per 10x), not with its square.

- nesting: one thread of N ops each inside the previous one (``links.nest``; 10^6 took 638 s);
- steps: N ``ProfilerStep`` windows of a few kernels each (step assignment, the GPU timeline's
  time by class, analyzers); the whole report is timed;
- long name: one kernel whose name is N bytes (loader, kernel table, text/JSON/HTML reports).

The traces are SYNTHETIC, built here (a benchmark of pathological shapes, not of real traces).
Each size runs in a fresh process; prints seconds per size and the growth per step of size.

    python benchmarks/superlinear.py            # default sizes (a few minutes on 2 cores)
    python benchmarks/superlinear.py --quick    # smaller sizes
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import sys, time, json
kind, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if kind == "nesting":
    import numpy as np, pandas as pd
    from gpuprof.trace.links import nest
    ts = np.arange(n, dtype=float)
    dur = 2.0 * (n - np.arange(n))
    ops = pd.DataFrame({"pid": np.zeros(n, np.int64), "tid": np.zeros(n, np.int64), "ts": ts, "dur": dur,
                        "end": ts + dur})
    t = time.perf_counter()
    depth, parent = nest(ops)
    dt = time.perf_counter() - t
    assert depth[-1] == n - 1 and parent[-1] == n - 2
else:
    import gpuprof
    t = time.perf_counter()
    a = gpuprof.analyze(out, cache=False)
    a.to_json(); a.to_text(); a.to_html()
    dt = time.perf_counter() - t
print(json.dumps({"seconds": dt}))
"""


def _steps_trace(n: int, path: Path) -> None:
    """N ProfilerStep windows, each with one mm op launching 3 kernels (relative µs, H200)."""
    ev: list[dict[str, object]] = []
    corr = 1
    for s in range(n):
        t0 = s * 100.0
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1, "ts": t0,
                   "dur": 90.0, "args": {"External id": 10 * s + 1}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t0 + 1, "dur": 20.0,
                   "args": {"External id": 10 * s + 2, "Input Dims": [[256, 256], [256, 256]],
                            "Input type": ["float", "float"], "Concrete Inputs": ["", ""]}})
        for k in range(3):
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": t0 + 2 + k, "dur": 1.0, "args": {"correlation": corr, "External id": 10 * s + 2}})
            ev.append({"ph": "X", "cat": "kernel", "name": f"gemm_kernel_{k}", "pid": 0, "tid": 7,
                       "ts": t0 + 10 + 20 * k, "dur": 15.0,
                       "args": {"device": 0, "stream": 7, "correlation": corr, "External id": 10 * s + 2,
                                "grid": [64, 1, 1], "block": [256, 1, 1]}})
            corr += 1
    _write(ev, path)


def _long_name_trace(n: int, path: Path) -> None:
    """One step whose kernel name is N bytes (a pathological template expansion)."""
    name = "k" * n
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
          {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 1, "dur": 10, "args": {"External id": 5}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 2, "dur": 1,
           "args": {"correlation": 9, "External id": 5}},
          {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 5, "dur": 20,
           "args": {"device": 0, "stream": 7, "correlation": 9, "External id": 5, "grid": [1, 1, 1],
                    "block": [32, 1, 1]}}]
    _write(ev, path)


def _write(events: list[dict[str, object]], path: Path) -> None:
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": 1_790_000_000_000_000_000, "traceEvents": events,
           "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320,
                                 "computeMajor": 9, "computeMinor": 0, "numSms": 132}]}
    path.write_text(json.dumps(doc))


def run(kind: str, sizes: list[int]) -> None:
    prev = None
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = Path(tmp) / f"{kind}_{n}.json"
            if kind == "steps":
                _steps_trace(n, path)
            elif kind == "long name":
                _long_name_trace(n, path)
            r = subprocess.run([sys.executable, "-c", CHILD, kind.split()[0], str(n), str(path)], capture_output=True,
                               text=True, check=False)
            if r.returncode != 0:
                print(f"{kind:10} {n:>11,}  failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
                continue
            s = json.loads(r.stdout.strip().splitlines()[-1])["seconds"]
            growth = f"x{s / prev[1]:.1f} for x{n / prev[0]:.0f}" if prev else ""
            print(f"{kind:10} {n:>11,} {s:9.2f} s  {growth}")
            prev = (n, s)
            path.unlink(missing_ok=True)


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    run("nesting", [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000])
    run("steps", [100, 1_000] if quick else [100, 1_000, 10_000])
    run("long name", [1_000_000, 10_000_000] if quick else [1_000_000, 10_000_000, 100_000_000])


if __name__ == "__main__":
    main(sys.argv[1:])
