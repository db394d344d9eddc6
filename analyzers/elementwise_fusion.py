"""elementwise_fusion: chains of memory-bound elementwise, normalisation and reduction kernels
that each read and write the same activations (hand-written LayerNorm, GELU, RMSNorm,
bias + activation + residual).

Trigger: three or more consecutive kernels on one stream, all from elementwise, norm, reduction
or softmax ops and all memory- or latency-bound, inside one step.
Autocast's dtype casts between two of a chain's kernels (``aten::copy_`` from one floating type to
another: a hand-written formula's ``pow``/``div``/``mean`` run in FP32 under bf16 autocast) do not
end the chain: one fused module covers the whole formula. The casts themselves stay (autocast still
casts around a fused LayerNorm, which runs in FP32).
Estimate: one fused kernel moves the bytes of the chain's largest member at the roofline
efficiency the chain's kernels already reach (time-weighted), and pays no launch gaps; the
saving is the chain's kernel time minus that, plus the idle gaps between the chain's kernels
(the launches the fusion removes). Optimizer kernels are left to ``optimizer_fusion``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from gpuprof.claims import Candidate
from gpuprof.analyzers._base import ms, top_names

if TYPE_CHECKING:
    from gpuprof.rank import RankView

FUSIBLE = ("elementwise", "norm", "reduction", "softmax")
MIN_CHAIN = 3


def first_numel(v: RankView, k: pd.DataFrame) -> np.ndarray:
    """Per kernel, the element count of its op's first input (0 where unknown)."""
    from gpuprof.analyzers._base import per_shape
    from gpuprof.costmodel import _numel

    op = k["op"].to_numpy(dtype=np.int64)
    if not len(k) or not (op >= 0).any():
        return np.zeros(len(k), dtype=np.int64)
    first = per_shape(v.trace.ops, np.unique(op[op >= 0]),
                      lambda d: _numel(d[0]) if isinstance(d, list) and d and isinstance(d[0], list) else 0)
    out: np.ndarray = first.reindex(op).fillna(0).to_numpy(dtype=np.int64)
    return out


def casts(v: RankView, k: pd.DataFrame) -> np.ndarray:
    """Which kernels of ``k`` are dtype casts: a ``copy`` kernel of an ``aten::copy_`` between two
    floating tensors of different types (what ``.to(dtype)`` and autocast issue)."""
    from gpuprof.trace.load import parse_arg
    from gpuprof.trace.names import text_values

    ops = v.trace.ops
    op = k["op"].to_numpy(dtype=np.int64)
    fam = (k["family"].astype(str) == "copy").to_numpy() & (op >= 0)
    out = np.zeros(len(k), dtype=bool)
    if not fam.any():
        return out
    rows = op[fam]
    names = text_values(ops["name"])[rows]
    types = ops["input_types"].to_numpy()[rows]
    memo: dict[object, bool] = {}

    def is_cast(t: object) -> bool:
        if t not in memo:
            ts = parse_arg(t) if isinstance(t, (bytes, str)) else None
            fl = [x for x in (ts or [])[:2] if x in ("float", "c10::BFloat16", "c10::Half", "double")]
            memo[t] = len(fl) == 2 and fl[0] != fl[1]
        return memo[t]

    out[np.flatnonzero(fam)] = [n == "aten::copy_" and is_cast(t) for n, t in zip(names, types)]
    return out


#: The kernel columns :func:`run` reads (and :func:`casts`, :func:`first_numel`, ``top_names``).
_READ = ("device", "stream", "ts", "step", "name", "op", "op_name", "family", "bound", "dur", "t_roof_us",
         "model_error", "issue_bound")


def run(v: RankView) -> list[Candidate]:
    out: list[Candidate] = []
    k = v.in_stream_order(_READ)
    if k.empty:
        return out
    # A kernel that ran above its HBM roofline (roofline.MODEL_ERROR_PCT: data already in L2)
    # is still a chain member a fusion removes; it is taken as running at its roof.
    err = k["model_error"].to_numpy(dtype=bool)
    k = k.assign(t_roof_us=np.where(err, k["dur"], k["t_roof_us"]))
    # Issue-bound scalar-path kernels (roofline's issue_bound) fuse the same way: the fused kernel
    # drops their loads, stores and index arithmetic.
    issue = k["issue_bound"].to_numpy(dtype=bool) if "issue_bound" in k else np.zeros(len(k), dtype=bool)
    ok = (k["family"].astype(str).isin(FUSIBLE) & (k["bound"].isin(["memory", "latency"]) | err | issue)
          & np.isfinite(k["t_roof_us"]) & ~v.in_update().reindex(k.index)).to_numpy()
    # Autocast's dtype casts between the formula's ops (pow, div, mean run in FP32 under bf16 autocast)
    # do not split the formula: one fused module (or Inductor kernel) covers all its ops, where each
    # piece between two casts was priced as a fused kernel of its own, and a piece of one or two kernels
    # was not claimed at all. The casts stay (autocast still casts around a fused LayerNorm).
    cast = casts(v, k) & ~v.in_update().reindex(k.index).to_numpy()
    lane = (k["device"].astype(np.int64) * 100_003 + k["stream"] * 101 + k["step"]).to_numpy()
    # only a cast of the formula's own tensor between two of its elementwise ops: as many elements as
    # both (a weight's cast, or one between a fused norm's backward and a gradient sum, joins nothing)
    numel = first_numel(v, k)
    pos = np.arange(len(k))
    left = pd.Series(np.where(ok, pos, np.nan)).ffill().to_numpy()
    right = pd.Series(np.where(ok, pos, np.nan)).bfill().to_numpy()
    both = np.isfinite(left) & np.isfinite(right)
    li, ri = np.where(both, left, 0).astype(np.int64), np.where(both, right, 0).astype(np.int64)
    arith = (k["family"].astype(str) == "elementwise").to_numpy()  # the formula's own arithmetic
    cast &= both & arith[li] & arith[ri] & (numel == numel[li]) & (numel == numel[ri]) & (numel > 0)
    joined = ok | cast
    brk = np.r_[True, (~joined[1:]) | (~joined[:-1]) | (lane[1:] != lane[:-1])]
    chain = np.where(ok, np.cumsum(brk), -1)
    kk = k.assign(chain=chain)[ok]
    sizes = kk.groupby("chain")["dur"].transform("size")
    kk = kk[sizes >= MIN_CHAIN]
    if kk.empty:
        return out
    g = kk.groupby("chain")
    eff = g["t_roof_us"].sum() / g["dur"].sum()
    fused = g["t_roof_us"].max() / eff.clip(lower=1e-3)
    total = g["dur"].sum()
    keep = (total - fused) / total
    saved = kk["dur"] * kk["chain"].map(keep.clip(lower=0.0))
    n_chains = len(total) / v.n_steps
    firsts = kk.groupby("chain").head(1).index
    units = {**v.kernel_units(kk.index, saved), **v.inner_gap_units(kk.index, exclude_first=firsts)}
    ops = kk["op_name"].astype(str).value_counts().head(8).to_dict()
    out.append(Candidate(
        id="GP-ELEM-001", category="elementwise_fusion",
        title=f"{n_chains:.0f} chains per step of {kk.groupby('chain').size().median():.0f}+ memory-bound "
              f"elementwise/norm kernels re-read the same activations",
        confidence="high",
        recommendation="Fuse them: `model = torch.compile(model)` fuses elementwise chains automatically; "
                       "otherwise use fused modules (`nn.LayerNorm`, `nn.RMSNorm`, `F.gelu(x, approximate='tanh')`, "
                       "`F.silu`) instead of hand-written formulas.",
        units=units,
        evidence={
            "rank": v.rank, "chains_per_step": round(n_chains, 1),
            "chain_kernels_per_step": round(len(kk) / v.n_steps, 1),
            "chain_ms_per_step": round(ms(total.sum()) / v.n_steps, 3),
            "estimated_fused_ms_per_step": round(ms(fused.sum()) / v.n_steps, 3),
            "ops": ops, "kernels": top_names(kk),
            "estimate": "a fused kernel moves the largest member's bytes at the chain's achieved "
                        "roofline efficiency",
        },
    ))
    return out
