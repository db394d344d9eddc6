"""Classify every kernel against the GPU's roofline.

For each kernel instance: the op cost (:mod:`gpuprof.costmodel`) split over the op's kernels by
duration; the engine it ran on (tensor cores or CUDA cores, read from the kernel name); the math
dtype whose roof applies; the roofline time ``max(flops / peak, bytes / bandwidth)``; and

* ``roofline_pct`` = roofline time / measured time × 100 (how close to the roof it ran);
* ``bound``: ``latency`` when it ran far below both roofs (< ``LATENCY_PCT`` of the roofline)
  and is short (< ``SHORT_US``) or its grid fills less than one wave (fewer blocks than SMs);
  otherwise ``compute`` when its arithmetic intensity is at or above the ridge point of its
  roof, else ``memory``; ``unknown`` when no cost model applies (never an invented number).

* ``fallback_gemm``: a pre-Hopper tensor-core GEMM/conv kernel (``cutlass_75_*``, ``cutlass_80_*``,
  ``sm80_*``/``sm75_*``, ``ampere_*`` tiles, what cuBLAS picks for misaligned shapes) on a Hopper
  or newer GPU. These issue ``mma.sync`` from shared memory and are limited by the on-chip memory
  pipes and issue rate, not by the tensor peak (Nsight Compute: memory pipes ~80 %, SM ~35 %), so
  they are ``memory``-bound (``latency`` only when short), however far below the tensor roof.
* ``issue_bound``: on a Hopper or newer GPU, TensorIterator's scalar elementwise paths, which
  move one element per load/store instruction and add integer work per element: the legacy
  ``elementwise_kernel<nt, vt, ...>`` (non-contiguous or broadcast operands: an OffsetCalculator
  divides each element's index by every dimension's size, for every operand) and
  ``unrolled_elementwise_kernel`` (contiguous, but a dtype switch per element for a dynamic
  cast). At Hopper's bandwidth per instruction slot the SM's instruction issue, not DRAM, is
  their busier unit (Nsight Compute on the H200: SM 48-61 %, DRAM 13-44 %, on every one in the
  gpt samples), so they are ``compute``-bound (``latency`` when short and far below the roof);
  ``roofline_pct`` stays against their bytes, which is what a vectorised kernel would move.
  Not when an operand runs across its rows (:func:`coalesced`: an NCHW tensor with a channels-last
  one, a transposing copy): then the memory pipes, not issue, are busier (ncu: ResNet-50's mixed-
  layout ``threshold_backward``, SM 38 %, memory 86 %) and the ordinary roofline class stands.
  Their fix is the same as a memory-bound elementwise kernel's: fusion, contiguous operands,
  no mixed-dtype arithmetic.
* Layout transforms (cuDNN ``nchwToNhwcKernel``/``nhwcToNchwKernel`` around NCHW convolutions)
  take no share of their convolution's FLOPs (family ``layout``, cost unknown): they move data.

No kernel can run faster than its roofline. One that measures above ``MODEL_ERROR_PCT`` of it
(5 % above, beyond clock and timing noise) proves its cost model (or the GPU spec) wrong: it is
flagged ``model_error`` (``model_error_pct`` keeps the impossible figure), and its FLOPs, bytes
and roofline time are dropped, so it counts as ``unknown`` in class shares, MFU and coverage
rather than as a fact.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.costmodel import MATMUL_FAMILIES, TENSORLIST_ELT, kernel_elt_bytes, op_costs
from gpuprof.specs import GpuSpec
from gpuprof.trace.model import RankTrace
from gpuprof.trace.names import NAME_MEMO, text_array

LATENCY_PCT = 20.0
SHORT_US = 10.0
MODEL_ERROR_PCT = 105.0

# CUDA-core matrix kernels first: some names (sm80_xmma_gemm_f32f32_..._ffma) also match the tensor pattern.
_CUDA_CORE = re.compile(r"simt|sgemm|dgemm|_ffma|gemv|gemmSN|fmha_cutlass[FB]_f32|implicit_convolve_sgemm|"
                        r"convolve_common_engine_float|dot_kernel", re.IGNORECASE)
_TENSOR_CORE = re.compile(r"nvjet|gmma|wgmma|tensorop|hmma|imma|_mma|s1688|h1688|s16816|h16816|i8816|"
                          r"xmma_\w*(?:bf16|f16|tf32|e4m3|e5m2|i8)|flash|fmha|_sdpa_|cutlass\w*(?:bf16|f16|tf32)", re.IGNORECASE)
_TF32_NAME = re.compile(r"tf32", re.IGNORECASE)
PRE_HOPPER = re.compile(r"cutlass_75|cutlass_80|sm75_|sm80_|ampere_|turing_", re.IGNORECASE)
LAYOUT_TRANSFORM = re.compile(r"nchwToNhwc|nhwcToNchw|nchw_?to_?nhwc|nhwc_?to_?nchw", re.IGNORECASE)
# TensorIterator's scalar paths (module docstring): the legacy strided kernel and the dynamic-cast one.
SCALAR_ELEMENTWISE = re.compile(r"\bunrolled_elementwise_kernel<|(?<![\w])elementwise_kernel<\s*\d+,\s*\d+,")


def per_name(names: pd.Series, fn: Callable[[str], Any], dtype: Any = object) -> np.ndarray:
    """``fn`` of each kernel name, evaluated once per distinct name (kernel names repeat millions
    of times in big traces; the categorical codes broadcast the results)."""
    cats = names.cat.categories if hasattr(names, "cat") else pd.Index(names.unique())
    per = np.array([fn(str(n)) for n in cats], dtype=dtype)
    codes = names.cat.codes.to_numpy() if hasattr(names, "cat") else cats.get_indexer(pd.Index(names))
    return per[codes] if len(cats) else np.array([], dtype=dtype)


@functools.lru_cache(maxsize=NAME_MEMO)
def _engine(name: str) -> str:
    return "cuda" if _CUDA_CORE.search(name) else "tensor" if _TENSOR_CORE.search(name) else ""


def engine_of(names: pd.Series) -> pd.Series:
    """'tensor', 'cuda' or '' (not a matrix kernel, or not recognised) for each kernel name."""
    return pd.Series(per_name(names, _engine), index=names.index)


def coalesced(dims: Any, strides: Any) -> bool:
    """Whether an elementwise op's tensor operands all run along the same unit-stride dimension
    (aligned from the right, as broadcasting aligns them). A broadcast dimension (stride 0) or one
    of size 1 is no evidence either way; an operand with no unit-stride dimension, or two operands
    contiguous along different dimensions (an NCHW tensor with a channels-last one, a transposing
    copy: dst and src are both recorded), means one is read or written across its rows. Unknown
    (no strides recorded): True, TensorIterator's usual case."""
    if not isinstance(dims, list) or not isinstance(strides, list):
        return True
    unit: set[int] = set()
    for d, st in zip(dims, strides):
        if not (isinstance(d, list) and isinstance(st, list) and d and len(d) == len(st)
                and all(isinstance(x, int) for x in d + st)):
            continue  # a scalar, a list or no strides
        live = [i - len(d) for i, (n, x) in enumerate(zip(d, st)) if n > 1 and x != 0]
        if not live:
            continue
        ones = [i for i in live if st[i] == 1]
        if not ones:
            return False
        unit.add(ones[-1])
    return len(unit) <= 1


def _coalesced_ops(ops: pd.DataFrame, op: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """:func:`coalesced` of each wanted kernel's op, evaluated once per distinct op signature."""
    from gpuprof.trace.load import parse_arg

    out = np.ones(len(op), dtype=bool)
    rows = op[wanted & (op >= 0)]
    if not len(rows) or not len(ops) or "input_strides" not in ops:
        return out
    uniq = np.unique(rows)
    dims, strides = ops["input_dims"].to_numpy()[uniq], ops["input_strides"].to_numpy()[uniq]
    memo: dict[tuple[Any, Any], bool] = {}

    def of(d: Any, s: Any) -> bool:
        if (d, s) not in memo:  # looked up before parsing: ops repeat a few signatures thousands of times
            memo[d, s] = coalesced(parse_arg(d) if isinstance(d, (bytes, str)) else None,
                                   parse_arg(s) if isinstance(s, (bytes, str)) else None)
        return memo[d, s]

    per = np.array([of(d, s) for d, s in zip(dims, strides)], dtype=bool)
    hit = wanted & (op >= 0)
    out[hit] = per[np.searchsorted(uniq, op[hit])]
    return out


def _hopper(trace: RankTrace, spec: GpuSpec | None) -> bool:
    """Hopper or newer NVIDIA (compute capability 9+), from the spec or the trace's device."""
    arch = spec.arch if spec is not None else ""
    if arch and arch[0].isdigit():
        return float(arch.split(".")[0]) >= 9
    return any(int(p.get("computeMajor", 0) or 0) >= 9 for p in trace.meta.device_properties)


def classify(trace: RankTrace, spec: GpuSpec | None) -> pd.DataFrame:
    """One row per kernel of ``trace.kernels`` (same index) with the roofline columns."""
    k = trace.kernels
    ops = trace.ops
    op = k["op"].to_numpy()
    costs = op_costs(ops, op) if len(ops) else pd.DataFrame(  # no CPU ops: the columns, typed, of none
        {"flops": pd.Series(dtype=float), "bytes": pd.Series(dtype=float), "dtype": pd.Series(dtype=object),
         "family": pd.Series(dtype=object), "elt_assumed": pd.Series(dtype=bool)})
    has = op >= 0
    layout = per_name(k["name"], lambda n: bool(LAYOUT_TRANSFORM.search(n)), dtype=bool)
    # Split an op's FLOPs and bytes over its kernels by duration (split-K GEMM + reduce, etc.).
    dur_shared = np.where(layout, 0.0, k["dur"].to_numpy())
    op_time = pd.Series(dur_shared, index=k.index).groupby(k["op"]).transform("sum").to_numpy()
    share = np.where(has & (op_time > 0) & ~layout, dur_shared / np.where(op_time > 0, op_time, 1), np.nan)
    # float even when no op had a cost (a GPU-only trace: the empty frame's columns are object)
    flops = costs["flops"].reindex(op).to_numpy(dtype=float) * share
    nbytes = costs["bytes"].reindex(op).to_numpy(dtype=float) * share
    # TensorList bytes were counted at an assumed element size: the kernel's name may state the real one.
    assumed = costs["elt_assumed"].reindex(op).fillna(False).to_numpy(dtype=bool)
    if assumed.any():
        elt = per_name(k["name"], kernel_elt_bytes, dtype=float)
        nbytes = np.where(assumed & np.isfinite(elt), nbytes * elt / TENSORLIST_ELT, nbytes)
    dtype = costs["dtype"].reindex(op).to_numpy()
    family = np.where(layout, "layout", costs["family"].reindex(op).to_numpy().astype(object))
    op_name: Any = np.where(has, ops["name"].astype(object).to_numpy()[np.maximum(op, 0)] if len(ops) else None, None)

    engine = engine_of(k["name"]).to_numpy()
    matmul = np.isin(family.astype(str), MATMUL_FAMILIES)
    dt = dtype.astype(str)
    math_dtype = np.where(
        matmul,
        np.where(engine == "cuda", np.where(dt == "fp64", "fp64", "fp32"),
                 np.where(dt == "fp32", "tf32", np.where(dt == "fp64", "fp64_tc", dt))),
        "fp32",
    )
    # An fp32 GEMM on an unrecognised kernel runs on CUDA cores unless its name says TF32.
    tf32_named = per_name(k["name"], lambda n: bool(_TF32_NAME.search(n)), dtype=bool)
    math_dtype = np.where(matmul & (engine == "") & (dt == "fp32") & ~tf32_named, "fp32", math_dtype)
    math_dtype = np.where(has & pd.notna(dtype), math_dtype, np.full(len(math_dtype), None, dtype=object))

    out = pd.DataFrame(index=k.index)
    out["op_name"] = text_array(op_name)
    out["family"] = text_array(family)
    out["dtype"] = text_array(dtype)
    out["engine"] = text_array(engine)
    out["math_dtype"] = text_array(math_dtype)
    out["flops"] = flops
    out["bytes"] = nbytes
    if spec is None:
        out["peak_tflops"] = np.nan
        out["t_roof_us"] = np.nan
    else:
        peak_of = {d: spec.peak(d) for d in set(math_dtype) if isinstance(d, str)}  # a few distinct dtypes
        codes, uniq = pd.factorize(math_dtype)
        peak_u = np.array([peak_of.get(d, np.nan) for d in uniq], dtype=float)
        peak = np.where(codes >= 0, peak_u[np.maximum(codes, 0)] if len(uniq) else np.nan, np.nan)
        out["peak_tflops"] = peak
        t_compute = flops / (peak * 1e12) * 1e6
        t_memory = nbytes / (spec.hbm_gbps * 1e9) * 1e6
        out["t_roof_us"] = np.fmax(t_compute, t_memory)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["ai"] = flops / nbytes
        dur = k["dur"].to_numpy()
        out["achieved_tflops"] = np.where(dur > 0, flops / (dur * 1e-6) / 1e12, np.nan)
        out["achieved_gbps"] = np.where(dur > 0, nbytes / (dur * 1e-6) / 1e9, np.nan)
        out["roofline_pct"] = np.where(dur > 0, out["t_roof_us"].to_numpy() / dur * 100.0, np.nan)
    error = out["roofline_pct"].to_numpy() > MODEL_ERROR_PCT
    out["model_error"] = error
    out["model_error_pct"] = np.where(error, out["roofline_pct"].to_numpy(), np.nan)
    if error.any():
        for c in ("flops", "bytes", "t_roof_us", "ai", "achieved_tflops", "achieved_gbps", "roofline_pct"):
            out[c] = np.where(error, np.nan, out[c].to_numpy())
    ridge = out["peak_tflops"].to_numpy() * 1e12 / ((spec.hbm_gbps if spec else np.nan) * 1e9)
    known = np.isfinite(out["t_roof_us"].to_numpy()) & np.isfinite(out["ai"].to_numpy())
    blocks = k["blocks"].to_numpy()
    sms = spec.sm_count if spec and spec.sm_count else 0
    short = k["dur"].to_numpy() < SHORT_US
    small = short | ((blocks > 0) & (blocks < sms))
    hopper = _hopper(trace, spec)
    fallback = hopper & (engine == "tensor") & np.isin(family.astype(str), ("gemm", "conv")) & per_name(
        k["name"], lambda n: bool(PRE_HOPPER.search(n)), dtype=bool)
    out["fallback_gemm"] = fallback
    # A fallback kernel's distance from the tensor roof says nothing about latency: only being short does.
    latency = known & (out["roofline_pct"].to_numpy() < LATENCY_PCT) & np.where(fallback, short, small)
    scalar = hopper & known & ~latency & ~matmul & per_name(k["name"], lambda n: bool(SCALAR_ELEMENTWISE.search(n)),
                                                            dtype=bool)
    issue = scalar & _coalesced_ops(ops, op, scalar)
    out["issue_bound"] = issue
    bound = np.where(~known, "unknown", np.where(latency, "latency", np.where(
        issue, "compute", np.where(fallback | (out["ai"].to_numpy() < ridge), "memory", "compute"))))
    out["bound"] = pd.Categorical(bound, categories=["compute", "memory", "latency", "unknown"])
    out["cls"] = np.where(k["is_comm"].to_numpy(), "communication", bound)
    return out
