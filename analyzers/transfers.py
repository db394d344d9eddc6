"""pageable_memcpy and memory_bound_decode: data that moves slower than the hardware allows.

pageable_memcpy — Trigger: host↔device copies from or to pageable memory (the driver stages
them through a pinned buffer, at a fraction of the link rate, and they cannot overlap compute).
Estimate: the same bytes at the pinned rate measured in this trace (copies of ≥ 1 MB from pinned
memory), else at the GPU's PCIe rate from its datasheet; and the host no longer waits: a pageable
``cudaMemcpyAsync`` returns only once its copy is done, so it first waits for the work queued ahead
of it on its stream (the host loses its lead on the GPU), and a blocking ``.to()`` then
synchronises the stream; with pinned memory and ``non_blocking=True`` neither call waits. The
copies, their calls' waits and the idle gaps the copies' own syncs drained are the units; the
replay prices them together.

memory_bound_decode — Trigger: an inference trace (no backward, no optimizer) whose GEMMs have
at most ``GEMV_ROWS`` rows (tokens in flight) and are memory-bound: each step streams all weights
to multiply a few rows. Estimate: 8-bit weights halve the bytes of 16-bit ones (a quarter of
FP32), so those kernels' time falls in proportion; batching more requests raises tokens per
step at nearly the same step time (reported as evidence, not as a saving); the launch gaps before
the GEMVs go too, since the fix captures decode in CUDA graphs. Where the host bounds decode
(GPU idle between tiny kernels) ``launch_overhead`` reports it, and ranks ahead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from gpuprof.claims import Candidate, gap_units, units_of
from gpuprof.hostops import copy_sync_gaps
from gpuprof.rank import RankView
from gpuprof.analyzers._base import ms, shape_codes, top_names

from gpuprof.costmodel import gemm_mnk
from gpuprof.idle import forward_only


GEMV_ROWS = 16


def pageable_memcpy(v: RankView) -> list[Candidate]:
    spec = v.spec
    out: list[Candidate] = []
    r = v.result
    t = r.trace
    m = t.memcpys[(t.memcpys["step"] >= 0) & t.memcpys["kind"].isin(["HtoD", "DtoH"])]
    pageable = m[(m["src"] == "Pageable") | (m["dst"] == "Pageable")]
    if pageable.empty:
        return out
    pinned = m[((m["src"] == "Pinned") | (m["dst"] == "Pinned")) & (m["bytes"] >= 1e6)]
    if pinned["dur"].sum() > 0:
        rate = float(pinned["bytes"].sum() / (pinned["dur"].sum() * 1e-6) / 1e9)
        source = "pinned copies measured in this trace"
    elif spec is not None and spec.pcie_gbps:
        rate, source = spec.pcie_gbps, f"PCIe rate of the {spec.name} datasheet"
    else:
        return out
    after = pageable["bytes"] / (rate * 1e9) * 1e6
    saved = (pageable["dur"] - after).clip(lower=0)
    n_steps = max(len(t.steps), 1)
    syncs = v.gaps[copy_sync_gaps(t, v.gaps)] if len(v.gaps) else v.gaps
    achieved = float(pageable["bytes"].sum() / (pageable["dur"].sum() * 1e-6) / 1e9) if pageable["dur"].sum() else 0.0
    out.append(Candidate(
        id="GP-COPY-001", category="pageable_memcpy",
        title=f"{len(pageable) / n_steps:.0f} copies per step from pageable host memory run at "
              f"{achieved:.1f} GB/s ({pageable['bytes'].sum() / n_steps / 1e6:.0f} MB per step)",
        confidence="high",
        recommendation="Allocate host tensors in pinned memory (`DataLoader(pin_memory=True)` or "
                       "`tensor.pin_memory()`) and copy with `.to('cuda', non_blocking=True)`, ideally "
                       "prefetching the next batch on a side stream so the copy overlaps compute.",
        # the copies' own syncs (a blocking `.to()` waits for its copy: pinned + non_blocking does not)
        units={**units_of("m", t.meta.rank, pageable.index, saved), **gap_units(v.rank, syncs, syncs["real_dur"])},
        evidence={"rank": t.meta.rank, "pageable_copies": pageable["name"].astype(str).value_counts().to_dict(),
                  "pageable_gbps": round(achieved, 2), "pinned_gbps_used": round(rate, 2), "rate_source": source,
                  "copy_ms_per_step": round(ms(pageable["dur"].sum()) / n_steps, 3),
                  "estimated_ms_per_step_after": round(ms(after.sum()) / n_steps, 3),
                  "copy_sync_idle_ms_per_step": round(ms(syncs["real_dur"].sum()) / n_steps, 3) if len(syncs) else 0.0,
                  "estimate": "the same bytes at the pinned transfer rate; the copy calls and the syncs in their "
                              "ops no longer wait for the GPU (non_blocking=True)"}))
    return out


def decode_gemvs(v: RankView) -> tuple[pd.DataFrame | None, float]:
    """The memory-bound GEMMs of ``GEMV_ROWS`` rows or fewer of an inference trace (no backward,
    no optimizer) when they hold at least half of its GEMM time, with their median rows; else None."""
    ops = v.trace.ops
    if not forward_only(v.trace):
        return None, 0.0  # training, not inference
    g = v.kernels[(v.kernels["family"] == "gemm") & np.isfinite(v.kernels["t_roof_us"])]
    if g.empty:
        return None, 0.0
    codes, mnk = shape_codes(ops, g["op"].to_numpy(), gemm_mnk, by_name=True)
    m_of = np.array([x[1] if x else 10**9 for x in mnk] + [10**9], dtype=np.int64)  # no op or no model: huge
    m_rows = pd.Series(m_of[codes], index=g.index)
    gemv = g[(m_rows <= GEMV_ROWS) & g["bound"].isin(["memory", "latency"])]
    if gemv.empty or gemv["dur"].sum() < 0.5 * g["dur"].sum():
        return None, 0.0
    return gemv, float(m_rows[gemv.index].median())


def memory_bound_decode(v: RankView) -> list[Candidate]:
    out: list[Candidate] = []
    gemv, rows = decode_gemvs(v)
    if gemv is None:
        return out
    dtype = str(gemv["dtype"].mode().iat[0])
    factor = {"fp32": 0.75, "bf16": 0.5, "fp16": 0.5}.get(dtype, 0.0)
    saved = gemv["dur"] * factor
    tokens = int(rows)
    bw = float(gemv["bytes"].sum() / (gemv["dur"].sum() * 1e-6) / 1e9)
    out.append(Candidate(
        id="GP-DECODE-001", category="memory_bound_decode",
        title=f"Decode streams the weights for {tokens} token(s) per step: GEMMs are memory-bound "
              f"at {bw:.0f} GB/s and take {100 * gemv['dur'].sum() / v.n_steps / v.step_time_us:.0f}% of the step",
        confidence="medium",
        recommendation="Serve more sequences per step (continuous batching: a larger batch costs almost "
                       "nothing while GEMMs are memory-bound), quantise weights to 8 bits (FP8 on Hopper, "
                       "INT8/INT4 weight-only), capture decode in CUDA graphs, and use a paged KV cache.",
        # graph capture of the decode step (in the fix) also removes the launch gaps before its GEMVs
        units={**v.kernel_units(gemv.index, saved), **v.inner_gap_units(gemv.index)},
        evidence={"rank": v.rank, "rows_per_gemm": tokens, "weight_dtype": dtype,
                  "gemv_ms_per_step": round(ms(gemv["dur"].sum()) / v.n_steps, 3),
                  "achieved_gbps": round(bw, 1),
                  "kernels": top_names(gemv),
                  "estimate": f"8-bit weights: {int(100 * factor)}% fewer bytes for {dtype} weights, time "
                              "falls in proportion (memory-bound); CUDA graphs remove the launch gaps "
                              "before the GEMVs"}))
    return out
