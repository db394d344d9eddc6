"""The report's documents as plain data: the JSON report (:func:`to_dict`, schema_version 1) and
what the HTML page draws beyond it (:func:`detail`: per-step time by class, the GPU's roofs, NVML
series, the timeline, operators and memory views). Reports format these and compute nothing new.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

import gpuprof
from gpuprof.analysis import Result
from gpuprof.claims import LOW_CONFIDENCE_WEIGHT, NEGLIGIBLE_PCT, RANKING, ranked_saving_ms
from gpuprof.pricing import finite
from gpuprof.rank import RankResult

SCHEMA_VERSION = 1


def clean(d: Any) -> Any:
    """``d`` with numpy numbers as Python ones and every non-finite float as None (JSON null)."""
    if isinstance(d, dict):
        return {k: clean(v) for k, v in d.items()}
    if isinstance(d, list):
        return [clean(v) for v in d]
    if isinstance(d, (float, np.floating)):
        return finite(d)
    if isinstance(d, np.integer):
        return int(d)
    return d


def to_dict(result: Result) -> dict[str, Any]:
    """The JSON report's document (schema_version 1)."""
    spec = result.spec
    meta = result.parts[0].meta
    table = result.kernel_table
    rank_steps = sum(p.n_steps for p in result.parts)  # total_us is summed over every rank's profiled steps
    kernels = [
        {"name": r["name"], "count": int(r["count"]), "total_us": finite(r["total_us"]),
         "ms_per_step": finite(r["total_us"] / 1000.0 / rank_steps), "flops": finite(r["flops"]),
         "bytes": finite(r["bytes"]), "achieved_tflops": finite(r["achieved_tflops"]),
         "achieved_gbps": finite(r["achieved_gbps"]), "bound": str(r["bound"]),
         "roofline_pct": finite(r["roofline_pct"]),
         "cost_model_error": bool(r["cost_model_error"]),
         "cost_model_error_count": int(r["cost_model_error_count"]),
         "cost_model_error_pct": finite(r["cost_model_error_pct"]),
         "engine": r["engine"] or None,
         "math_dtype": r["math_dtype"] if isinstance(r["math_dtype"], str) else None,
         "op": r["op"] if isinstance(r["op"], str) else None,
         "shapes": r["shapes"] if isinstance(r["shapes"], str) else None}
        for r in table.to_dict("records")
    ]
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "gpuprof", "version": gpuprof.__version__},
        "source": {"paths": [p.meta.path for p in result.parts], "run_folder": result.folder,
                   "ranks": [p.rank for p in result.parts],
                   "world_size": meta.world_size, "time_origin": meta.time_origin},
        "gpu": {
            "name": spec.name if spec else (meta.gpu_name or "unknown"),
            "device_name": meta.gpu_name,
            "spec": {
                "fp32_tflops": finite(spec.peak("fp32")) if spec else None,
                "tf32_tflops": finite(spec.peaks_tflops.get("tf32")) if spec else None,
                "bf16_tflops": finite(spec.peaks_tflops.get("bf16")) if spec else None,
                "fp8_tflops": finite(spec.peaks_tflops.get("fp8")) if spec else None,
                "hbm_gbps": finite(spec.hbm_gbps) if spec else None,
                "sm_count": spec.sm_count if spec else None,
                "source": spec.source if spec else None,
            },
        },
        "summary": clean(result.summary),
        "kernels": kernels,
        "nvml": clean(result.nvml_summary),
        "findings": [{**f.to_dict(), "ranked_by_ms": round(ranked_saving_ms(f), 4)} for f in result.findings],
        "ranking": {"by": RANKING, "low_confidence_weight": LOW_CONFIDENCE_WEIGHT,
                    "negligible_below_pct": NEGLIGIBLE_PCT},
        "notes": [{**f.to_dict(), "ranked_by_ms": round(ranked_saving_ms(f), 4)} for f in result.notes],
        "analyzers_skipped": list(result.skipped),
        "warnings": [*result.warnings, *replay_notes(result)],
    }


def replay_notes(result: Result) -> list[str]:
    """What the report says when its traces had GPU work but could not be replayed (the
    dependency graph could not be built, or replayed to no finite step): the report goes on
    without a replayed step time or projection, and findings keep the time they claim."""
    if result.replay_step_time_ms is not None or not any(p.has_gpu for p in result.parts):
        return []
    return ["no replay: gpuprof could not build or run this trace's dependency graph (the reason is on stderr, "
            "'gpuprof: warning: no replay: ...'), so there is no replayed step time and no projection, and each "
            "finding's saving is the time it claims on the trace rather than its fix replayed"]


def per_step(result: Result) -> list[dict[str, Any]]:
    """Per rank and step: its time and the ms of each class (what the step bars draw)."""
    steps = result.steps
    cols = [c for c in steps.columns if c.endswith("_us") and c != "time_us"]
    out: list[dict[str, Any]] = clean([
        {"rank": int(r["rank"]), "step": int(r["step"]), "time_ms": float(r["time"]) / 1000.0,
         **{c[:-3]: float(r[c]) / 1000.0 for c in cols if pd.notna(r[c])}}
        for r in steps.to_dict("records") if pd.notna(r.get("time_us"))])
    return out


def operators_table(ranks: Sequence[RankResult], top: int = 300) -> list[dict[str, Any]]:
    """The heaviest CPU ops by GPU time (:func:`gpuprof.views.operators`), as records, each also
    per step as the kernel table is (``*_ms_per_step``, ``calls_per_step``: the totals over every
    rank's profiled steps divided by how many those are)."""
    from gpuprof import views

    steps = sum(max(len(r.trace.steps), 1) for r in ranks) or 1
    t = views.operators(ranks, top=top)
    for col in ("host_us", "host_self_us", "gpu_us", "gpu_self_us"):
        t[col[:-3] + "_ms_per_step"] = t[col] / 1000.0 / steps
    t["calls_per_step"] = t["count"] / steps
    out: list[dict[str, Any]] = clean(t.to_dict("records"))
    return out


def views_detail(result: Result, ranks: Sequence[RankResult], max_items: int = 12000,
                 max_operators: int = 300) -> dict[str, Any]:
    """The timeline of one step, the operators table and memory over the steps
    (:mod:`gpuprof.views`), as plain data for the HTML report."""
    from gpuprof import views

    ops = [r.trace.ops for r in ranks]
    if not any(p.has_gpu for p in result.parts) and not sum(len(o) for o in ops):
        return {"timeline": {}, "operators": [], "memory": {}}
    c = views.claims(result, ranks)
    return {"timeline": views.timeline(result, ranks, max_items=max_items, claims_frame=c),
            "operators": operators_table(ranks, max_operators),
            "memory": views.memory(ranks)}


def detail(result: Result, ranks: Sequence[RankResult], max_nvml_points: int = 4000) -> dict[str, Any]:
    """Plain data the HTML report draws beyond the JSON document: per-step time by class, the
    GPU's roofs, NVML series (down-sampled to ``max_nvml_points`` rows) and run facts."""
    roofs = {}
    if result.spec is not None:
        roofs = {"hbm_gbps": result.spec.hbm_gbps, "peaks_tflops": dict(result.spec.peaks_tflops)}
    nv = result.nvml
    series: list[dict[str, Any]] = []
    if len(nv):
        keep = nv.iloc[:: max(1, len(nv) // max_nvml_points)]
        t0 = int(nv["ts_ns"].min())
        series = [{k: (None if pd.isna(v) else (float(v) if k != "in_window" else bool(v)))
                   for k, v in row.items() if k in ("gpu", "rank", "util_gpu_pct", "sm_clock_mhz", "power_w",
                                                      "mem_used_mb", "clock_event_reasons", "in_window",
                                                      "gpm_tensor_util_pct", "sm_clock_max_mhz", "power_limit_w")}
                  | {"t_s": (int(row["ts_ns"]) - t0) / 1e9} for row in keep.to_dict("records")]
    run = {k: result.run.get(k) for k in ("command", "torch", "cuda", "host", "exit_code", "world_size")}
    out: dict[str, Any] = clean({"per_step": per_step(result), "roofs": roofs, "nvml_series": series, "run": run,
                                 **views_detail(result, ranks)})
    return out
