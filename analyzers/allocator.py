"""allocator_churn: device-memory allocator calls (``cudaMalloc``/``cudaFree``,
``hipMalloc``/``hipFree``) inside the steps.

PyTorch's caching allocator makes these calls only while its pool grows; in every step they mean
the cache is off (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, a "no memory pool" run), emptied
(``torch.cuda.empty_cache()`` in the loop) or so fragmented that it keeps returning and
re-reserving segments. ``cudaFree`` synchronises the device, and both calls take milliseconds on
large segments, so the GPU drains and waits.

Trigger (not on traces that record graph capture, which allocates its pool): idle gaps of cause ``alloc`` (``_base.classify_gaps``: an allocator call returned inside
the gap or covers half of it, and the refill gaps after one).
Estimate: those gaps, less the profiler's share (``_base``), claimed once through the gap units.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from gpuprof.trace.names import ALLOCATOR_CALLS
from gpuprof.claims import Candidate, gap_units
from gpuprof.idle import graph_capture_calls, name_mask, outermost_aten
from gpuprof.analyzers._base import ms

if TYPE_CHECKING:
    from gpuprof.rank import RankView


def run(v: RankView) -> list[Candidate]:
    out: list[Candidate] = []
    g = v.gaps_of("alloc")
    if g.empty or graph_capture_calls(v.trace):  # capture allocates the graph pool: not churn
        return out
    t = v.trace
    rt = t.runtime
    calls = rt[name_mask(rt["name"], among=ALLOCATOR_CALLS) & (rt["step"] >= 0).to_numpy()]
    apis = calls.groupby(calls["name"].astype(object))["dur"].agg(["size", "sum"]).sort_values("sum", ascending=False)
    ops = t.ops
    in_op = np.zeros(len(calls), dtype=bool)
    by_op: dict[str, float] = {}
    if len(ops) and len(calls):
        ext = ops["external_id"].to_numpy()
        order = np.argsort(ext, kind="stable")
        se = ext[order]
        keys = calls["external_id"].to_numpy()
        pos = np.clip(np.searchsorted(se, keys), 0, len(se) - 1)
        in_op = (se[pos] == keys) & (keys >= 0)
        rows = outermost_aten(ops, order[pos[in_op]])
        names = ops["name"].astype(object).to_numpy()[rows]
        s = calls["dur"][in_op].groupby(names).sum().sort_values(ascending=False).head(6)
        by_op = {str(k): round(ms(float(x)) / v.n_steps, 3) for k, x in s.items()}
    call_ms = ms(float(calls["dur"].sum())) / v.n_steps
    main = " / ".join(str(n) for n in apis.index[:2]) or "allocator calls"
    idle = ms(float(g["dur"].sum())) / v.n_steps
    ev = {
        "rank": v.rank,
        "allocator_calls_per_step": round(len(calls) / v.n_steps, 1),
        "allocator_call_ms_per_step": round(call_ms, 3),
        "by_api": {str(n): {"calls_per_step": round(int(r["size"]) / v.n_steps, 1),
                            "ms_per_step": round(ms(float(r["sum"])) / v.n_steps, 3)} for n, r in apis.iterrows()},
        "calls_inside_ops_pct": round(100.0 * float(in_op.mean()), 1) if len(calls) else None,
        "ops_making_calls_ms_per_step": by_op,
        "idle_ms_per_step_traced": round(idle, 3),
        "idle_ms_per_step_without_profiler": round(ms(float(g["real_dur"].sum())) / v.n_steps, 3),
        "estimate": "idle gaps in which an allocator call returned or that one mostly covers (cudaFree/hipFree "
                    "synchronise the device), and the refill gaps after them",
    }
    out.append(Candidate(
        id="GP-ALLOC-001", category="allocator_churn",
        title=f"Memory allocation in every step: {len(calls) / v.n_steps:.0f} {main} calls per step hold the host "
              f"{call_ms:.1f} ms and leave the GPU idle {idle:.1f} ms",
        confidence=v.host_confidence("high"),
        recommendation="Let PyTorch's caching allocator keep its memory: unset "
                       "`PYTORCH_NO_CUDA_MEMORY_CACHING` / `PYTORCH_NO_HIP_MEMORY_CACHING` (or re-enable the "
                       "framework's memory pool), remove `torch.cuda.empty_cache()` from the loop, keep shapes "
                       "static across steps, and against fragmentation set "
                       "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` "
                       "(`PYTORCH_HIP_ALLOC_CONF` on ROCm).",
        units=gap_units(v.rank, g, g["real_dur"]), evidence=ev))
    return out
