"""Per-rank work, and the small summaries that cross ranks.

A job of many ranks is analysed without ever holding every rank's frames in one place. Each rank
trace is loaded where it is worked on (this process, a local worker process, or a Dask worker)
and reduced to a :class:`RankPart`: its step times and class breakdown, per-kernel-name sums, its
collectives (one row per NCCL kernel in the profiled steps) and a few scalars, some kilobytes to
a few MB however big the trace. The driver matches collectives across ranks from the parts and
sends each rank its share of the cross-rank findings; the rank is loaded again (from the parse
cache), runs the per-rank analyzers, settles which finding keeps which µs
(:func:`gpuprof.analyzers._base.claim`) and returns one :class:`~gpuprof.analyzers._base.Contribution`
per finding. Memory in the driver grows with the number of ranks times the size of a part, not
with the traces.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xxhash

from gpuprof.roofline import classify
from gpuprof.specs import GpuSpec, resolve
from gpuprof.timeline import StepSummary, summarize
from gpuprof.trace.model import RankTrace, TraceMeta


@dataclass(frozen=True)
class RankResult:
    """One rank with everything: the trace's frames, the roofline and the step summary."""

    trace: RankTrace
    roofline: pd.DataFrame
    summary: StepSummary
    unprofiled_step_ms: float | None = None  # measured without the profiler, when known
    nvml: pd.DataFrame | None = None  # this rank's GPU samples over the run (in_window marks the profiled steps)
    nvml_period_s: float = 0.05


@dataclass(frozen=True)
class RankPart:
    """What the report and the cross-rank analysis need of one rank: small, whatever the trace."""

    meta: TraceMeta
    steps: pd.DataFrame  # the trace's step windows
    summary: StepSummary
    kernels: pd.DataFrame  # per kernel name: sums over the profiled steps (see kernel_sums)
    collectives: pd.DataFrame  # gpuprof.analyzers.distributed.collective_table
    has_gpu: bool
    event_cost_us: float  # the profiler's cost per recorded host event (0 when the real step time is unknown)
    runtime_us_per_step: float  # CUDA runtime/driver call time per step on the host
    unprofiled_step_ms: float | None = None
    nvml: pd.DataFrame | None = None
    nvml_period_s: float = 0.05

    @property
    def rank(self) -> int:
        return self.meta.rank

    @property
    def n_steps(self) -> int:
        return max(len(self.steps), 1)


@dataclass(frozen=True)
class Job:
    """How to load one rank anywhere: the file and the options every worker applies the same way."""

    path: str
    fallback_rank: int
    cache: bool = True
    gpu: str | None = None
    gpu_spec: str | None = None
    step_ms: float | None = None
    rank: int | None = None  # set when several files claim one rank: they are told apart by order
    cache_root: str | None = None  # a parse cache folder other than the user's (see api.analyze)


def load_trace_cached(path: Path, fallback_rank: int, cache: bool, root: str | None = None) -> RankTrace:
    from gpuprof.trace import cache as pcache
    from gpuprof.trace.load import load_trace

    key = pcache.content_key(path) if cache and path.is_file() else None
    where = Path(root) if root else None
    t = pcache.load(path, key, where) if key else None
    if t is None:
        t = load_trace(path, fallback_rank=fallback_rank)
        if key:
            pcache.store(t, key, where)
    return t


def with_rank(t: RankTrace, rank: int) -> RankTrace:
    return replace(t, meta=replace(t.meta, rank=rank))


def result_of(t: RankTrace, spec: GpuSpec | None, step_ms: float | None = None, nvml: pd.DataFrame | None = None,
              nvml_period_s: float = 0.05) -> RankResult:
    roof = classify(t, spec)
    return RankResult(t, roof, summarize(t.steps, t.kernels, roof, t.memcpys, spec), step_ms, nvml, nvml_period_s)


def load_rank(job: Job, nvml: pd.DataFrame | None = None, nvml_period_s: float = 0.05
              ) -> tuple[RankResult, GpuSpec | None]:
    t = load_trace_cached(Path(job.path), job.fallback_rank, job.cache, job.cache_root)
    if job.rank is not None and job.rank != t.meta.rank:
        t = with_rank(t, job.rank)
    spec = resolve(t.meta.device_properties, gpu=job.gpu, spec_file=job.gpu_spec)
    return result_of(t, spec, job.step_ms, nvml, nvml_period_s), spec


def event_cost_us(r: RankResult) -> tuple[float, float]:
    """(the profiler's cost per recorded host event in µs, host events per step). The cost is
    ``(traced step − real step) / host events per step``, 0 when the real step time is unknown."""
    t = r.trace
    n_steps = max(len(t.steps), 1)
    events = int((t.ops["step"] >= 0).sum() + (t.runtime["step"] >= 0).sum())
    per_step = events / n_steps
    step_us = float(r.summary.steps["time_us"].mean()) if len(r.summary.steps) else 0.0
    real = r.unprofiled_step_ms
    cost = max(0.0, step_us - real * 1000.0) / per_step if real and per_step else 0.0
    return cost, per_step


def runtime_us_per_step(r: RankResult) -> float:
    rt = r.trace.runtime
    return float(rt.loc[rt["step"] >= 0, "dur"].sum()) / max(len(r.trace.steps), 1)


#: Per-name sums of one rank's kernels; kernel_table() turns several ranks' sums into the report's table.
SUM_COLUMNS = ["count", "total_us", "m_dur", "flops", "bytes", "m_roof"]


def kernel_sums(r: RankResult) -> pd.DataFrame:
    """One row per kernel name over the rank's profiled steps: count, time, and the modelled
    FLOPs, bytes, roofline time and the time they cover (kernels the cost model knows); the
    time in each roofline class; engine, math dtype, op and the input shapes of the op that
    launched the name's first instance."""
    k = pd.concat([r.trace.kernels, r.roofline], axis=1)
    if (k["step"] >= 0).any():
        k = k[k["step"] >= 0]
    cols = ["name", *SUM_COLUMNS, "any_model", "engine", "math_dtype", "op", "shapes"]
    if k.empty:
        return pd.DataFrame(columns=cols)
    modelled = np.isfinite(k["t_roof_us"].to_numpy()) & np.isfinite(k["flops"].to_numpy())
    k = k.assign(
        name=k["name"].cat.remove_unused_categories() if isinstance(k["name"].dtype, pd.CategoricalDtype)
        else k["name"].astype(str),
        m_dur=np.where(modelled, k["dur"], 0.0),
        m_flops=np.where(modelled, k["flops"], 0.0),
        m_bytes=np.where(modelled, k["bytes"], 0.0),
        m_roof=np.where(modelled, k["t_roof_us"], 0.0),
        modelled=modelled,
    )
    g = k.groupby("name", sort=False, observed=True)
    t = g.agg(count=("dur", "size"), total_us=("dur", "sum"), m_dur=("m_dur", "sum"), flops=("m_flops", "sum"),
              bytes=("m_bytes", "sum"), m_roof=("m_roof", "sum"), any_model=("modelled", "any"),
              kernel_engine=("engine", "first"), math_dtype=("math_dtype", "first"), op=("op_name", "first"),
              first_op=("op", "first"))
    t = t.rename(columns={"kernel_engine": "engine"})  # ``engine=`` is an argument of agg() itself
    ops = r.trace.ops
    dims = ops["input_dims"].to_numpy() if len(ops) else np.array([], dtype=object)
    rows = t["first_op"].to_numpy()
    shapes = [dims[int(i)] if 0 <= i < len(dims) else None for i in rows]
    t["shapes"] = [s.decode("utf-8", "replace") if isinstance(s, bytes) else s for s in shapes]
    bound = k.groupby(["name", k["bound"].astype(str)], observed=True)["dur"].sum().unstack(fill_value=0)
    bound.columns = [f"bound:{c}" for c in bound.columns]
    t = t.drop(columns="first_op").join(bound)
    t.index = t.index.astype(object).astype(str)
    return t.reset_index()


def kernel_table(sums: list[pd.DataFrame]) -> pd.DataFrame:
    """The report's kernel table from the ranks' :func:`kernel_sums`: one row per kernel name,
    heaviest first; achieved rates and roofline % over the modelled instances."""
    out_cols = ["name", "count", "total_us", "flops", "bytes", "achieved_tflops", "achieved_gbps", "bound",
                "roofline_pct", "engine", "math_dtype", "op", "shapes"]
    sums = [s for s in sums if len(s)]
    if not sums:
        return pd.DataFrame(columns=out_cols)
    k = pd.concat(sums, ignore_index=True)
    bound_cols = [c for c in k.columns if c.startswith("bound:")]
    k[bound_cols] = k[bound_cols].fillna(0.0)
    g = k.groupby("name", sort=False)
    t = g[SUM_COLUMNS + bound_cols].sum()
    t["any_model"] = g["any_model"].any()
    for c in ("engine", "math_dtype", "op", "shapes"):
        t[c] = g[c].first()
    t["bound"] = t[bound_cols].idxmax(axis=1).str.slice(len("bound:"))
    has = t["any_model"] & (t["m_dur"] > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t["achieved_tflops"] = np.where(has, t["flops"] / (t["m_dur"] * 1e-6) / 1e12, np.nan)
        t["achieved_gbps"] = np.where(has, t["bytes"] / (t["m_dur"] * 1e-6) / 1e9, np.nan)
        t["roofline_pct"] = np.where(has, 100.0 * t["m_roof"] / t["m_dur"], np.nan)
    t["flops"] = t["flops"].where(t["any_model"])
    t["bytes"] = t["bytes"].where(t["any_model"])
    t = t.reset_index().sort_values("total_us", ascending=False, kind="stable").reset_index(drop=True)
    t["count"] = t["count"].astype(np.int64)
    return t[out_cols]


def part_of(r: RankResult) -> RankPart:
    from gpuprof.analyzers.distributed import collective_table

    cost, _ = event_cost_us(r)
    return RankPart(meta=r.trace.meta, steps=r.trace.steps, summary=r.summary, kernels=kernel_sums(r),
                    collectives=collective_table(r), has_gpu=r.trace.has_gpu, event_cost_us=cost,
                    runtime_us_per_step=runtime_us_per_step(r), unprofiled_step_ms=r.unprofiled_step_ms,
                    nvml=r.nvml, nvml_period_s=r.nvml_period_s)


def job_key(job: Job, kind: str, *extra: Any) -> str | None:
    """The results-cache key of ``kind`` computed for ``job`` with ``extra`` inputs (None when the
    cache is off or the trace is not a file)."""
    from gpuprof.trace import cache as pcache

    if not job.cache or not Path(job.path).is_file():
        return None
    spec_file = None
    if job.gpu_spec:
        try:
            spec_file = xxhash.xxh3_64_hexdigest(Path(job.gpu_spec).read_bytes())
        except OSError:
            spec_file = job.gpu_spec  # resolve() reports it
    return pcache.result_key(kind, job.path, pcache.content_key(Path(job.path)), job.fallback_rank, job.rank,
                             job.gpu, spec_file, job.step_ms, *extra)


def digest(value: Any) -> str | None:
    """A content digest of a frame (or None) or of any picklable value, for results-cache keys."""
    if value is None:
        return None
    if isinstance(value, pd.DataFrame):
        return xxhash.xxh3_64_hexdigest(pd.util.hash_pandas_object(value, index=True).to_numpy().tobytes()
                                        + repr(list(value.columns)).encode())
    return xxhash.xxh3_64_hexdigest(pickle.dumps(value, protocol=4))


def cached(job: Job, key: str | None, compute: Any) -> Any:
    """``compute()``, or what it returned before under ``key`` (the results cache)."""
    from gpuprof.trace import cache as pcache

    root = Path(job.cache_root) if job.cache_root else None
    if key is not None:
        hit = pcache.get_result(key, root)
        if hit is not None:
            return hit
    out = compute()
    if key is not None:
        pcache.put_result(key, out, root)
    return out


def part_job(job: Job) -> tuple[RankPart, GpuSpec | None]:
    """Worker, first pass: load one rank and reduce it to its part (or read it from the cache)."""
    def compute() -> tuple[RankPart, GpuSpec | None]:
        r, spec = load_rank(job)
        return part_of(r), spec

    out: tuple[RankPart, GpuSpec | None] = cached(job, job_key(job, "part"), compute)
    return out
