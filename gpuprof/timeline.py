"""Per-step time on the GPU timeline: busy, idle, time by class, and MFU.

Within each step window (see :mod:`gpuprof.trace.links`), every instant is given to one class:
the highest-priority activity running then. Compute outranks memory, latency, unknown, memcpy
and communication, so communication or a copy hidden under compute costs nothing, and only the
exposed part shows. Instants with no GPU activity are idle. The classes sum to the step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.costmodel import MATMUL_FAMILIES
from gpuprof.specs import GpuSpec

CLASSES = ("compute", "memory", "latency", "unknown", "memcpy", "communication")


def exclusive_times(start: np.ndarray, end: np.ndarray, cls: np.ndarray, lo: np.ndarray,
                    hi: np.ndarray) -> dict[str, np.ndarray]:
    """Time in each window [lo[i], hi[i]) given to each class by priority (``CLASSES`` order),
    plus ``idle``, one array entry per window.

    One sweep over all events and windows together: the timeline is cut at every start, end and
    window edge, each piece goes to the highest-priority class active on it, and a window's time
    in a class is a difference of running sums. O((events + windows) log), where clipping every
    event to every window was O(events x windows).
    """
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    keep = np.isfinite(start) & np.isfinite(end) & (end > start)
    s, e, c = start[keep], end[keep], cls[keep]
    edges = np.unique(np.r_[s, e, lo[np.isfinite(lo)], hi[np.isfinite(hi)]])
    seg = np.diff(edges)
    taken = np.zeros(len(seg), dtype=bool)
    a = np.searchsorted(edges, lo)  # windows' edges are among the cuts
    b = np.searchsorted(edges, hi)
    ok = np.isfinite(lo) & np.isfinite(hi) & (hi > lo)
    a, b = np.where(ok, a, 0), np.where(ok, b, 0)
    out: dict[str, np.ndarray] = {}
    for name in CLASSES:
        m = c == name
        if not m.any() or len(seg) == 0:
            out[name] = np.zeros(len(lo))
            continue
        delta = np.bincount(np.searchsorted(edges, s[m]), minlength=len(edges)) \
            - np.bincount(np.searchsorted(edges, e[m]), minlength=len(edges))
        mine = (np.cumsum(delta)[:-1] > 0) & ~taken
        taken |= mine
        run = np.r_[0.0, np.cumsum(np.where(mine, seg, 0.0))]
        out[name] = np.maximum(run[b] - run[a], 0.0)
    width = np.where(ok, hi - lo, 0.0)
    out["idle"] = np.maximum(width - sum(out[k] for k in CLASSES), 0.0)
    return out


def exclusive_time(start: np.ndarray, end: np.ndarray, cls: np.ndarray, lo: float, hi: float) -> dict[str, float]:
    """Time in [lo, hi) given to each class by priority (``CLASSES`` order), plus ``idle``."""
    t = exclusive_times(start, end, cls, np.array([lo]), np.array([hi]))
    return {k: float(v[0]) for k, v in t.items()}


@dataclass(frozen=True)
class StepSummary:
    steps: pd.DataFrame  # per step: time_us and class times (µs)
    step_time_ms: float
    gpu_busy_pct: float
    breakdown_pct: dict[str, float]
    model_flops_per_step: float
    mfu_pct: float | None
    mfu_basis: dict[str, Any]
    coverage_pct: float


def summarize(steps: pd.DataFrame, kernels: pd.DataFrame, roof: pd.DataFrame, memcpys: pd.DataFrame,
              spec: GpuSpec | None) -> StepSummary:
    start = np.r_[kernels["ts"].to_numpy(), memcpys["ts"].to_numpy()]
    end = np.r_[kernels["end"].to_numpy(), memcpys["end"].to_numpy()]
    cls = np.r_[roof["cls"].to_numpy().astype(object), np.full(len(memcpys), "memcpy", dtype=object)]
    lo, hi = steps["start"].to_numpy(dtype=float), steps["end"].to_numpy(dtype=float)
    t = exclusive_times(start, end, cls, lo, hi)
    per = pd.DataFrame({"step": steps["step"].to_numpy(dtype=np.int64), "time_us": hi - lo,
                        **{f"{k}_us": v for k, v in t.items()}})
    total = float(per["time_us"].sum()) if len(per) else 0.0
    n = max(len(per), 1)
    breakdown = {k: (100.0 * per[f"{k}_us"].sum() / total if total else 0.0) for k in (*CLASSES, "idle")}

    in_steps = kernels["step"].to_numpy() >= 0
    fam = roof["family"].astype(str).to_numpy()
    matmul = in_steps & np.isin(fam, MATMUL_FAMILIES) & np.isfinite(roof["flops"].to_numpy())
    flops = float(np.nansum(roof["flops"].to_numpy()[matmul])) / n
    basis: dict[str, Any] = {}
    mfu = None
    if flops > 0 and spec is not None and total > 0:
        by_dtype = pd.Series(roof["flops"].to_numpy()[matmul]).groupby(roof["dtype"].to_numpy()[matmul]).sum()
        dominant = str(by_dtype.idxmax())
        # FP32 matmuls are measured against the TF32 tensor-core peak: the hardware's matrix
        # rate for that dtype, which one flag (allow_tf32) unlocks. Against the FP32 CUDA-core
        # peak an untuned FP32 run would look efficient.
        peak_dtype = {"fp32": "tf32", "fp64": "fp64_tc"}.get(dominant, dominant)
        peak = spec.peak(peak_dtype)
        step_s = total / n * 1e-6
        mfu = 100.0 * flops / (step_s * peak * 1e12) if peak else None
        basis = {"model_flops_per_step": flops, "dominant_dtype": dominant, "peak": peak_dtype,
                 "peak_tflops": peak, "families": list(MATMUL_FAMILIES)}
    ktime = kernels["dur"].to_numpy()[in_steps & ~kernels["is_comm"].to_numpy()]
    modelled = np.isfinite(roof["flops"].to_numpy()[in_steps & ~kernels["is_comm"].to_numpy()])
    coverage = 100.0 * float(ktime[modelled].sum()) / float(ktime.sum()) if ktime.sum() > 0 else 0.0
    busy = 100.0 - breakdown["idle"] if total else 0.0
    return StepSummary(per, total / n / 1000.0, busy, breakdown, flops, mfu, basis, coverage)
