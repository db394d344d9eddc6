"""shape_alignment: GEMM dimensions that tensor cores cannot tile well, and the fallback kernels
they cause.

Trigger: a tensor-core GEMM (bf16/fp16, fp8, tf32) with M, N or K not a multiple of 8 elements
(16 for 8-bit types, 4 for tf32), or a pre-Hopper fallback kernel (``cutlass_75_*``,
``cutlass_80_*``, ``sm80_*`` tiles; the roofline's ``fallback_gemm``) on a Hopper GPU.
Estimate: each such kernel would take what an *aligned* GEMM of its size (dimensions padded) and
dtype takes on this GPU: its FLOPs at the measured reference rate of :mod:`gpuprof.gemmref`
(``calibrate --gemm-table`` on this GPU via ``--gpu-spec``, else the table measured on an H200,
scaled by datasheet peak on other GPUs). Where the trace has aligned GEMMs too (at least
``MIN_STEP_PCT`` of the step), the reference is scaled by how they ran against the table
(time-weighted): the table's GEMMs were timed one call at a time, in-step ones run 1.2-1.8x faster. The reference needs no aligned twin in the trace, so a
program whose every GEMM is misaligned still gets its saving; a misaligned GEMM that already
runs at the reference rate saves nothing, whatever its shape (BERT's vocabulary 30522 vs 30528).
Only GEMMs at or above the ridge point count: the table measures compute-bound GEMMs, and a GEMV
or skinny product is bound by bytes that padding does not shrink.
A head dimension that is not a multiple of 8 also costs copies: the fused attention kernels take
whole multiples of 8, so ``scaled_dot_product_attention`` pads q, k and v (a fill of the padded
buffer and a copy into it, per tensor) and autograd un-pads and slices the gradients
(``constant_pad_nd``, ``slice_backward``, the flash backward's copies of the padded tensors). With
the head dimension aligned those kernels go (:func:`head_padding`; gpt.py's 255 and the HF Llama's
102: 0.76 and 0.98 ms per step, of the 1.12 and 0.98 ms of copies the aligned twins do not run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from gpuprof.claims import Candidate
from gpuprof.analyzers._base import gpu_side_confidence, ms, per_shape, shape_codes, top_names

from gpuprof import gemmref
from gpuprof.costmodel import gemm_mnk
from gpuprof.trace.load import parse_arg

if TYPE_CHECKING:
    from gpuprof.rank import RankView

ALIGN = {"bf16": 8, "fp16": 8, "fp8": 16, "int8": 16, "tf32": 4, "fp32": 4}
#: Below this share of the step a finding is noise (and a fixed twin must not raise it at >= 5 %).
MIN_STEP_PCT = 1.0


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def _pad_to(n: int) -> int:
    """What the fix pads a dimension to: a multiple of 64 for large sizes (whole tiles), else 8
    (the same rule, vectorised, prices the padded GEMM in ``run``)."""
    return 64 if n > 1024 else 8


def run(v: RankView) -> list[Candidate]:
    spec = v.spec
    assert spec is not None
    ref = gemmref.reference(spec)
    out: list[Candidate] = []
    k = v.kernels
    ops = v.trace.ops
    g = k[(k["family"] == "gemm") & (k["engine"] == "tensor") & np.isfinite(k["t_roof_us"])]
    if g.empty:
        return out
    codes, shapes = shape_codes(ops, g["op"].to_numpy(), gemm_mnk, by_name=True)
    # one row per distinct shape, and a last row of zeros for kernels without an op (code -1)
    table = np.array([x or (0, 0, 0, 0) for x in shapes] + [(0, 0, 0, 0)], dtype=np.int64).reshape(-1, 4)
    dims = table[codes]
    has = dims[:, 1:].min(axis=1) > 0
    dcodes, dnames = pd.factorize(g["math_dtype"].astype(object).to_numpy(), use_na_sentinel=False)
    align = np.array([ALIGN.get(str(d), 8) for d in dnames], dtype=np.int64)[dcodes]
    dtype = np.asarray(dnames, dtype=object)[dcodes]
    odd = has[:, None] & (dims[:, 1:] % align[:, None] != 0)  # M, N, K
    fallback = g["fallback_gemm"].to_numpy(dtype=bool) if "fallback_gemm" in g else np.zeros(len(g), bool)
    # The table measures compute-bound GEMMs: a GEMM below the ridge (a GEMV in decode, a skinny
    # product) is bound by its bytes, which padding does not shrink (memory_bound_decode's topic).
    ridge = np.array([spec.peak(str(d)) * 1e12 / (spec.hbm_gbps * 1e9) for d in dnames], dtype=float)[dcodes]
    dense = g["ai"].to_numpy(dtype=float) >= ridge
    mis = (odd.any(axis=1) | fallback) & has & dense
    if not mis.any():
        return out
    # The same GEMM aligned: dimensions the fix pads, at the reference rate for that size.
    mnk = dims[:, 1:]
    to = np.where(mnk > 1024, 64, 8)
    padded = np.where(odd, -(-mnk // to) * to, mnk)
    rate = _rates(ref, dtype, dims[:, 0] * padded[:, 0], padded[:, 1], padded[:, 2])
    # This run's aligned GEMMs against the table (clocks, power, the table's one-call-at-a-time
    # timing): the time-weighted ratio scales the reference; without them the table stands.
    ok = has & dense & ~mis & np.isfinite(rate)
    flops = g["flops"].to_numpy(dtype=float)
    dur_all = g["dur"].to_numpy(dtype=float)
    scale = 1.0
    if dur_all[ok].sum() / v.n_steps >= MIN_STEP_PCT / 100 * v.step_time_us:
        scale = float((flops[ok] / (rate[ok] * 1e12) * 1e6).sum() / dur_all[ok].sum())
    bad = g[mis]
    bdims, padded, rate = dims[mis], padded[mis], rate[mis] * scale
    grow = np.prod(padded.astype(float), axis=1) / np.prod(bdims[:, 1:].astype(float), axis=1)
    after = bad["flops"].to_numpy() * grow / (rate * 1e12) * 1e6
    dur = bad["dur"].to_numpy()
    after = np.maximum(after, bad["t_roof_us"].to_numpy())  # never faster than the roofline
    after = np.where(np.isfinite(after), np.minimum(after, dur), dur)
    saved = dur - after
    if saved.sum() / v.n_steps < MIN_STEP_PCT / 100 * v.step_time_us:
        return out
    i, j = np.nonzero(odd[mis])
    tally = pd.Series(saved[i]).groupby(bdims[i, 1 + j]).sum()
    dims_seen = dict(zip(tally.index.astype(int).tolist(), tally.to_numpy(dtype=float).tolist()))
    source = ref.source + (f", x {scale:.2f} (this trace's aligned GEMMs against the table)" if scale != 1.0
                           else " (no aligned GEMMs in this trace to scale it by)")
    out.append(_candidate(v, bad, saved, after, dims_seen, _vocab_sizes(ops), source, g.drop(index=bad.index),
                          head_padding(v)))
    return out


#: The head dimension the fused attention kernels take whole (PyTorch pads q/k/v to it).
SDPA_HEAD_ALIGN = 8
SDPA = "aten::scaled_dot_product_attention"


def _last_dim(dims: Any) -> int:
    first = dims[0] if isinstance(dims, list) and dims else None
    return int(first[-1]) if isinstance(first, list) and first and isinstance(first[-1], int) else 0


def head_padding(v: Any) -> pd.DataFrame:
    """The copy-family kernels (copies, fills) that pad a misaligned head dimension D for SDPA and
    un-pad its gradients to P = D rounded up to ``SDPA_HEAD_ALIGN``: under the SDPA call, each
    fill of a padded ``[..., P]`` buffer and as many ``[..., D]`` copies (the last of the call's:
    the copies that make q, k, v contiguous come first and stay); under ``constant_pad_nd`` of a
    ``[..., D]`` or ``[..., P]`` tensor; under ``slice_backward`` of a ``[..., D]`` gradient; under
    the SDPA backward, copies of ``[..., P]`` tensors. Empty where no SDPA call has a misaligned head."""
    from gpuprof.idle import outermost_aten

    k = v.kernels
    ops = v.trace.ops
    none: pd.DataFrame = k.iloc[:0]
    names = ops["name"].astype(str)
    heads = {d for d in per_shape(ops, np.flatnonzero((names == SDPA).to_numpy()), _last_dim).tolist()
             if d and d % SDPA_HEAD_ALIGN}
    if not heads:
        return none
    cand = k[(k["family"].astype(str) == "copy").to_numpy() & (k["op"].to_numpy() >= 0)]
    if cand.empty:
        return none
    inner = cand["op"].to_numpy().astype(np.int64)
    outer = outermost_aten(ops, inner)
    on = names.to_numpy()[outer]
    d_in = per_shape(ops, inner, _last_dim).reindex(inner).to_numpy(dtype=np.int64)
    d_out = per_shape(ops, outer, _last_dim).reindex(outer).to_numpy(dtype=np.int64)
    pads = {-(-d // SDPA_HEAD_ALIGN) * SDPA_HEAD_ALIGN for d in heads}
    is_d, is_p = np.isin(d_in, list(heads)), np.isin(d_in, list(pads))
    fill = cand["op_name"].astype(str).str.startswith("aten::fill").to_numpy()
    hit = (on == "aten::constant_pad_nd") & np.isin(d_out, list(heads | pads))
    hit |= (on == "aten::slice_backward") & np.isin(d_out, list(heads))
    hit |= pd.Series(on).str.contains("scaled_dot_product", regex=False).to_numpy() \
        & pd.Series(on).str.endswith("_backward").to_numpy() & is_p
    fwd = on == SDPA
    hit |= fwd & fill & is_p
    # per SDPA call, as many [..., D] copies as padded buffers it filled: the call's last ones
    call = pd.Series(outer)
    n_fill = call[fwd & fill & is_p].value_counts()
    copies = fwd & ~fill & is_d
    if copies.any():
        rank_from_end = call[copies].iloc[::-1].groupby(call[copies].iloc[::-1]).cumcount().iloc[::-1]
        keep = rank_from_end.to_numpy() < n_fill.reindex(call[copies].to_numpy()).fillna(0).to_numpy()
        idx = np.flatnonzero(copies)
        hit[idx[keep]] = True
    found: pd.DataFrame = cand[hit]
    return found


def _rates(ref: gemmref.Reference, dtype: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Reference TFLOP/s per GEMM row (a batch of GEMMs fills the GPU like more rows), looked up
    once per distinct shape."""
    keys = pd.DataFrame({"d": dtype.astype(str), "m": m, "n": n, "k": k})
    uniq = keys.drop_duplicates()
    rates = pd.Series([ref.tflops(str(d), int(a), int(b), int(c)) for d, a, b, c in uniq.itertuples(index=False)],
                      index=pd.MultiIndex.from_frame(uniq), dtype=float)
    return rates.reindex(pd.MultiIndex.from_frame(keys)).to_numpy(dtype=float)


def _candidate(v: Any, bad: pd.DataFrame, saved: np.ndarray, after: np.ndarray, dims_seen: dict[int, float],
               vocab: set[int], source: str, good: pd.DataFrame, padding: pd.DataFrame | None = None) -> Candidate:
    worst = max(dims_seen, key=lambda n: dims_seen[n]) if dims_seen else None
    what = f"dimension {worst}" + (" (the vocabulary size)" if worst in vocab else "") if worst else "GEMM shapes"
    others = [n for n in sorted(dims_seen, key=lambda n: -dims_seen[n]) if n != worst][:4]
    is_vocab = worst is not None and worst in vocab
    if worst:
        to, pad_to = _pad(worst, _pad_to(worst)), _pad_to(worst)
        also = (f"; likewise {', '.join(f'{n} → {_pad(n, _pad_to(n))}' for n in others)}" if others else "")
        if is_vocab:
            fix = (f"Pad the vocabulary {worst} to {to} (a multiple of {pad_to}: `vocab_size = {to}` in the embedding "
                   f"and output layer, and ignore the extra logits){also}, so cuBLAS can use the full-rate "
                   "tensor-core kernels")
        else:
            fix = (f"Make dimension {worst} a multiple of {pad_to} (e.g. {to}): pad the hidden, FFN or head size it "
                   f"comes from, or the batch×sequence rows{also}, so cuBLAS can use the full-rate tensor-core kernels")
    else:
        fix = "Make every GEMM dimension a multiple of 8 (16 for FP8)"
    fb = bad[bad["fallback_gemm"].to_numpy(dtype=bool)] if "fallback_gemm" in bad else bad.iloc[:0]
    roof = 100 * bad["t_roof_us"].sum() / bad["dur"].sum()
    eff = float(good["t_roof_us"].sum() / good["dur"].sum()) if good["dur"].sum() > 0 else float("nan")
    align = ALIGN.get(str(bad["math_dtype"].iloc[0]), 8)
    pad = padding if padding is not None else bad.iloc[:0]
    pad_us = float(pad["dur"].sum())
    confidence, idle_ms = gpu_side_confidence(v, (float(saved.sum()) + pad_us) / v.n_steps)
    return Candidate(
        id="GP-SHAPE-001", category="shape_alignment",
        title=f"GEMMs with {what} not a multiple of {align} run at {roof:.0f}% of the tensor-core roof"
              + (" on pre-Hopper fallback kernels, limited by on-chip memory and issue rate" if len(fb) else ""),
        confidence=confidence,
        recommendation=fix + ". Check batch×sequence and hidden sizes (d_model, FFN, heads × head_dim) the same way.",
        # the padding copies go (saved = their duration): the replay removes them with their launches
        units={**v.kernel_units(bad.index, saved), **v.kernel_units(pad.index, pad["dur"].to_numpy(dtype=float))},
        evidence={
            "rank": v.rank,
            "misaligned_dims_saving_ms_per_step": {str(n): round(ms(t) / v.n_steps, 3) for n, t in
                                                   sorted(dims_seen.items(), key=lambda x: -x[1])},
            "gemm_ms_per_step": round(ms(bad["dur"].sum()) / v.n_steps, 3),
            "estimated_ms_per_step_after": round(ms(float(np.sum(after))) / v.n_steps, 3),
            "head_dim_padding_ms_per_step": round(ms(pad_us) / v.n_steps, 3),
            "achieved_tflops": round(float(bad["flops"].sum() / (bad["dur"].sum() * 1e-6) / 1e12), 1),
            "aligned_gemm_roofline_pct_in_trace": round(100 * eff, 1) if np.isfinite(eff) else None,
            "fallback_kernels": top_names(fb) if len(fb) else [],
            "fallback_note": ("pre-Hopper mma.sync tiles stage operands through shared memory: on Hopper they "
                              "are bound by the on-chip memory pipes and issue rate (Nsight Compute: memory "
                              "~80 %, SM ~35 %), not by the tensor peak" if len(fb) else None),
            "kernels": top_names(bad),
            "vocabulary_sizes": sorted(vocab),
            "gpu_idle_ms_per_step": idle_ms,
            "estimate": f"each GEMM, padded, at the rate of an aligned GEMM of its size and dtype: {source}",
        },
    )


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
