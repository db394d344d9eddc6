"""Classify every kernel against the GPU's roofline.

For each kernel instance: the op cost (:mod:`gpuprof.costmodel`) split over the op's kernels by
duration; the engine it ran on (tensor cores or CUDA cores, read from the kernel name); the math
dtype whose roof applies; the roofline time ``max(flops / peak, bytes / bandwidth)``; and

* ``roofline_pct`` = roofline time / measured time × 100 (how close to the roof it ran);
* ``bound``: ``latency`` when it ran far below both roofs (< ``LATENCY_PCT`` of the roofline)
  and is short (< ``SHORT_US``) or its grid fills less than one wave (fewer blocks than SMs);
  otherwise ``compute`` when its arithmetic intensity is at or above the ridge point of its
  roof, else ``memory``; ``unknown`` when no cost model applies (never an invented number).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.costmodel import MATMUL_FAMILIES, op_costs
from gpuprof.specs import GpuSpec
from gpuprof.trace.model import RankTrace

LATENCY_PCT = 20.0
SHORT_US = 10.0

# CUDA-core matrix kernels first: some names (sm80_xmma_gemm_f32f32_..._ffma) also match the tensor pattern.
_CUDA_CORE = re.compile(r"simt|sgemm|dgemm|_ffma|gemv|gemmSN|fmha_cutlass[FB]_f32|implicit_convolve_sgemm|"
                        r"convolve_common_engine_float|dot_kernel", re.IGNORECASE)
_TENSOR_CORE = re.compile(r"nvjet|gmma|wgmma|tensorop|hmma|imma|_mma|s1688|h1688|s16816|h16816|i8816|"
                          r"xmma_\w*(?:bf16|f16|tf32|e4m3|e5m2|i8)|flash|fmha|_sdpa_|cutlass\w*(?:bf16|f16|tf32)", re.IGNORECASE)
_TF32_NAME = re.compile(r"tf32", re.IGNORECASE)


def per_name(names: pd.Series, fn: Callable[[str], Any], dtype: Any = object) -> np.ndarray:
    """``fn`` of each kernel name, evaluated once per distinct name (kernel names repeat millions
    of times in big traces; the categorical codes broadcast the results)."""
    cats = names.cat.categories if hasattr(names, "cat") else pd.Index(names.unique())
    per = np.array([fn(str(n)) for n in cats], dtype=dtype)
    codes = names.cat.codes.to_numpy() if hasattr(names, "cat") else cats.get_indexer(pd.Index(names))
    return per[codes] if len(cats) else np.array([], dtype=dtype)


def engine_of(names: pd.Series) -> pd.Series:
    """'tensor', 'cuda' or '' (not a matrix kernel, or not recognised) for each kernel name."""
    return pd.Series(per_name(names, lambda n: "cuda" if _CUDA_CORE.search(n) else
                              "tensor" if _TENSOR_CORE.search(n) else ""), index=names.index)


def classify(trace: RankTrace, spec: GpuSpec | None) -> pd.DataFrame:
    """One row per kernel of ``trace.kernels`` (same index) with the roofline columns."""
    k = trace.kernels
    ops = trace.ops
    op = k["op"].to_numpy()
    # A GPU-only trace has no ops: empty costs, but with float columns (object NaN breaks isfinite below).
    costs = op_costs(ops, op) if len(ops) else pd.DataFrame({"flops": pd.Series(dtype=float), "bytes": pd.Series(
        dtype=float), "dtype": pd.Series(dtype=object), "family": pd.Series(dtype=object)})
    has = op >= 0
    # Split an op's FLOPs and bytes over its kernels by duration (split-K GEMM + reduce, etc.).
    op_time = k.groupby("op")["dur"].transform("sum").to_numpy()
    share = np.where(has & (op_time > 0), k["dur"].to_numpy() / np.where(op_time > 0, op_time, 1), np.nan)
    flops = costs["flops"].reindex(op).to_numpy() * share
    nbytes = costs["bytes"].reindex(op).to_numpy() * share
    dtype = costs["dtype"].reindex(op).to_numpy()
    family = costs["family"].reindex(op).to_numpy()
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
    out["op_name"] = op_name
    out["family"] = family
    out["dtype"] = dtype
    out["engine"] = engine
    out["math_dtype"] = math_dtype
    out["flops"] = flops
    out["bytes"] = nbytes
    if spec is None:
        out["peak_tflops"] = np.nan
        out["t_roof_us"] = np.nan
    else:
        peak_of = {d: spec.peak(d) for d in set(math_dtype) if isinstance(d, str)}  # a few distinct dtypes
        peak = pd.Series(math_dtype, dtype=object).map(peak_of).to_numpy(dtype=float)
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
    ridge = out["peak_tflops"].to_numpy() * 1e12 / ((spec.hbm_gbps if spec else np.nan) * 1e9)
    known = np.isfinite(out["t_roof_us"].to_numpy()) & np.isfinite(out["ai"].to_numpy())
    blocks = k["blocks"].to_numpy()
    sms = spec.sm_count if spec and spec.sm_count else 0
    small = (k["dur"].to_numpy() < SHORT_US) | ((blocks > 0) & (blocks < sms))
    latency = known & (out["roofline_pct"].to_numpy() < LATENCY_PCT) & small
    bound = np.where(~known, "unknown", np.where(latency, "latency",
                     np.where(out["ai"].to_numpy() >= ridge, "compute", "memory")))
    out["bound"] = pd.Categorical(bound, categories=["compute", "memory", "latency", "unknown"])
    out["cls"] = np.where(k["is_comm"].to_numpy(), "communication", bound)
    return out
