"""gpu_throttling and memory_capacity, from the NVML samples of a recorded run.

gpu_throttling — Trigger: samples taken while the GPU works (utilisation ≥ 50 %, over the run:
the profiled window itself is too short and follows a profiler pause) whose clock-event reasons
hold the clock down (SW power cap, HW slowdown, thermal, power brake). Estimate: compute-bound
kernel time scales with the SM clock, so it would shrink by (1 − mean held clock / max clock) over
the held share of busy time; memory-bound time is left as is. The clock is a whole-GPU condition,
not work some kernels own: the finding claims no kernel from the others and counts that share of
what their fixes leave of each kernel (an FP8 GEMM still runs at the held clock); applied together
the factors multiply, so nothing is counted twice (``gpuprof.claims.Candidate.scale``).

memory_capacity — informational: peak memory near capacity (≥ ``NEAR`` %: little headroom,
fragmentation and OOM risk) or far below it (≤ ``ROOM`` %: room for a larger batch or fewer
recomputations; not said of a GPU already busy ≥ ``SATURATED`` %). No saving is claimed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from gpuprof.claims import Candidate

from gpuprof.nvml_data import REASONS, THROTTLE_MASK, busy, summarize

if TYPE_CHECKING:
    from gpuprof.rank import RankView

NEAR, ROOM = 90.0, 50.0
SATURATED = 95.0  # % GPU busy above which "use the memory for a larger batch" is no advice


def gpu_throttling(v: RankView) -> list[Candidate]:
    out: list[Candidate] = []
    r = v.result
    if r.nvml is None or r.nvml.empty:
        return out
    w = busy(r.nvml)
    if w.empty:
        return out
    reasons = pd.to_numeric(w["clock_event_reasons"], errors="coerce").fillna(0).astype(np.int64)
    held = (reasons & THROTTLE_MASK) != 0
    if not held.any():
        return out
    clock = pd.to_numeric(w.loc[held, "sm_clock_mhz"], errors="coerce").mean()
    top = pd.to_numeric(w["sm_clock_max_mhz"], errors="coerce").max()
    if not (clock and top and clock < top):
        return out
    k = v.kernels
    compute = k[k["bound"] == "compute"]
    share = float(held.mean())
    # the clock is the whole GPU's, not a defect of some kernels: the saving is a share of each
    # compute-bound kernel's time, of whatever another finding's fix leaves of it (an FP8 GEMM
    # still runs at the held clock), so it claims no kernel from them (Candidate.scale)
    scale = share * (1.0 - clock / top)
    saved = compute["dur"] * scale
    names = sorted({REASONS[b] for b in REASONS if (b & THROTTLE_MASK) and ((reasons & b) != 0).any()})
    s = summarize(w, r.nvml_period_s)
    out.append(Candidate(
        id="GP-THROTTLE-001", category="gpu_throttling",
        title=f"The GPU is held at {clock:.0f} of {top:.0f} MHz ({', '.join(names)}) for {100 * share:.0f}% "
              "of its busy time",
        confidence="medium",
        recommendation="Check power and cooling (nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE); a dense "
                       "GEMM loop at the power cap is expected on Hopper, and then FP8 or fewer wasted FLOPs "
                       "lower the power per step; thermal or HW slowdown points at cooling or the node.",
        units=v.kernel_units(compute.index, saved), scale=scale,
        evidence={"rank": v.rank, "sm_clock_mhz_when_held": round(float(clock), 1), "sm_clock_mhz_max": float(top),
                  "held_pct_of_busy_time": round(100 * share, 1), "reasons": s["clock_event_reasons"],
                  "power_w_mean": s["power_w_mean"], "power_limit_w": s["power_limit_w"],
                  "compute_bound_ms_per_step": round(float(compute["dur"].sum()) / v.n_steps / 1000, 3),
                  "estimate": "compute-bound kernel time scales with the SM clock over the held share "
                              "of busy time, of what the other findings' fixes leave of each kernel"}))
    return out


def memory_capacity(v: RankView) -> list[Candidate]:
    out: list[Candidate] = []
    r = v.result
    if r.nvml is None or r.nvml.empty:
        return out
    s = summarize(r.nvml, r.nvml_period_s)
    pct = s.get("mem_used_pct_max")
    if pct is None or ROOM < pct < NEAR:
        return out
    near = pct >= NEAR
    if not near and r.summary.gpu_busy_pct >= SATURATED:
        return out  # a GPU busy all the time gains nothing from a larger batch
    out.append(Candidate(
        id="GP-MEM-001" if near else "GP-MEM-002", category="memory_capacity",
        title=(f"Peak GPU memory {pct:.0f}% of capacity: little headroom" if near else
               f"Peak GPU memory only {pct:.0f}% of capacity: room for a larger batch"),
        confidence="medium",
        recommendation=("Free headroom before it fails: activation checkpointing, FSDP/ZeRO sharding, a "
                        "smaller micro-batch with gradient accumulation, "
                        "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` against fragmentation."
                        if near else
                        "Use the memory: a larger batch per GPU (fewer, fuller kernels; fewer steps per "
                        "epoch), less activation recomputation, or fewer GPUs for the same job."),
        units={}, informational=True,
        evidence={"rank": v.rank, "mem_used_mb_max": s["mem_used_mb_max"], "mem_total_mb": s["mem_total_mb"],
                  "mem_used_pct_max": round(pct, 1),
                  "estimate": "informational: no step-time saving is claimed"}))
    return out
