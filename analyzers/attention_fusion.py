"""attention_fusion: attention computed as separate matmul / mask / softmax / dropout kernels that
write and read a B×H×T×T score tensor.

Trigger: a softmax over a tensor whose last two dimensions are equal (T×T, T ≥ 64). Part of the
unfused attention: every kernel whose op, or the outermost aten op it runs under (``aten::matmul``
over the ``aten::bmm`` and the copies that make its operands contiguous), has such a tensor among
its arguments or is a matmul producing one (QKᵀ, and dY·Vᵀ in backward: ``[..., T, K] @ [..., K, T]``;
Kineto records input shapes only), plus the boolean T×T mask's own ops (``~mask``): the scaling,
mask, softmax, dropout, both matmuls and their backward. SDPA does all of it in one kernel (a few
in backward).
Estimate: fused attention (``F.scaled_dot_product_attention``) keeps the matmul FLOPs (halved
when the trace shows the attention is causal: ``_causal_evidence``) and drops the T×T traffic; its
time is those FLOPs at the share of the peak the attention's own unfused matmuls reach (the same
per-head shapes; the roofline efficiency of the trace's other tensor-core GEMMs where it has none). FlashAttention's
backward recomputes QKᵀ (7 matmuls where the unfused step runs 6) and a causal mask skips whole
tiles only: gpt_manual_attn's fused twin ran 0.64 ms per step where this gives 0.33. Saving = the affected kernels' time minus
that, plus the launch gaps before them (two fused kernels replace dozens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from gpuprof.claims import Candidate
from gpuprof.analyzers._base import ms, per_shape, shape_codes, top_names
from gpuprof.idle import outermost_aten

from gpuprof.trace.load import parse_arg

if TYPE_CHECKING:
    from gpuprof.rank import RankView

SOFTMAX = ("aten::_softmax", "aten::_softmax_backward_data", "aten::_safe_softmax")
MASK = ("aten::masked_fill", "aten::masked_fill_", "aten::where", "aten::add")
#: Ops that build a causal mask: lower/upper triangles.
TRIANGLE = ("aten::tril", "aten::triu", "aten::tril_", "aten::triu_")
#: Ops that apply a boolean mask, and which argument holds it.
MASK_FILL = {"aten::masked_fill": 1, "aten::masked_fill_": 1, "aten::where": 0}


def _causal_evidence(ops: Any, t: int) -> str | None:
    """Why the attention is causal, or None when the trace does not show it: a triangle op
    (``tril``/``triu``) on an n×n tensor with n >= T (masks are often built for the longest
    sequence and sliced), a boolean T×T mask the same for every sequence of the batch (leading
    dims 1 or broadcast with stride 0; a padding mask varies by sequence), or an SDPA call whose
    ``is_causal`` argument is True. An additive mask (``aten::add``) says nothing about causality."""
    names = ops["name"].astype(object)

    def square(dims: Any, at: int, at_least: bool) -> bool:
        if not isinstance(dims, list) or len(dims) <= at or not isinstance(dims[at], list) or len(dims[at]) < 2:
            return False
        d = dims[at]
        return bool(d[-1] == d[-2] and (d[-1] >= t if at_least else d[-1] == t))

    tri = ops[names.isin(TRIANGLE).to_numpy()]
    for name, dims in per_shape(tri, range(len(tri)), lambda n, d: (n, square(d, 0, True)), by_name=True).tolist():
        if dims:
            return f"{name} on a square tensor"
    for name, at in MASK_FILL.items():
        m = ops[(names == name).to_numpy()]
        if m.empty:
            continue
        rows = m.drop_duplicates(["input_dims", "input_types", "input_strides"])
        for dims, types, strides in zip(rows["input_dims"], rows["input_types"], rows["input_strides"]):
            d, ty, st = parse_arg(dims), parse_arg(types), parse_arg(strides)
            if not (square(d, at, False) and isinstance(ty, list) and len(ty) > at and ty[at] == "bool"):
                continue
            lead, lead_st = d[at][:-2], (st[at][:-2] if isinstance(st, list) and len(st) > at
                                          and isinstance(st[at], list) else [])
            if all(x == 1 or (i < len(lead_st) and lead_st[i] == 0) for i, x in enumerate(lead)):
                return f"{name} with a {t}x{t} boolean mask shared by every sequence"
    sdpa = ops[names.str.contains("scaled_dot_product", regex=False).to_numpy()]
    for conc in sdpa["concrete_inputs"].drop_duplicates():
        c = parse_arg(conc)
        if isinstance(c, list) and len(c) > 5 and str(c[5]) == "True":
            return "is_causal=True on the SDPA call"
    return None


def _square(dims: Any) -> int:
    """T if any tensor argument is [..., T, T] with rank ≥ 3 and T ≥ 64, else 0."""
    if not isinstance(dims, list):
        return 0
    for d in dims:
        if isinstance(d, list) and len(d) >= 3 and all(isinstance(x, int) for x in d) and d[-1] == d[-2] >= 64:
            return int(d[-1])
    return 0


#: Batched matmuls and where their two matrix operands are among the op's inputs.
MATMUL_OPERANDS = {"aten::matmul": (0, 1), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}


def _score_product(name: str, dims: Any) -> int:
    """T when ``name`` is a batched matmul whose product is a ``[..., T, T]`` score tensor
    (``[..., T, K] @ [..., K, T]``, rank ≥ 3, T ≥ 64), else 0."""
    at = MATMUL_OPERANDS.get(name)
    if at is None or not isinstance(dims, list) or len(dims) <= max(at):
        return 0
    a, b = dims[at[0]], dims[at[1]]
    if not (isinstance(a, list) and isinstance(b, list) and len(a) >= 3 and len(b) >= 3
            and all(isinstance(x, int) for x in (*a, *b))):
        return 0
    return int(a[-2]) if a[-2] == b[-1] >= 64 and a[-1] == b[-2] else 0


def _attention_t(ops: Any, rows: np.ndarray) -> np.ndarray:
    """Per op row in ``rows`` (-1: none): T where the op has a T×T score among its arguments or is
    a matmul producing one, else 0."""
    codes, sq = shape_codes(ops, rows, _square)
    pcodes, prod = shape_codes(ops, rows, _score_product, by_name=True)
    out: np.ndarray = np.maximum(np.array([*sq, 0], dtype=np.int64)[codes],
                                 np.array([*prod, 0], dtype=np.int64)[pcodes])
    return out


def _mask_ops(ops: Any, rows: np.ndarray, t: int) -> np.ndarray:
    """Whether each op row of ``rows`` takes a 2-D boolean T×T tensor (``~mask[:t, :t]``): the
    causal mask's own ops, which SDPA with ``is_causal`` does not run. Boolean only: a 2-D T×T
    of another type can be a d×d weight where d_model == T."""
    ok = (rows >= 0) & (rows < len(ops))
    out = np.zeros(len(rows), dtype=bool)
    if not ok.any():
        return out
    sub = ops.iloc[rows[ok]]
    key = sub["input_dims"].astype(str) + "|" + sub["input_types"].astype(str)
    first = ~key.duplicated().to_numpy()
    hit = {}
    for k_, dims, types in zip(key[first], sub["input_dims"][first], sub["input_types"][first]):
        d, ty = parse_arg(dims), parse_arg(types)
        hit[k_] = bool(isinstance(d, list) and isinstance(ty, list) and any(
            isinstance(x, list) and x == [t, t] and i < len(ty) and ty[i] == "bool" for i, x in enumerate(d)))
    out[ok] = key.map(hit).to_numpy(dtype=bool)
    return out


def run(v: RankView) -> list[Candidate]:
    spec = v.spec
    assert spec is not None
    out: list[Candidate] = []
    k = v.kernels
    ops = v.trace.ops
    inner = k["op"].to_numpy().astype(np.int64)
    codes, sq = shape_codes(ops, inner, _square)
    k_sq = pd.Series(np.array([*sq, 0], dtype=np.int64)[codes], index=k.index)  # code -1 (no op): 0
    names = k["op_name"].astype(str)
    soft = names.isin(SOFTMAX) & (k_sq > 0)
    if not soft.any():
        return out
    t = int(k_sq[soft].mode().to_numpy()[0])
    outer = inner.copy()
    outer[inner >= 0] = outermost_aten(ops, inner[inner >= 0])
    k_t = np.maximum(_attention_t(ops, inner), _attention_t(ops, outer))
    in_attn = (k_t > 0) | _mask_ops(ops, inner, t)
    attn = k[in_attn]
    why_causal = _causal_evidence(ops, t)
    causal = why_causal is not None
    masked = bool((attn["op_name"].astype(str).isin(MASK)).any())
    gemm = attn[attn["family"] == "gemm"]
    others = k[(k["family"] == "gemm") & (k["engine"] == "tensor") & ~k.index.isin(attn.index)
               & np.isfinite(k["t_roof_us"])]
    # The fused kernel runs the same per-head matmuls (T×T×head_dim tiles): the rate the
    # attention's own unfused matmuls reach is the measure; the model's large linear GEMMs run
    # several times closer to the peak (gpt_manual_attn: 0.18 against 0.72 of it). Their FLOP
    # rate, not their roofline time: the unfused QKᵀ is bound by writing the T×T scores
    dtype = str(gemm["math_dtype"].mode().iat[0]) if len(gemm) else "bf16"
    own = gemm[(gemm["engine"] == "tensor") & (gemm["flops"] > 0)]
    if own["dur"].sum() > 0:
        eff = min(1.0, float(own["flops"].sum()) / (float(own["dur"].sum()) * 1e-6) / (spec.peak(dtype) * 1e12))
    else:
        eff = float(others["t_roof_us"].sum() / others["dur"].sum()) if others["dur"].sum() > 0 else 1.0
    flops = float(gemm["flops"].sum()) * (0.5 if causal else 1.0)
    fused_us = flops / (spec.peak(dtype) * 1e12 * eff) * 1e6
    total = float(attn["dur"].sum())
    # Spread the fused time over the affected kernels in proportion to their duration.
    saved = attn["dur"] * max(0.0, 1.0 - fused_us / total) if total > 0 else attn["dur"] * 0
    if causal:
        call = "`F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)`"
    elif masked:
        call = ("`F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)` (pass the mask you "
                "apply today; `is_causal=True` only if it is the causal triangle)")
    else:
        call = "`F.scaled_dot_product_attention(q, k, v, dropout_p=p)` (no mask: keep it unmasked)"
    out.append(Candidate(
        id="GP-ATTN-001", category="attention_fusion",
        title=f"Unfused attention: {len(attn) // v.n_steps} kernels per step read and write {t}×{t} score "
              f"tensors ({100 * total / v.n_steps / v.step_time_us:.0f}% of step time)",
        confidence="high" if len(others) else "medium",
        recommendation=f"Replace the matmul/mask/softmax/dropout attention with {call} "
                       "(FlashAttention/cuDNN kernels; no T×T tensor in memory; same results).",
        units={**v.kernel_units(attn.index, saved), **v.inner_gap_units(attn.index)},
        evidence={
            "rank": v.rank, "sequence_length": t, "causal_mask_seen": causal,
            "causal_evidence": why_causal, "mask_seen": masked,
            "unfused_ms_per_step": round(ms(total) / v.n_steps, 3),
            "estimated_fused_ms_per_step": round(ms(fused_us) / v.n_steps, 3),
            "gemm_efficiency_used": round(eff, 3),
            "ops": attn["op_name"].astype(str).value_counts().head(8).to_dict(),
            "kernels": top_names(attn),
            "estimate": "fused attention = the attention matmul FLOPs (halved if causal) at the roofline "
                        "efficiency of the attention's own unfused matmuls (their FLOP rate over the peak)",
        },
    ))
    return out
