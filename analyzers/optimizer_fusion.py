"""optimizer_fusion: an optimizer that launches kernels per parameter instead of over all of them.

Trigger: an ``Optimizer.step#...`` span launching at least ``MIN_KERNELS`` kernels per step,
most of them from per-tensor ops (not ``_foreach_*`` or ``_fused_*``).
Estimate: a fused optimizer reads parameters, gradients and state once and writes parameters and
state once: ``bytes_per_param`` × parameters (7 × 4 B for Adam/AdamW in FP32, 5 × 4 B for SGD with
momentum), at the roofline efficiency this trace's large memory-bound kernels reach. Saving =
the optimizer's kernel time and launch gaps minus that. The parameter count is the total size of
the first argument of the per-parameter op that runs once per parameter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from gpuprof.claims import Candidate
from gpuprof.analyzers._base import ms, per_shape, top_names

from gpuprof.costmodel import _numel

if TYPE_CHECKING:
    from gpuprof.rank import RankView

MIN_KERNELS = 20


def run(v: RankView) -> list[Candidate]:
    spec = v.spec
    assert spec is not None
    out: list[Candidate] = []
    k = v.kernels[v.in_optimizer()]
    if len(k) / v.n_steps < MIN_KERNELS:
        return out
    names = k["op_name"].astype(str)
    per_tensor = ~names.str.contains("_foreach_|_fused_|multi_tensor", regex=True)
    if per_tensor.mean() < 0.5:
        return out
    ops = v.trace.ops
    counts = names.value_counts() / v.n_steps
    modes = counts[np.isfinite(counts) & (counts > 0)].mode()
    if modes.empty:  # no per-parameter op repeats within a step: nothing to count parameters by
        return out
    n_params_guess = int(modes.to_numpy()[0])  # most per-parameter ops run once per parameter
    candidates = counts[counts == n_params_guess].index
    params = 0
    for name in candidates:  # the once-per-parameter op with the largest first argument
        rows = k.loc[names == name, "op"].unique()
        total = float(per_shape(ops, rows, lambda d: _numel(_first(d))).sum()) / v.n_steps
        params = max(params, int(total))
    opt_name = _optimizer_name(v.trace.annotations)
    per_param = 5 * 4 if "SGD" in opt_name else 7 * 4
    # Fallback GEMMs are memory-bound on on-chip memory, not HBM: their roof is no bandwidth reference.
    big = v.kernels[(v.kernels["bound"] == "memory") & (v.kernels["dur"] >= 20) & np.isfinite(v.kernels["t_roof_us"])
                    & ~v.kernels["fallback_gemm"].to_numpy(dtype=bool)]
    eff = float(big["t_roof_us"].sum() / big["dur"].sum()) if big["dur"].sum() > 0 else 1.0
    fused_us = params * per_param / (spec.hbm_gbps * 1e9) / max(eff, 1e-3) * 1e6 * v.n_steps
    # the fused kernels' time spread over the kernels they replace; the launch gaps between
    # those go (the replay fuses each run into one kernel, gpuprof.replay.fixes)
    kernel_us = float(k["dur"].sum())
    keep = max(0.0, 1.0 - fused_us / kernel_us) if kernel_us > 0 else 0.0
    units = {**v.kernel_units(k.index, k["dur"] * keep), **v.inner_gap_units(k.index)}
    out.append(Candidate(
        id="GP-OPT-001", category="optimizer_fusion",
        title=f"{opt_name or 'The optimizer'} launches {len(k) / v.n_steps:.0f} kernels per step, "
              f"one set per parameter ({n_params_guess} parameters)",
        confidence="high" if params else "medium",
        recommendation=f"Use the fused implementation: `torch.optim.{opt_name.split('.')[0] or 'AdamW'}"
                       "(params, ..., fused=True)` (or `foreach=True`), which updates all parameters in a "
                       "few multi-tensor kernels.",
        units=units,
        evidence={
            "rank": v.rank, "optimizer": opt_name, "kernels_per_step": round(len(k) / v.n_steps, 1),
            "parameters": params, "parameter_tensors": n_params_guess,
            "optimizer_ms_per_step": round(ms(kernel_us) / v.n_steps, 3),
            "estimated_fused_ms_per_step": round(ms(fused_us) / v.n_steps, 3),
            "memory_roofline_efficiency_used": round(eff, 3),
            "ops_per_step": {n: round(c, 1) for n, c in counts.head(8).items()},
            "kernels": top_names(k),
            "estimate": f"fused: {per_param} B per parameter at the memory efficiency of this trace's "
                        "large memory-bound kernels",
        },
    ))
    return out


def _first(dims: Any) -> Any:
    return dims[0] if isinstance(dims, list) and dims else None


def _optimizer_name(annotations: Any) -> str:
    a = annotations[annotations["name"].astype(str).str.startswith("Optimizer.step#")]
    if a.empty:
        return ""
    return str(a["name"].iloc[0]).split("#", 1)[1].split(".")[0]
