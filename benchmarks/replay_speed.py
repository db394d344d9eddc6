"""How fast the replay is: build the graph and replay it for a trace of ~100k kernels.

The big trace is a real one (sample_traces/h200/gpt_bf16 by default) repeated in time: its frames
are tiled with shifted times, correlation ids and step numbers, in memory (every event is a real
event, moved; benchmarks only). Prints the build and replay CPU times.

    python -m benchmarks.replay_speed [--kernels 100000] [--trace PATH]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from gpuprof.jobs import load_trace_cached
from gpuprof.replay import build, deflate, run
from gpuprof.trace.model import RankTrace

DEFAULT = Path(__file__).resolve().parents[1] / "sample_traces" / "h200" / "gpt_bf16.json.gz"


def tile(t: RankTrace, copies: int, period_us: float | None = None) -> RankTrace:
    """``t``'s events repeated ``copies`` times, each copy shifted past the previous one (by
    ``period_us`` when given: the ranks of one job tiled in step)."""
    frames = [t.kernels, t.memcpys, t.runtime, t.ops]
    t_end = period_us or max(float(f["end"].max()) for f in frames if len(f)) + 100.0
    corr = int(max(t.kernels["correlation"].max(), t.runtime["correlation"].max())) + 1
    n_steps = len(t.steps)

    def shifted(f: pd.DataFrame, c: int) -> pd.DataFrame:
        out = f.copy()
        for col in ("ts", "end", "launch_ts", "cpu_start", "cpu_end", "gpu_start", "gpu_end", "start"):
            if col in out:
                out[col] = out[col] + c * t_end
        if "correlation" in out:
            out["correlation"] = np.where(out["correlation"] >= 0, out["correlation"] + c * corr, -1)
        if "step" in out and f is not t.steps:
            out["step"] = np.where(out["step"] >= 0, out["step"] + c * n_steps, -1)
        return out

    def cat(f: pd.DataFrame) -> pd.DataFrame:
        return pd.concat([shifted(f, c) for c in range(copies)], ignore_index=True)

    steps = cat(t.steps)
    steps["step"] = np.arange(len(steps))
    return replace(t, kernels=cat(t.kernels), memcpys=cat(t.memcpys), runtime=cat(t.runtime), ops=cat(t.ops),
                   steps=steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", type=int, default=100_000)
    p.add_argument("--trace", default=str(DEFAULT))
    p.add_argument("--event-cost-us", type=float, default=1.0)
    a = p.parse_args()
    t = load_trace_cached(Path(a.trace), 0, True)
    big = tile(t, max(1, round(a.kernels / max(len(t.kernels), 1))))
    clock = time.process_time  # CPU time: on this shared machine wall times drift by ±20 %
    t0 = clock()
    g = build([big])
    t1 = clock()
    r = run(g)
    t2 = clock()
    # every host span changed: the change must travel through every sync and launch of the trace
    moved = deflate(g, a.event_cost_us)
    t3 = clock()
    d = run(moved)
    t4 = clock()
    print(f"{len(big.kernels)} kernels, {g.n_acts} GPU activities, {g.n_host} host calls, {len(big.steps)} steps "
          f"(CPU time): build {t1 - t0:.2f} s; replay as traced {t2 - t1:.3f} s ({r.times.passes} passes, step "
          f"{r.step_time_ms:.2f} ms vs {float(big.steps['time'].mean()) / 1000:.2f} ms traced); "
          f"replay with every host span changed ({a.event_cost_us} µs less per host event) {t4 - t3:.3f} s "
          f"({d.times.passes} passes, step {d.step_time_ms:.2f} ms)")

if __name__ == "__main__":
    main()
