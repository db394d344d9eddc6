"""elementwise_fusion: runs of memory-bound kernels between the GEMMs, attention and convolutions
that each read and write the same activations — norms (LayerNorm, RMSNorm as pow/mean/rsqrt/mul),
rotary (mul/cat/neg/add), gated and plain activations (silu*mul, GELU), residual adds, dtype casts,
dropout, softmax and cross-entropy, forward and backward: what ``torch.compile`` (Inductor) fuses.

Trigger: two or more consecutive kernels on one stream, all from elementwise, norm, reduction,
softmax, loss, copy/cast or embedding ops and all memory- or latency-bound, inside one step.

Estimate, in two parts:

* GPU: one fused kernel per run moves the bytes of the run's largest member at the roofline
  efficiency the run's kernels already reach (time-weighted); the GPU saves the rest.
* Host: the kernels fused away are launches the host no longer makes. The host's cost per launched
  kernel (real step ÷ kernels per step: an upper bound, exact when the host bounds the step) is
  taken to stay what it is, so after fusion the host needs that cost × the kernels left. Compiled
  code launches at about the eager cost per kernel on the real H200 pairs (µs per kernel, eager vs
  compiled: GPT 22.9 vs 23.0, ResNet-50 24.1 vs 26.3, Llama 29.2 vs at most 26.5).

The step after fusion is the longer of the GPU's busy time less the GPU saving and the host's time
for the kernels left; the saving is the real step minus that, and never more than the GPU saving
plus the step's idle time. Where the host still bounds the step, the GPU saving is hidden and only
its visible part is claimed; the rest of a saving above the GPU part is claimed on the step's
launch gaps (the chain's own inner gaps first). Optimizer kernels are left to ``optimizer_fusion``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from gpuprof.analyzers._base import Candidate, RankView, Unit, ms, shape_codes, top_names, views

if TYPE_CHECKING:
    from gpuprof.api import Analysis

FUSIBLE = ("elementwise", "norm", "reduction", "softmax", "loss", "copy", "embedding")
MIN_CHAIN = 2


def _numel(dims: object) -> int:
    """Elements of an op's largest input tensor: Inductor fuses pointwise work over one iteration
    space, so a run's kernels over the same number of elements become one kernel."""
    best = 0
    for d in dims if isinstance(dims, list) else []:
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            best = max(best, int(np.prod(np.asarray(d, dtype=np.float64))))
    return best


def _gap_claims(v: RankView, inner: dict[Unit, float], want_us: float) -> dict[Unit, float]:
    """``want_us`` (over all profiled steps) of launch-gap time: the chains' own inner gaps first,
    then the step's other launch gaps, each at most its real (unprofiled) length."""
    out: dict[Unit, float] = {}
    left = want_us
    for u, d in sorted(inner.items(), key=lambda x: -x[1]):
        if left <= 0:
            break
        out[u] = min(d, left)
        left -= out[u]
    g = v.gaps
    if left > 0 and len(g):
        rest = g[g["cause"].isin(["launch", "other"]).to_numpy() & (g["real_dur"] > 0).to_numpy()]
        keys = [("gap", v.rank, int(i)) for i in rest.index]
        free = np.array([0.0 if k in out else float(d) for k, d in zip(keys, rest["real_dur"])])
        if free.sum() > 0:
            share = free * min(1.0, left / free.sum())
            out.update({k: float(s) for k, s in zip(keys, share) if s > 0})
    return out


def run(analysis: Analysis) -> list[Candidate]:
    out = []
    for v in views(analysis):
        k = v.kernels.sort_values(["device", "stream", "ts"], kind="stable")
        if k.empty:
            continue
        # A kernel that ran above its HBM roofline (roofline.MODEL_ERROR_PCT: data already in L2)
        # is still a chain member a fusion removes; it is taken as running at its roof.
        err = k["model_error"].to_numpy(dtype=bool)
        k = k.assign(t_roof_us=np.where(err, k["dur"], k["t_roof_us"]))
        ok = (k["family"].astype(str).isin(FUSIBLE) & (k["bound"].isin(["memory", "latency"]) | err)
              & np.isfinite(k["t_roof_us"]) & ~v.in_optimizer().reindex(k.index)).to_numpy()
        lane = (k["device"].astype(np.int64) * 100_003 + k["stream"] * 101 + k["step"]).to_numpy()
        brk = np.r_[True, (~ok[1:]) | (~ok[:-1]) | (lane[1:] != lane[:-1])]
        chain = np.cumsum(brk)
        chain = np.where(ok, chain, -1)
        kk = k.assign(chain=chain)[ok]
        sizes = kk.groupby("chain")["dur"].transform("size")
        kk = kk[sizes >= MIN_CHAIN]
        if kk.empty:
            continue
        g = kk.groupby("chain")
        eff = g["t_roof_us"].sum() / g["dur"].sum()
        fused = g["t_roof_us"].max() / eff.clip(lower=1e-3)
        total = g["dur"].sum()
        keep = ((total - fused) / total).clip(lower=0.0)
        gpu_saved = kk["dur"] * kk["chain"].map(keep)
        n = v.n_steps
        gpu_us = float(gpu_saved.sum()) / n
        kernels = len(v.kernels) / n
        # Host work is per op (Python, dispatch, then its launches): an op is gone once fused, and
        # what is left is one op per stretch of a run over the same number of elements (a weight's
        # cast beside an activation's add stays two kernels, compiled or not).
        first = ~kk["op"].duplicated().to_numpy() | (kk["op"].to_numpy() < 0)
        ko = kk[first]
        codes, numels = shape_codes(v.trace.ops, ko["op"].to_numpy(), _numel)
        el = np.array([*numels, 0], dtype=np.float64)[codes]
        ch = ko["chain"].to_numpy()
        seg = np.r_[True, (ch[1:] != ch[:-1]) | (el[1:] != el[:-1])]
        removed = float(len(ko) - seg.sum()) / n
        ops_all = v.kernels["op"].to_numpy()
        launching = (len(np.unique(ops_all[ops_all >= 0])) + int((ops_all < 0).sum())) / n
        host_per_op = v.real_step_us / launching if launching else 0.0
        host_after = host_per_op * (launching - removed)
        after = max(v.busy_us - gpu_us, host_after)
        saving = max(0.0, min(v.real_step_us - after, gpu_us + max(0.0, v.real_step_us - v.busy_us)))
        firsts = kk.groupby("chain").head(1).index
        if saving <= gpu_us:
            # the host still bounds the step: only part of the GPU saving shows
            units = v.kernel_units(kk.index, gpu_saved * (saving / gpu_us if gpu_us else 0.0))
        else:
            units = {**v.kernel_units(kk.index, gpu_saved),
                     **_gap_claims(v, v.inner_gap_units(kk.index, exclude_first=firsts), (saving - gpu_us) * n)}
        n_chains = len(total) / n
        ops = kk["op_name"].astype(str).value_counts().head(8).to_dict()
        out.append(Candidate(
            id="GP-ELEM-001", category="elementwise_fusion",
            title=f"{n_chains:.0f} runs per step of {g.size().median():.0f}+ memory-bound elementwise/norm/cast "
                  f"kernels re-read the same activations ({removed:.0f} of {launching:.0f} launching ops per step fuse away)",
            confidence="high" if saving <= gpu_us else v.host_confidence("high"),
            recommendation="Fuse them: `model = torch.compile(model)` fuses norms, activations, residual adds, "
                           "casts, rotary and the loss into a few kernels and cuts their launches; otherwise use "
                           "fused modules (`nn.LayerNorm`, `nn.RMSNorm`, `F.gelu(x, approximate='tanh')`, `F.silu`) "
                           "instead of hand-written formulas.",
            units=units,
            evidence={
                "rank": v.rank, "chains_per_step": round(n_chains, 1),
                "chain_kernels_per_step": round(len(kk) / n, 1),
                "chain_ms_per_step": round(ms(total.sum()) / n, 3),
                "estimated_fused_ms_per_step": round(ms(fused.sum()) / n, 3),
                "gpu_ms_saved_per_step": round(ms(gpu_us), 3),
                "kernels_per_step": round(kernels, 1), "ops_fused_away_per_step": round(removed, 1),
                "ops_launching_kernels_per_step": round(launching, 1), "host_us_per_op": round(host_per_op, 2),
                "step_ms_after_estimated": round(ms(after), 3),
                "ops": ops, "kernels": top_names(kk),
                "estimate": "a fused kernel per run moves the largest member's bytes at the run's achieved "
                            "roofline efficiency; the host keeps its cost per launched kernel for the kernels "
                            "left; the step after is the longer of GPU and host time",
            },
        ))
    return out
