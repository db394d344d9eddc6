"""elementwise_fusion: chains of memory-bound elementwise, normalisation and reduction kernels
that each read and write the same activations (hand-written LayerNorm, GELU, RMSNorm,
bias + activation + residual).

Trigger: three or more consecutive kernels on one stream, all from elementwise, norm, reduction
or softmax ops and all memory- or latency-bound, inside one step.
Estimate: one fused kernel moves the bytes of the chain's largest member at the roofline
efficiency the chain's kernels already reach (time-weighted), and pays no launch gaps; the
saving is the chain's kernel time minus that, plus the idle gaps between the chain's kernels
(the launches the fusion removes). Optimizer kernels are left to ``optimizer_fusion``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from gpuprof.claims import Candidate
from gpuprof.analyzers._base import ms, top_names

if TYPE_CHECKING:
    from gpuprof.rank import RankView

FUSIBLE = ("elementwise", "norm", "reduction", "softmax")
MIN_CHAIN = 3


def run(v: RankView) -> list[Candidate]:
    out: list[Candidate] = []
    k = v.kernels.sort_values(["device", "stream", "ts"], kind="stable")
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
    lane = (k["device"].astype(np.int64) * 100_003 + k["stream"] * 101 + k["step"]).to_numpy()
    brk = np.r_[True, (~ok[1:]) | (~ok[:-1]) | (lane[1:] != lane[:-1])]
    chain = np.cumsum(brk)
    chain = np.where(ok, chain, -1)
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
