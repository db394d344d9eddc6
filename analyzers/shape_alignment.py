"""shape_alignment: GEMM dimensions that tensor cores cannot tile well, and the fallback kernels
they cause.

Trigger: a tensor-core GEMM (bf16/fp16, fp8, tf32) with M, N or K not a multiple of 8 elements
(16 for 8-bit types, 4 for tf32), or a pre-Hopper kernel (``cutlass_75_*``, ``sm75``/``sm80``
xmma) chosen for a 16-bit GEMM on a Hopper GPU.
Estimate: the affected kernels would run at the roofline efficiency that the trace's own aligned
tensor-core GEMMs reach (time-weighted), i.e. ``after = t_roof / efficiency_aligned``. Without
aligned GEMMs to learn from, no saving is claimed.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from gpuprof.analyzers._base import Candidate, ms, shape_codes, top_names, views

from gpuprof.costmodel import gemm_mnk
from gpuprof.trace.load import parse_arg

if TYPE_CHECKING:
    from gpuprof.api import Analysis

ALIGN = {"bf16": 8, "fp16": 8, "fp8": 16, "int8": 16, "fp32": 4}
_OLD_ARCH = re.compile(r"cutlass_75|sm75_|sm80_xmma|ampere_", re.IGNORECASE)


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def run(analysis: Analysis) -> list[Candidate]:
    out = []
    hopper = any(p.get("computeMajor", 0) >= 9 for r in analysis.ranks for p in r.trace.meta.device_properties)
    for v in views(analysis):
        k = v.kernels
        ops = v.trace.ops
        g = k[(k["family"] == "gemm") & (k["engine"] == "tensor") & np.isfinite(k["t_roof_us"])]
        if g.empty:
            continue
        codes, shapes = shape_codes(ops, g["op"].to_numpy(), gemm_mnk, by_name=True)
        vocab = _vocab_sizes(ops)
        # one row per distinct shape, and a last row of zeros for kernels without an op (code -1)
        table = np.array([x or (0, 0, 0, 0) for x in shapes] + [(0, 0, 0, 0)], dtype=np.int64).reshape(-1, 4)
        dims = table[codes]
        has = np.array([x is not None for x in shapes] + [False], dtype=bool)[codes]
        dcodes, dnames = pd.factorize(g["math_dtype"].astype(object).to_numpy(), use_na_sentinel=False)
        align = np.array([ALIGN.get(str(d), 8) for d in dnames], dtype=np.int64)[dcodes]
        dtype = np.asarray(dnames, dtype=object)[dcodes]
        odd = has[:, None] & (dims[:, 1:] % align[:, None] != 0)  # M, N, K
        cats = g["name"].astype("category")
        old_arch = np.array([bool(_OLD_ARCH.search(str(n))) for n in cats.cat.categories], dtype=bool)
        fallback = hopper & old_arch[cats.cat.codes.to_numpy()] & np.isin(dtype, ["bf16", "fp16"])
        mis = odd.any(axis=1) | fallback
        if not mis.any():
            continue
        mis_rows = list(g.index[mis])
        i, j = np.nonzero(odd)  # row-major: each kernel's M, N, K in turn, as the report lists them
        seen = pd.Series(g["dur"].to_numpy()[i]).groupby(dims[i, 1 + j], sort=False).sum()
        dims_seen: dict[int, float] = dict(zip(seen.index.astype(np.int64).tolist(), seen.astype(float).tolist()))
        bad = g.loc[mis_rows]
        good = g.drop(index=mis_rows)
        eff = float(good["t_roof_us"].sum() / good["dur"].sum()) if good["dur"].sum() > 0 else np.nan
        if np.isfinite(eff) and eff > 0:
            after = np.minimum(bad["t_roof_us"] / eff, bad["dur"])
            saved = bad["dur"] - after
        else:
            after, saved = bad["dur"], bad["dur"] * 0.0
        worst = max(dims_seen, key=lambda n: dims_seen[n]) if dims_seen else None
        is_vocab = worst is not None and worst in vocab
        what = f"dimension {worst}" + (" (the vocabulary size)" if is_vocab else "") if worst else "GEMM shapes"
        pad_to = 64 if worst and worst > 1024 else 8
        if worst and is_vocab:
            fix = (f"Pad the vocabulary {worst} to {_pad(worst, pad_to)} (a multiple of {pad_to}: "
                   f"`vocab_size = {_pad(worst, pad_to)}` in the embedding and output layer, and ignore the extra "
                   "logits) so cuBLAS can use the full-rate tensor-core kernels")
        elif worst:
            fix = (f"Make dimension {worst} a multiple of {pad_to} (e.g. {_pad(worst, pad_to)}): pad the hidden, FFN "
                   "or head size it comes from, or the batch×sequence rows, so cuBLAS can use the full-rate "
                   "tensor-core kernels")
        else:
            fix = "Make every GEMM dimension a multiple of 8 (16 for FP8)"
        fallbacks = bad[bad["name"].astype(str).str.contains(_OLD_ARCH)]
        out.append(Candidate(
            id="GP-SHAPE-001", category="shape_alignment",
            title=f"GEMMs with {what} not a multiple of {ALIGN.get(str(bad['math_dtype'].iloc[0]), 8)} run at "
                  f"{100 * bad['t_roof_us'].sum() / bad['dur'].sum():.0f}% of roofline"
                  + (" on pre-Hopper fallback kernels" if len(fallbacks) else ""),
            confidence="high" if np.isfinite(eff) else "low",
            recommendation=fix + ". Check batch×sequence and hidden sizes the same way.",
            units=v.kernel_units(bad.index, saved),
            evidence={
                "rank": v.rank,
                "misaligned_dims": {str(n): round(ms(t) / v.n_steps, 3) for n, t in
                                    sorted(dims_seen.items(), key=lambda x: -x[1])},
                "gemm_ms_per_step": round(ms(bad["dur"].sum()) / v.n_steps, 3),
                "vocabulary_sizes": sorted(vocab),
                "aligned_gemm_roofline_pct": round(100 * eff, 1) if np.isfinite(eff) else None,
                "estimated_ms_per_step_after": round(ms(float(np.sum(after))) / v.n_steps, 3),
                "fallback_kernels": top_names(fallbacks) if len(fallbacks) else [],
                "kernels": top_names(bad),
                "estimate": "misaligned GEMMs would reach the roofline efficiency of this trace's aligned "
                            "tensor-core GEMMs",
            },
        ))
    return out


def _vocab_sizes(ops: pd.DataFrame) -> set[int]:
    """Row counts of embedding tables (the weight of ``aten::embedding``, ``num_weights`` of its
    backward): the only dimensions the advice calls a vocabulary. Read once per distinct recorded
    argument list."""
    out: set[int] = set()
    names = ops["name"].astype(object)
    for dims in pd.unique(ops.loc[names == "aten::embedding", "input_dims"]):
        d: Any = parse_arg(dims)
        if d and isinstance(d[0], list) and d[0]:
            out.add(int(d[0][0]))
    for conc in pd.unique(ops.loc[names == "aten::embedding_dense_backward", "concrete_inputs"]):
        c: Any = parse_arg(conc)
        if isinstance(c, list) and len(c) > 2 and str(c[2]).isdigit():
            out.add(int(c[2]))
    return out
