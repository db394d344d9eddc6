"""Host-side idle time, one analyzer per cause of the GPU's idle gaps (see ``_base.classify_gaps``).

* ``input_pipeline``: the GPU waits while the training process prepares the next batch.
* ``host_sync``: a call that drains the GPU queue (``.item()``, ``.cpu()``, ``nonzero``,
  ``synchronize``) leaves the GPU idle until the host launches new work.
* ``launch_overhead``: the host cannot launch kernels as fast as the GPU runs them.

Estimate: the gaps of that cause, per step, each less the profiler's own cost for the host
events recorded inside it (``_base``: known when the unprofiled step time is). For launch overhead this is an upper
bound: CUDA graphs still leave about a microsecond between kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from gpuprof.analyzers._base import HOST_NOTE, SYNC_CALLS, Candidate, RankView, gap_units, ms, views

if TYPE_CHECKING:
    from gpuprof.api import Analysis


def _gaps(v: RankView, cause: str) -> pd.DataFrame:
    g: pd.DataFrame = v.gaps
    return g[g["cause"] == cause] if len(g) else g


def _common(v: RankView, g: pd.DataFrame) -> dict[str, Any]:
    ev: dict[str, Any] = {"rank": v.rank, "gaps_per_step": round(len(g) / v.n_steps, 1),
                          "idle_ms_per_step_traced": round(ms(g["dur"].sum()) / v.n_steps, 3),
                          "idle_ms_per_step_without_profiler": round(ms(g["real_dur"].sum()) / v.n_steps, 3),
                          "profiler_cost_per_host_event_us": round(v.event_cost_us, 3)}
    if not v.host_scale_known:
        ev["note"] = HOST_NOTE
    return ev


def input_pipeline(analysis: Analysis) -> list[Candidate]:
    out = []
    for v in views(analysis):
        g = _gaps(v, "input")
        if g.empty:
            continue
        ev = _common(v, g)
        loads = v.trace.memcpys[v.trace.memcpys["kind"] == "HtoD"]
        ev["host_to_device_mb_per_step"] = round(float(loads["bytes"].sum()) / 1e6 / v.n_steps, 1)
        out.append(Candidate(
            id="GP-INPUT-001", category="input_pipeline",
            title=f"The GPU waits for the next batch: {ms(g['dur'].sum()) / v.n_steps:.1f} ms idle per step "
                  "while the DataLoader runs in the training process",
            confidence=v.host_confidence("high"),
            recommendation="Load and augment batches off the critical path: `DataLoader(..., num_workers=N "
                           "(start with the CPU cores per GPU), pin_memory=True, persistent_workers=True, "
                           "prefetch_factor=2..4)`, move heavy preprocessing offline or to the GPU, and copy "
                           "with `.to('cuda', non_blocking=True)`.",
            units=gap_units(v.rank, g, g["real_dur"]), evidence=ev))
    return out


def host_sync(analysis: Analysis) -> list[Candidate]:
    out = []
    for v in views(analysis):
        g = _gaps(v, "sync")
        if g.empty:
            continue
        t = v.trace
        rt = t.runtime[(t.runtime["name"].astype(str).isin(SYNC_CALLS)) & (t.runtime["step"] >= 0)]
        ops = t.ops
        op_rows = pd.Series(np.arange(len(ops)), index=ops["external_id"].to_numpy())
        op_rows = op_rows[~op_rows.index.duplicated()]
        callers = rt["external_id"].map(op_rows).dropna().astype(int)
        names = []
        for row in callers:  # name the user-facing op: climb to the outermost aten op
            r, best = int(row), str(ops.at[int(row), "name"])
            while r >= 0 and str(ops.at[r, "name"]).startswith("aten::"):
                best = str(ops.at[r, "name"])
                r = int(ops.at[r, "parent"])
            names.append(best)
        ev = _common(v, g)
        ev["sync_calls_per_step"] = round(len(rt) / v.n_steps, 1)
        ev["syncing_ops"] = pd.Series(names, dtype=object).value_counts().head(6).to_dict() if names else {}
        ev["sync_apis"] = rt["name"].astype(str).value_counts().to_dict()
        top = next(iter(ev["syncing_ops"]), "a synchronising call")
        out.append(Candidate(
            id="GP-SYNC-001", category="host_sync",
            title=f"{len(rt) / v.n_steps:.0f} host syncs per step ({top}) drain the GPU queue",
            confidence=v.host_confidence("high"),
            recommendation=f"Remove the per-step synchronisation ({top}): keep values on the GPU (accumulate "
                           "metrics as tensors and call `.item()` once every N steps), avoid data-dependent "
                           "shapes (`nonzero`, boolean indexing) in the step, and drop explicit "
                           "`torch.cuda.synchronize()`. With `with_stack=True` the trace names the call site.",
            units=gap_units(v.rank, g, g["real_dur"]), evidence=ev))
    return out


def launch_overhead(analysis: Analysis) -> list[Candidate]:
    out = []
    for v in views(analysis):
        g = _gaps(v, "launch")
        if g.empty:
            continue
        k = v.kernels
        ev = _common(v, g)
        ev["kernels_per_step"] = round(len(k) / v.n_steps, 1)
        ev["median_kernel_us"] = round(float(k["dur"].median()), 2) if len(k) else None
        ev["estimate"] = "idle gaps where the next kernel was launched after the GPU ran dry; CUDA graphs " \
                         "would remove them (upper bound: graphs keep ~1 us between kernels)"
        out.append(Candidate(
            id="GP-LAUNCH-001", category="launch_overhead",
            title=f"The host launches too slowly: {ev['kernels_per_step']:.0f} kernels per step of median "
                  f"{ev['median_kernel_us']} µs leave the GPU idle between launches",
            confidence=v.host_confidence("medium"),
            recommendation="Cut launches: capture the step in a CUDA graph (`torch.compile(model, "
                           "mode='reduce-overhead')` or `torch.cuda.graphs`), fuse small ops with "
                           "`torch.compile`, use fused optimizers, or give each kernel more work (larger batch).",
            units=gap_units(v.rank, g, g["real_dur"]), evidence=ev, generic=True))
    return out
