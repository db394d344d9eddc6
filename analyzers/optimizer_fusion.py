"""optimizer_fusion: an optimizer that launches kernels per parameter instead of over all of them.

Trigger: at least ``MIN_KERNELS`` kernels per step, most of them from per-tensor ops (not
``_foreach_*`` or ``_fused_*``), launched by the optimizer: inside an ``Optimizer.step#...`` span
(torch.optim annotates its steps), or, where no optimizer annotated them, by a per-parameter update
loop (:func:`gpuprof.hostops.update_loops`: after backward, the same few elementwise ops once per
parameter, whatever launched them: a hand-written momentum SGD over ``model.parameters()``).
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
    loop = None
    if len(k) / v.n_steps < MIN_KERNELS:
        # no optimizer annotated these steps' updates: read the ops (a loop in the user's Python)
        k = v.kernels[v.in_update_loop()]
        loop = v.update_loops()
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
    opt_name = _optimizer_name(v.trace.annotations) if loop is None else ""
    pattern = str(loop["pattern"].mode().iat[0]) if loop is not None else ""
    # Adam's update takes square roots and divides by them; a loop without is momentum SGD
    adam = any(x in pattern for x in ("sqrt", "addcdiv", "lerp", "addcmul"))
    per_param = 7 * 4 if (adam or (loop is None and "SGD" not in opt_name)) else 5 * 4
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
    seen: dict[str, Any] = {}
    if loop is not None:
        reps = int(loop["repeats"].median())
        kind = "Adam" if adam else "SGD"
        title = (f"A per-parameter update loop after backward launches {len(k) / v.n_steps:.0f} kernels per step: "
                 f"the same {int(loop['period'].median())} ops ({pattern}) once for each of {reps} parameters, "
                 "with no torch.optim annotation")
        fix = (f"Update all parameters in a few multi-tensor kernels: `torch.optim.{kind}(model.parameters(), ..., "
               "foreach=True)` (or `fused=True`) instead of a Python loop over the parameters, or the same update "
               "with `torch._foreach_*` ops over the parameter lists.")
        seen = {"seen": f"no Optimizer.step annotation; after the last autograd op of each step, one thread ran "
                        f"the ops [{pattern}] {reps} times over inputs of different shapes (one set per "
                        f"parameter), launching {len(k) / v.n_steps:.0f} kernels per step",
                "update_loops_per_step": round(len(loop) / v.n_steps, 2), "ops_per_parameter": pattern,
                "update_rule_assumed": f"{kind} ({per_param} B per parameter fused)"}
    else:
        title = (f"{opt_name or 'The optimizer'} launches {len(k) / v.n_steps:.0f} kernels per step, "
                 f"one set per parameter ({n_params_guess} parameters)")
        fix = (f"Use the fused implementation: `torch.optim.{opt_name.split('.')[0] or 'AdamW'}"
               "(params, ..., fused=True)` (or `foreach=True`), which updates all parameters in a "
               "few multi-tensor kernels.")
    out.append(Candidate(
        id="GP-OPT-001", category="optimizer_fusion",
        title=title,
        confidence="high" if params else "medium",
        recommendation=fix,
        units=units,
        evidence={**seen,
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
