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

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpuprof.errors import GpuprofError
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
    return load_trace_keyed(path, fallback_rank, cache, root)


def load_trace_keyed(path: Path, fallback_rank: int, cache: bool, root: str | None = None) -> RankTrace:
    """The trace at ``path`` through the parse cache. The file is read once; those bytes are hashed
    and, on a miss, parsed, so the key filed with the frames (``meta.content_key``) is the key of
    the bytes they came from even if the file is replaced meanwhile."""
    from gpuprof.trace import cache as pcache
    from gpuprof import files
    from gpuprof.trace.load import load_trace

    if not cache:
        return load_trace(path, fallback_rank=fallback_rank)
    before = pcache.stat_id(path) if path.is_file() else None
    source = [files.read_file(path)]
    key = pcache.key_of(source[0])
    if before is not None:
        pcache.remember(path, before, key)
    where = Path(root) if root else None
    t = pcache.load(path, key, where)
    if t is None:
        t = load_trace(path, fallback_rank=fallback_rank, source=source)
        t = replace(t, meta=replace(t.meta, content_key=key))
        pcache.store(t, key, where)
    return t


def with_rank(t: RankTrace, rank: int) -> RankTrace:
    return replace(t, meta=replace(t.meta, rank=rank))


def result_of(t: RankTrace, spec: GpuSpec | None, step_ms: float | None = None, nvml: pd.DataFrame | None = None,
              nvml_period_s: float = 0.05) -> RankResult:
    roof = classify(t, spec)
    return RankResult(t, roof, summarize(t.steps, t.kernels, roof, t.memcpys, spec), step_ms, nvml, nvml_period_s)


#: The ranks loaded so far by a job analysed in this process (see :func:`resident`), by their
#: job less what does not change the loaded frames (the real step time, a rank number set by order).
_RESIDENT: ContextVar[dict[Job, tuple[RankResult, GpuSpec | None]] | None] = ContextVar("gpuprof_resident",
                                                                                       default=None)


@contextmanager
def resident() -> Iterator[None]:
    """Within it, :func:`load_rank` in this process loads each rank once and keeps it: the later
    passes over a rank (its findings, the slow rank's detail, its replay graph) reuse its frames,
    roofline and summary instead of loading it again. For jobs small enough to hold whole (see
    ``gpuprof.api``); worker processes and Dask workers never see it."""
    token = _RESIDENT.set({})
    try:
        yield
    finally:
        _RESIDENT.reset(token)


def load_rank(job: Job, nvml: pd.DataFrame | None = None, nvml_period_s: float = 0.05
              ) -> tuple[RankResult, GpuSpec | None]:
    memo = _RESIDENT.get()
    key = replace(job, step_ms=None, rank=None)
    got = memo.get(key) if memo is not None else None
    if got is None:
        t = load_trace_cached(Path(job.path), job.fallback_rank, job.cache, job.cache_root)
        spec = resolve(t.meta.device_properties, gpu=job.gpu, spec_file=job.gpu_spec)
        got = result_of(t, spec), spec  # the roofline and summary do not read the rank number or step time
        if memo is not None:
            memo[key] = got
    return _as_job(got[0], job, nvml, nvml_period_s), got[1]


def _as_job(r: RankResult, job: Job, nvml: pd.DataFrame | None, nvml_period_s: float) -> RankResult:
    t = r.trace if job.rank is None or job.rank == r.trace.meta.rank else with_rank(r.trace, job.rank)
    return RankResult(t, r.roofline, r.summary, job.step_ms, nvml, nvml_period_s)


def kept_ranks(jobs: Sequence[Job], parts: Sequence[RankPart]) -> tuple[RankResult, ...] | None:
    """Inside :func:`resident`, the ranks of ``jobs`` as :func:`load_rank` gives them with their
    parts' GPU samples, when every one of them was loaded (none read whole from the results
    cache); else None."""
    memo = _RESIDENT.get()
    if memo is None:
        return None
    got = [memo.get(replace(j, step_ms=None, rank=None)) for j in jobs]
    if any(g is None for g in got):
        return None
    return tuple(_as_job(g[0], j, p.nvml, p.nvml_period_s) for g, j, p in zip(got, jobs, parts) if g is not None)


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
SUM_COLUMNS = ["count", "total_us", "m_dur", "flops", "bytes", "m_roof", "e_dur", "e_roof", "e_count"]


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
        # instances above their roofline (roofline.MODEL_ERROR_PCT): their time and impossible roofline time
        e_dur=np.where(k["model_error"], k["dur"], 0.0),
        e_roof=np.where(k["model_error"], k["model_error_pct"] * k["dur"] / 100.0, 0.0),
        e_count=k["model_error"].astype(np.int64),
    )
    g = k.groupby("name", sort=False, observed=True)
    t = g.agg(count=("dur", "size"), total_us=("dur", "sum"), m_dur=("m_dur", "sum"), flops=("m_flops", "sum"),
              bytes=("m_bytes", "sum"), m_roof=("m_roof", "sum"), e_dur=("e_dur", "sum"),
              e_roof=("e_roof", "sum"), e_count=("e_count", "sum"), any_model=("modelled", "any"),
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
                "roofline_pct", "cost_model_error", "cost_model_error_count", "cost_model_error_pct", "engine", "math_dtype", "op", "shapes"]
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
        t["cost_model_error_pct"] = np.where(t["e_dur"] > 0, 100.0 * t["e_roof"] / t["e_dur"], np.nan)
    t["cost_model_error"] = t["e_count"] > 0
    t["cost_model_error_count"] = t["e_count"].astype(np.int64)
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


def job_key(job: Job, kind: str, *extra: Any, content: str | None = None) -> str | None:
    """The results-cache key of ``kind`` computed for ``job`` with ``extra`` inputs (None when the
    cache is off or the trace is not a file). ``content`` is the content key of the bytes the result
    was computed from (what a result is stored under); without it, the file's current key (what
    a lookup uses)."""
    from gpuprof import files
    from gpuprof.errors import SpecError
    from gpuprof.trace import cache as pcache

    if not job.cache or not Path(job.path).is_file():
        return None
    spec_file = None
    if job.gpu_spec:
        try:
            spec_file = pcache.hash_bytes(files.read_file(Path(job.gpu_spec), SpecError))
        except SpecError:
            spec_file = job.gpu_spec  # resolve() reports it
    if content is None:
        try:
            content = pcache.content_key(Path(job.path))
        except GpuprofError:
            return None  # loading reports it
    return pcache.result_key(kind, job.path, content, job.fallback_rank, job.rank, job.gpu, spec_file, job.step_ms,
                             *extra)


def _digest_hook(o: Any) -> Any:
    if isinstance(o, pd.DataFrame):
        return [list(map(str, o.columns)), pd.util.hash_pandas_object(o, index=True).to_numpy().tobytes()]
    if isinstance(o, np.ndarray):
        return [str(o.dtype), list(o.shape), o.tobytes()]
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"cannot digest a {type(o).__name__}")


_DIGEST = msgspec.msgpack.Encoder(enc_hook=_digest_hook)


def digest(value: Any) -> str | None:
    """A content digest (BLAKE3) of a frame (or None) or of plain values and dataclasses of them,
    for results-cache keys."""
    from gpuprof.trace import cache as pcache

    if value is None:
        return None
    return pcache.hash_bytes(_DIGEST.encode(value))


#: What each kind of result is decoded as when read back from the results cache.
PartResult = tuple[RankPart, GpuSpec | None]


def cached(job: Job, key: str | None, compute: Callable[[], tuple[Any, str | None]], kind: Any,
           store_key: Callable[[str], str | None]) -> Any:
    """What ``compute()`` returns, or what it returned before under ``key`` (the results cache).

    ``compute`` returns ``(value, content key of the bytes it was computed from)``, and the value
    is stored under ``store_key(that content key)``: a result is only ever filed under the content
    it came from, whatever the file holds by the time it is stored."""
    from gpuprof.trace import cache as pcache

    root = Path(job.cache_root) if job.cache_root else None
    if key is not None:
        hit = pcache.get_result(key, kind, root)
        if hit is not None:
            return hit
    out, content = compute()
    if key is not None and content is not None:
        where = store_key(content)
        if where is not None:
            pcache.put_result(where, out, kind, root)
    return out


def part_job(job: Job) -> tuple[RankPart, GpuSpec | None]:
    """Worker, first pass: load one rank and reduce it to its part (or read it from the cache)."""
    def compute() -> tuple[PartResult, str | None]:
        r, spec = load_rank(job)
        return (part_of(r), spec), r.trace.meta.content_key

    out: PartResult = cached(job, job_key(job, "part"), compute, PartResult,
                             lambda content: job_key(job, "part", content=content))
    return out
