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


def exclusive_time(start: np.ndarray, end: np.ndarray, cls: np.ndarray, lo: float, hi: float) -> dict[str, float]:
    """Time in [lo, hi) given to each class by priority (``CLASSES`` order), plus ``idle``."""
    s, e = np.clip(start, lo, hi), np.clip(end, lo, hi)
    keep = e > s
    s, e, c = s[keep], e[keep], cls[keep]
    out = {k: 0.0 for k in CLASSES}
    out["idle"] = float(hi - lo)
    if len(s) == 0:
        return out
    bounds = np.unique(np.r_[s, e, lo, hi])
    seg = np.diff(bounds)
    taken = np.zeros(len(seg), dtype=bool)
    for name in CLASSES:
        m = c == name
        if not m.any():
            continue
        delta = np.zeros(len(bounds))
        np.add.at(delta, np.searchsorted(bounds, s[m]), 1)
        np.add.at(delta, np.searchsorted(bounds, e[m]), -1)
        active = np.cumsum(delta)[:-1] > 0
        mine = active & ~taken
        out[name] = float(seg[mine].sum())
        taken |= mine
    out["idle"] = float(seg[~taken].sum())
    return out


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
    rows = []
    bounds = zip(steps["step"].to_numpy(dtype=np.int64), steps["start"].to_numpy(dtype=float),
                 steps["end"].to_numpy(dtype=float))
    for step, lo, hi in bounds:  # steps are few; the work inside is vectorised
        t = exclusive_time(start, end, cls, float(lo), float(hi))
        rows.append({"step": int(step), "time_us": float(hi - lo), **{f"{k}_us": v for k, v in t.items()}})
    per = pd.DataFrame(rows)
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
