"""The public API: ``gpuprof.analyze(path_or_paths) -> Analysis``.

A path is a Kineto trace file (``.json`` or ``.json.gz``), a folder of per-rank trace files, or
a run folder written by ``gpuprof record`` (it has a ``manifest.json``). Nothing is re-run:
analysis only reads what was recorded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import gpuprof
from gpuprof.errors import GpuprofError, TraceError
from gpuprof.findings import Finding
from gpuprof.roofline import classify
from gpuprof.specs import GpuSpec, resolve
from gpuprof.timeline import CLASSES, StepSummary, summarize
from gpuprof.trace.load import load_trace
from gpuprof.trace.model import RankTrace

TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")
SCHEMA_VERSION = 1


def _is_trace_name(p: Path) -> bool:
    return p.is_file() and p.name.endswith(TRACE_SUFFIXES) and p.name != "manifest.json"


def find_traces(paths: Sequence[str | Path]) -> list[Path]:
    """Trace files named by ``paths``: files as given; folders by manifest, else every trace file."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise TraceError("no such file or folder", str(p))
        if p.is_file():
            out.append(p)
            continue
        manifest = p / "manifest.json"
        if manifest.is_file():
            try:
                doc = json.loads(manifest.read_text())
                listed = [p / t["path"] for t in doc.get("traces", [])]
            except (OSError, ValueError, TypeError, KeyError) as e:
                raise TraceError(f"unreadable run manifest ({e.__class__.__name__}: {e})", str(manifest)) from None
            if not listed:
                raise TraceError("the run folder's manifest lists no traces (did the program reach the profiled steps?)",
                                 str(manifest))
            out.extend(listed)
            continue
        found = sorted(f for f in p.iterdir() if _is_trace_name(f))
        if not found:
            raise TraceError("folder holds no trace files (*.json, *.json.gz)", str(p))
        out.extend(found)
    return out


@dataclass(frozen=True)
class RankResult:
    trace: RankTrace
    roofline: pd.DataFrame
    summary: StepSummary
    unprofiled_step_ms: float | None = None  # measured without the profiler, when known
    nvml: pd.DataFrame | None = None  # this rank's GPU samples over the run (in_window marks the profiled steps)
    nvml_period_s: float = 0.05


@dataclass(frozen=True)
class Analysis:
    """Everything gpuprof found in a set of traces, as pandas frames, a summary and findings."""

    ranks: tuple[RankResult, ...]
    spec: GpuSpec | None
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    skipped: tuple[dict[str, str], ...] = field(default_factory=tuple)
    run: dict[str, Any] = field(default_factory=dict)  # the run folder's manifest, when there is one

    # --- frames ----------------------------------------------------------------------------
    @cached_property
    def kernels(self) -> pd.DataFrame:
        """Every kernel instance with its roofline columns and a ``rank`` column."""
        parts = [pd.concat([r.trace.kernels, r.roofline], axis=1).assign(rank=r.trace.meta.rank) for r in self.ranks]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    @property
    def ops(self) -> pd.DataFrame:
        return pd.concat([r.trace.ops.assign(rank=r.trace.meta.rank) for r in self.ranks], ignore_index=True)

    @property
    def memcpys(self) -> pd.DataFrame:
        return pd.concat([r.trace.memcpys.assign(rank=r.trace.meta.rank) for r in self.ranks], ignore_index=True)

    @property
    def nvml(self) -> pd.DataFrame:
        """NVML samples of each rank's GPU over the run, ``in_window`` marking the profiled steps."""
        parts = [r.nvml for r in self.ranks if r.nvml is not None]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    @property
    def nvml_summary(self) -> list[dict[str, Any]]:
        from gpuprof.nvml_data import summarize as nvml_summarize

        return [{"rank": r.trace.meta.rank, "gpu": int(r.nvml["gpu"].iloc[0]) if len(r.nvml) else None,
                 **nvml_summarize(r.nvml, r.nvml_period_s)} for r in self.ranks if r.nvml is not None]

    @property
    def steps(self) -> pd.DataFrame:
        """Per rank and step: window on the GPU timeline and time by class (µs)."""
        parts = []
        for r in self.ranks:
            s = r.trace.steps.merge(r.summary.steps, on="step", how="left")
            parts.append(s.assign(rank=r.trace.meta.rank))
        return pd.concat(parts, ignore_index=True)

    @cached_property
    def kernel_table(self) -> pd.DataFrame:
        """One row per kernel name as the trace spells it, heaviest first, over the profiled steps."""
        k = self.kernels
        if k.empty:
            return pd.DataFrame(columns=["name", "count", "total_us", "flops", "bytes", "achieved_tflops",
                                         "achieved_gbps", "bound", "roofline_pct", "engine", "math_dtype", "op"])
        if (k["step"] >= 0).any():
            k = k[k["step"] >= 0]
        modelled = np.isfinite(k["t_roof_us"].to_numpy()) & np.isfinite(k["flops"].to_numpy())
        k = k.assign(
            name=k["name"].astype(str),
            m_dur=np.where(modelled, k["dur"], 0.0),
            m_flops=np.where(modelled, k["flops"], 0.0),
            m_bytes=np.where(modelled, k["bytes"], 0.0),
            m_roof=np.where(modelled, k["t_roof_us"], 0.0),
            modelled=modelled,
        )
        g = k.groupby("name", sort=False)
        first_op = g["op"].first()
        t = g.agg(count=("dur", "size"), total_us=("dur", "sum"), m_dur=("m_dur", "sum"), flops=("m_flops", "sum"),
                  bytes=("m_bytes", "sum"), m_roof=("m_roof", "sum"), any_model=("modelled", "any"),
                  kernel_engine=("engine", "first"), math_dtype=("math_dtype", "first"), op=("op_name", "first"))
        t = t.rename(columns={"kernel_engine": "engine"})
        t["shapes"] = self._shapes(k, first_op).reindex(t.index)
        bound_time = k.groupby(["name", k["bound"].astype(str)])["dur"].sum().unstack(fill_value=0)
        t["bound"] = bound_time.idxmax(axis=1).reindex(t.index)
        has = t["any_model"] & (t["m_dur"] > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            t["achieved_tflops"] = np.where(has, t["flops"] / (t["m_dur"] * 1e-6) / 1e12, np.nan)
            t["achieved_gbps"] = np.where(has, t["bytes"] / (t["m_dur"] * 1e-6) / 1e9, np.nan)
            t["roofline_pct"] = np.where(has, 100.0 * t["m_roof"] / t["m_dur"], np.nan)
        t["flops"] = t["flops"].where(t["any_model"])
        t["bytes"] = t["bytes"].where(t["any_model"])
        t = t.reset_index().sort_values("total_us", ascending=False, kind="stable").reset_index(drop=True)
        return t[["name", "count", "total_us", "flops", "bytes", "achieved_tflops", "achieved_gbps", "bound",
                  "roofline_pct", "engine", "math_dtype", "op", "shapes"]]

    def _shapes(self, k: pd.DataFrame, first_op: pd.Series) -> pd.Series:
        """Input shapes of the op that launched each kernel name's first instance (JSON text)."""
        out = {}
        by_rank = {r.trace.meta.rank: r.trace.ops for r in self.ranks}
        rank_of = k.groupby("name", sort=False)["rank"].first().to_dict()
        for name, row in first_op.items():
            ops = by_rank.get(int(rank_of[name]))
            if ops is not None and row >= 0:
                dims = ops.at[int(row), "input_dims"]
                out[name] = dims.decode("utf-8", "replace") if isinstance(dims, bytes) else dims
        return pd.Series(out, dtype=object)

    # --- summary ---------------------------------------------------------------------------
    @cached_property
    def summary(self) -> dict[str, Any]:
        """Step time, GPU busy %, breakdown and MFU, averaged over ranks (per-rank in ``per_rank``)."""
        s = [r.summary for r in self.ranks]
        mfus = [x.mfu_pct for x in s if x.mfu_pct is not None]
        keys = (*CLASSES, "idle")
        out: dict[str, Any] = {
            "steps": int(max(len(r.trace.steps) for r in self.ranks)),
            "step_time_ms": float(np.mean([x.step_time_ms for x in s])),
            "gpu_busy_pct": float(np.mean([x.gpu_busy_pct for x in s])),
            "mfu_pct": float(np.mean(mfus)) if mfus else None,
            "breakdown_pct": {k: float(np.mean([x.breakdown_pct[k] for x in s])) for k in keys},
            "steps_source": self.ranks[0].trace.meta.steps_source,
            "model_flops_per_step": float(np.mean([x.model_flops_per_step for x in s])),
            "mfu_basis": s[0].mfu_basis,
            "cost_model_coverage_pct": float(np.mean([x.coverage_pct for x in s])),
            "unprofiled_step_time_ms": self.ranks[0].unprofiled_step_ms,
            "mfu_unprofiled_pct": (float(np.mean(mfus)) * float(np.mean([x.step_time_ms for x in s]))
                                   / self.ranks[0].unprofiled_step_ms
                                   if mfus and self.ranks[0].unprofiled_step_ms else None),
            "gpu_kernel_time_ms": float(np.mean([100.0 - x.breakdown_pct["idle"] for x in s]) / 100.0
                                        * np.mean([x.step_time_ms for x in s])),
        }
        if len(s) > 1:
            out["per_rank"] = [{"rank": r.trace.meta.rank, "step_time_ms": r.summary.step_time_ms,
                                "gpu_busy_pct": r.summary.gpu_busy_pct,
                                "communication_pct": r.summary.breakdown_pct["communication"]} for r in self.ranks]
        return out

    @property
    def warnings(self) -> list[str]:
        seen: list[str] = []
        for r in self.ranks:
            for w in r.trace.meta.warnings:
                if w not in seen:
                    seen.append(w)
        if self.spec is None:
            seen.append("unknown GPU: no roofline (pass --gpu NAME or --gpu-spec FILE); kernels are 'unknown'")
        return seen

    # --- output ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON report's document (schema_version 1)."""
        spec = self.spec
        meta = self.ranks[0].trace.meta
        table = self.kernel_table
        kernels = [
            {"name": r["name"], "count": int(r["count"]), "total_us": _f(r["total_us"]), "flops": _f(r["flops"]),
             "bytes": _f(r["bytes"]), "achieved_tflops": _f(r["achieved_tflops"]),
             "achieved_gbps": _f(r["achieved_gbps"]), "bound": str(r["bound"]), "roofline_pct": _f(r["roofline_pct"]),
             "engine": r["engine"] or None,
             "math_dtype": r["math_dtype"] if isinstance(r["math_dtype"], str) else None,
             "op": r["op"] if isinstance(r["op"], str) else None,
             "shapes": r["shapes"] if isinstance(r["shapes"], str) else None}
            for r in table.to_dict("records")
        ]
        summary = self.summary
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "gpuprof", "version": gpuprof.__version__},
            "source": {"paths": [r.trace.meta.path for r in self.ranks],
                       "ranks": [r.trace.meta.rank for r in self.ranks],
                       "world_size": meta.world_size, "time_origin": meta.time_origin},
            "gpu": {
                "name": spec.name if spec else (meta.gpu_name or "unknown"),
                "device_name": meta.gpu_name,
                "spec": {
                    "fp32_tflops": _f(spec.peak("fp32")) if spec else None,
                    "tf32_tflops": _f(spec.peaks_tflops.get("tf32")) if spec else None,
                    "bf16_tflops": _f(spec.peaks_tflops.get("bf16")) if spec else None,
                    "fp8_tflops": _f(spec.peaks_tflops.get("fp8")) if spec else None,
                    "hbm_gbps": _f(spec.hbm_gbps) if spec else None,
                    "sm_count": spec.sm_count if spec else None,
                    "source": spec.source if spec else None,
                },
            },
            "summary": _clean(summary),
            "kernels": kernels,
            "nvml": _clean(self.nvml_summary),
            "findings": [f.to_dict() for f in self.findings],
            "analyzers_skipped": list(self.skipped),
            "warnings": self.warnings,
        }

    def detail(self, max_nvml_points: int = 4000) -> dict[str, Any]:
        """Plain data the HTML report draws beyond the JSON document: per-step time by class,
        the GPU's roofs, NVML series (down-sampled to ``max_nvml_points`` rows) and run facts."""
        steps = self.steps
        cols = [c for c in steps.columns if c.endswith("_us") and c != "time_us"]
        per_step = [{"rank": int(r["rank"]), "step": int(r["step"]), "time_ms": float(r["time"]) / 1000.0,
                     **{c[:-3]: float(r[c]) / 1000.0 for c in cols if pd.notna(r[c])}}
                    for r in steps.to_dict("records") if pd.notna(r.get("time_us"))]
        roofs = {}
        if self.spec is not None:
            roofs = {"hbm_gbps": self.spec.hbm_gbps, "peaks_tflops": dict(self.spec.peaks_tflops)}
        nv = self.nvml
        series: list[dict[str, Any]] = []
        if len(nv):
            keep = nv.iloc[:: max(1, len(nv) // max_nvml_points)]
            t0 = int(nv["ts_ns"].min())
            series = [{k: (None if pd.isna(v) else (float(v) if k != "in_window" else bool(v)))
                       for k, v in row.items() if k in ("gpu", "rank", "util_gpu_pct", "sm_clock_mhz", "power_w",
                                                          "mem_used_mb", "clock_event_reasons", "in_window",
                                                          "gpm_tensor_util_pct", "sm_clock_max_mhz", "power_limit_w")}
                      | {"t_s": (int(row["ts_ns"]) - t0) / 1e9} for row in keep.to_dict("records")]
        run = {k: self.run.get(k) for k in ("command", "torch", "cuda", "host", "exit_code", "world_size")}
        detail: dict[str, Any] = _clean({"per_step": per_step, "roofs": roofs, "nvml_series": series, "run": run})
        return detail

    def to_html(self, path: str | Path | None = None) -> str:
        """The offline HTML report; written to ``path`` when given (which must not exist)."""
        from gpuprof.reports.html import render_html

        text: str = render_html(self.to_dict(), self.detail())
        if path is not None:
            with open(path, "x", encoding="utf-8") as f:
                f.write(text)
        return text

    def to_json(self, indent: int | None = 1) -> str:
        from gpuprof.reports.json_report import render_json

        text: str = render_json(self.to_dict(), indent=indent)
        return text

    def to_text(self, color: bool = False) -> str:
        from gpuprof.reports.text import render_text

        text: str = render_text(self.to_dict(), color=color)
        return text


def _f(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) else None


def _clean(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _clean(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_clean(v) for v in d]
    if isinstance(d, (float, np.floating)):
        return _f(d)
    if isinstance(d, np.integer):
        return int(d)
    return d


def _load_one(path: Path, fallback_rank: int, cache: bool) -> RankTrace:
    from gpuprof.trace import cache as pcache

    key = pcache.content_key(path) if cache and path.is_file() else None
    t = pcache.load(path, key) if key else None
    if t is None:
        t = load_trace(path, fallback_rank=fallback_rank)
        if key:
            pcache.store(t, key)
    return t


def load_traces(files: Sequence[Path], cache: bool = True, workers: int | None = None,
                dask: str | None = None) -> list[RankTrace]:
    """Load trace files through the parse cache (unless ``cache`` is False). Several files are
    parsed in parallel: by up to ``workers`` local processes (default: one per CPU, at most one
    per file; 1 parses in this process), or on a Dask cluster when ``dask`` is a scheduler
    address, or ``"local"`` for a local one (needs ``pip install 'gpuprof[dask]'``)."""
    n = len(files)
    if dask:
        return _load_on_dask(files, cache, dask, workers)
    workers = min(n, workers or os.cpu_count() or 1)
    if workers <= 1:
        return [_load_one(f, i, cache) for i, f in enumerate(files)]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_load_one, files, range(n), [cache] * n))


def _load_on_dask(files: Sequence[Path], cache: bool, address: str, workers: int | None) -> list[RankTrace]:
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise GpuprofError("--dask needs dask.distributed: pip install 'gpuprof[dask]'") from None
    n = len(files)
    cluster = None
    try:
        if address == "local":
            cluster = LocalCluster(  # type: ignore[no-untyped-call]
                n_workers=min(n, workers or os.cpu_count() or 1), threads_per_worker=1, processes=True,
                dashboard_address=None)
            client = Client(cluster)  # type: ignore[no-untyped-call]
        else:
            client = Client(address, timeout="10s")  # type: ignore[no-untyped-call]
    except OSError as e:
        raise GpuprofError(f"cannot reach the Dask scheduler {address!r} ({e})") from None
    try:
        paths = [str(Path(f).resolve()) for f in files]  # workers may run elsewhere: absolute paths
        futures = client.map(_load_one_str, paths, range(n), [cache] * n, pure=False)
        return list(client.gather(futures))  # type: ignore[no-untyped-call]
    finally:
        client.close()  # type: ignore[no-untyped-call]
        if cluster is not None:
            cluster.close()


def _load_one_str(path: str, fallback_rank: int, cache: bool) -> RankTrace:
    return _load_one(Path(path), fallback_rank, cache)


def analyze(paths: str | Path | Sequence[str | Path], gpu: str | None = None, gpu_spec: str | None = None,
            analyzers: Sequence[str] | None = None, step_ms: float | None = None, cache: bool = True,
            workers: int | None = None, dask: str | None = None) -> Analysis:
    """Load and analyse traces. ``gpu`` overrides the trace's device name (e.g. ``"H100-SXM"``);
    ``gpu_spec`` is a spec file (``gpuprof calibrate`` output); ``analyzers`` restricts which run;
    ``step_ms`` is the step time measured *without* the profiler (from training logs), which
    corrects host-side estimates for the profiler's own host overhead. A run folder from
    ``gpuprof record`` carries it in its manifest (``unprofiled_step_ms``). ``cache`` reads and
    writes the parse cache (:mod:`gpuprof.trace.cache`); ``workers`` bounds the local processes
    that parse several rank traces in parallel; ``dask`` parses them on a Dask cluster instead
    (a scheduler address, or ``"local"``)."""
    from gpuprof.analyzers import run_analyzers

    seq = [paths] if isinstance(paths, (str, Path)) else list(paths)
    folder, manifest = _manifest(seq)
    if step_ms is None and isinstance(manifest.get("unprofiled_step_ms"), (int, float)):
        step_ms = float(manifest["unprofiled_step_ms"]) or None
    if step_ms is not None and not step_ms > 0:
        raise GpuprofError(f"--step-ms must be a positive number of milliseconds, got {step_ms}")
    files = find_traces(seq)
    traces = load_traces(files, cache=cache, workers=workers, dask=dask)
    ranks = [t.meta.rank for t in traces]
    if len(set(ranks)) != len(ranks):  # e.g. several single-GPU traces: keep them apart by order
        traces = [t if i == 0 else _with_rank(t, i) for i, t in enumerate(traces)]
    traces.sort(key=lambda t: t.meta.rank)
    props = [p for t in traces for p in t.meta.device_properties]
    spec = resolve(props, gpu=gpu, spec_file=gpu_spec)
    samples, period, gpu_of = _run_nvml(folder, manifest)
    results = []
    for t in traces:
        roof = classify(t, spec)
        results.append(RankResult(t, roof, summarize(t.steps, t.kernels, roof, t.memcpys, spec), step_ms,
                                  _rank_samples(t, samples, gpu_of), period))
    base = Analysis(ranks=tuple(results), spec=spec, run=manifest)
    findings, skipped = run_analyzers(base, only=analyzers)
    return Analysis(ranks=tuple(results), spec=spec, findings=tuple(findings), skipped=tuple(skipped), run=manifest)


def _manifest(paths: Sequence[str | Path]) -> tuple[Path | None, dict[str, Any]]:
    """The first run folder among ``paths`` and its manifest (find_traces reports a bad one)."""
    for p in paths:
        m = Path(p) / "manifest.json"
        if m.is_file():
            try:
                doc = json.loads(m.read_text())
            except (OSError, ValueError):
                return Path(p), {}
            return Path(p), doc if isinstance(doc, dict) else {}
    return None, {}


def _run_nvml(folder: Path | None, doc: dict[str, Any]) -> tuple[pd.DataFrame | None, float, dict[int, int]]:
    """NVML samples of a run folder, the sampling period, and each rank's physical GPU index."""
    from gpuprof.nvml_data import load_csv

    nv = doc.get("nvml") or {}
    if folder is None or not nv.get("path") or not (folder / str(nv["path"])).is_file():
        return None, 0.05, {}
    gpu_of = {}
    for r in doc.get("ranks", []):
        dev, vis = r.get("cuda_device"), r.get("cuda_visible_devices")
        if isinstance(dev, int):
            ids = [x for x in str(vis).split(",") if x.strip().isdigit()] if vis else []
            gpu_of[int(r.get("rank", 0))] = int(ids[dev]) if dev < len(ids) else dev
    return load_csv(folder / str(nv["path"])), 1.0 / float(nv.get("hz") or 20.0), gpu_of


def _rank_samples(t: RankTrace, samples: pd.DataFrame | None, gpu_of: dict[int, int]) -> pd.DataFrame | None:
    if samples is None or t.steps.empty:
        return None
    gpu = gpu_of.get(t.meta.rank, t.meta.rank)
    start = t.meta.t0_epoch_ns + int(t.steps["start"].min() * 1000)
    end = t.meta.t0_epoch_ns + int(t.steps["end"].max() * 1000)
    w = samples[samples["gpu"] == gpu]
    return w.assign(rank=t.meta.rank, in_window=(w["ts_ns"] >= start) & (w["ts_ns"] <= end))


def _with_rank(t: RankTrace, rank: int) -> RankTrace:
    from dataclasses import replace

    return replace(t, meta=replace(t.meta, rank=rank))


__all__ = ["Analysis", "GpuprofError", "RankResult", "analyze", "find_traces"]
