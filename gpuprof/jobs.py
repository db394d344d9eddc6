"""One rank's work, wherever it runs (this process, a local worker process, a Dask worker).

A job of many ranks is analysed without ever holding every rank's frames in one place. Each rank
trace is loaded where it is worked on and, in a first pass (:func:`part_job`), reduced to a
:class:`~gpuprof.parts.RankPart`: its step times and class breakdown, per-kernel-name sums, its
collectives and a few scalars, some kilobytes to a few MB however big the trace. The driver
(:mod:`gpuprof.pipeline`) plans the cross-rank findings from the parts and sends each rank its
share; the second pass (:func:`rank_job`) loads the rank again (from the parse cache, or from the
executor's store when frames are kept in this process), runs the per-rank analyzers, settles which
finding keeps which µs (:mod:`gpuprof.claims`), prices them (:mod:`gpuprof.pricing`) and returns a
:class:`RankOutcome`: its findings' contributions, the claims behind them, and its replayed step.
Memory in the driver grows with the number of ranks times the size of a part, not with the traces.

Every pass's result is filed in the results cache under the bytes it was computed from
(:func:`cached`), so a second report of an unchanged trace with the same options loads no frames.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pandas as pd

from gpuprof.claims import Claimed, ClaimedRecord, Contribution, from_records, rank_claims, to_records
from gpuprof.errors import GpuprofError
from gpuprof.parts import RankPart, part_of
from gpuprof.rank import RankResult, RankView, result_of, with_rank
from gpuprof.specs import GpuSpec, resolve
from gpuprof.trace.model import RankTrace

if TYPE_CHECKING:
    from gpuprof.analyzers.distributed import CrossCandidate
    from gpuprof.replay.fixes import Plan
    from gpuprof.replay.graph import Graph
    from gpuprof.replay.job import RankGraph


@dataclass(frozen=True)
class Job:
    """How to load one rank anywhere: the file and the options every worker applies the same way."""

    path: str
    fallback_rank: int
    cache: bool = True
    gpu: str | None = None
    gpu_spec: str | None = None
    unprofiled_step_ms: float | None = None
    rank: int | None = None  # set when several files claim one rank: they are told apart by order
    cache_root: str | None = None  # a parse cache folder other than the user's (see gpuprof.pipeline)


#: The ranks a job kept in this process (:class:`gpuprof.executors.Executor` with ``keep``), by
#: their job less what does not change the loaded frames (the unprofiled step time, a rank number
#: set by order): the later passes over a rank reuse its frames instead of loading it again.
Store = dict[Job, tuple[RankResult, GpuSpec | None]]


def load_trace_cached(path: Path, fallback_rank: int, cache: bool, root: str | None = None) -> RankTrace:
    """The trace at ``path`` through the parse cache. The file is read once; those bytes are hashed
    and, on a miss, parsed, so the key filed with the frames (``meta.content_key``) is the key of
    the bytes they came from even if the file is replaced meanwhile."""
    from gpuprof import files
    from gpuprof.trace import cache as pcache
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


def _store_key(job: Job) -> Job:
    return replace(job, unprofiled_step_ms=None, rank=None)


def load_rank(job: Job, nvml: pd.DataFrame | None = None, nvml_period_s: float = 0.05, store: Store | None = None
              ) -> tuple[RankResult, GpuSpec | None]:
    """The rank ``job`` names with its roofline and step summary, and its GPU's spec: from
    ``store`` when the executor kept it, else loaded (and kept there when there is a store)."""
    key = _store_key(job)
    got = store.get(key) if store is not None else None
    if got is None:
        t = load_trace_cached(Path(job.path), job.fallback_rank, job.cache, job.cache_root)
        spec = resolve(t.meta.device_properties, gpu=job.gpu, spec_file=job.gpu_spec)
        got = result_of(t, spec), spec  # the roofline and summary do not read the rank number or step time
        if store is not None:
            store[key] = got
    return _as_job(got[0], job, nvml, nvml_period_s), got[1]


def _as_job(r: RankResult, job: Job, nvml: pd.DataFrame | None, nvml_period_s: float) -> RankResult:
    t = r.trace if job.rank is None or job.rank == r.trace.meta.rank else with_rank(r.trace, job.rank)
    return RankResult(t, r.roofline, r.summary, job.unprofiled_step_ms, nvml, nvml_period_s)


def kept_ranks(store: Store | None, jobs: Sequence[Job], parts: Sequence[RankPart]) -> tuple[RankResult, ...] | None:
    """The ranks of ``jobs`` as :func:`load_rank` gives them with their parts' GPU samples, when
    ``store`` holds every one of them (none was read whole from the results cache); else None."""
    if store is None:
        return None
    got = [store.get(_store_key(j)) for j in jobs]
    if any(g is None for g in got):
        return None
    return tuple(_as_job(g[0], j, p.nvml, p.nvml_period_s) for g, j, p in zip(got, jobs, parts) if g is not None)


# --- the results cache -------------------------------------------------------------------------

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
    return pcache.result_key(kind, job.path, content, job.fallback_rank, job.rank, job.gpu, spec_file,
                             job.unprofiled_step_ms, *extra)


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


# --- the passes --------------------------------------------------------------------------------

#: What the first pass yields, as the results cache decodes it.
PartResult = tuple[RankPart, GpuSpec | None]


def part_job(job: Job, store: Store | None = None) -> tuple[RankPart, GpuSpec | None]:
    """First pass: load one rank and reduce it to its part (or read it from the cache)."""
    def compute() -> tuple[PartResult, str | None]:
        r, spec = load_rank(job, store=store)
        return (part_of(r), spec), r.trace.meta.content_key

    out: PartResult = cached(job, job_key(job, "part"), compute, PartResult,
                             lambda content: job_key(job, "part", content=content))
    return out


#: Replay figures of a one-rank job's summary (``projected_step_time_ms`` and what it applies).
Figures = dict[str, float | list[str] | None]


@dataclass(frozen=True)
class RankOutcome:
    """What analysing one rank yields: its findings' contributions (small: merged across ranks),
    the claims behind them (:class:`gpuprof.claims.Claimed`: the views and the projection read
    them), its unchanged trace replayed (``replay_ms``, mean step window), and for a one-rank job
    the projection (``figures``). ``plan`` is the rank's replay plan, handed back only in this
    process (it holds the rank's frames; it never crosses processes or the cache)."""

    contributions: list[Contribution]
    claims: tuple[Claimed, ...]
    replay_ms: float | None
    figures: Figures | None = None
    plan: Plan | None = field(default=None, compare=False, repr=False)


#: :class:`RankOutcome` as the results cache holds it (plain columns; no plan).
OutcomeRecord = tuple[list[Contribution], tuple[ClaimedRecord, ...], float | None, Figures | None]


def analyse_rank(view: RankView, part: RankPart, active: Sequence[Any], cross: Sequence[CrossCandidate],
                 alone: bool, graph: Graph | None = None) -> RankOutcome:
    """One rank analysed: the analyzers in ``active`` describe their candidates on ``view``, joined
    by the rank's share of the cross-rank findings (``cross``); each unit goes to the first finding
    that claims it; every fix is priced on the rank's replay plan (:func:`gpuprof.pricing.price_rank`),
    made on ``graph`` where the rank's dependency graph was built already (for the job's replay).
    A rank that is the whole job (``alone``) also projects its fixes applied together."""
    from gpuprof import pricing
    from gpuprof.analyzers.distributed import to_candidate
    from gpuprof.replay import fixes

    candidates = [c for a in active if a.run is not None for c in a.run(view)]
    candidates.extend(to_candidate(cc, view) for cc in cross)
    claims, shares = rank_claims(part.rank, candidates, part.n_steps)
    plan = fixes.plan(view, claims, part.unprofiled_step_ms, graph)
    contributions = pricing.price_rank(plan, shares, part)
    figures = None
    if alone:
        from gpuprof.claims import merge, rank_findings, split_notes

        found = rank_findings(merge(contributions, {part.rank: part.n_steps},
                                    {part.rank: part.unprofiled_step_ms or part.summary.step_time_ms}))
        figures = pricing.projection(plan, split_notes(found)[0])
    return RankOutcome(contributions, claims, pricing.unchanged_ms(plan, view.trace), figures, plan)


def rank_job(job: Job, part: RankPart, active: Sequence[str], cross: Sequence[CrossCandidate], alone: bool,
             graph: RankGraph | None = None, store: Store | None = None) -> RankOutcome:
    """Second pass: load the rank again (its parse cache, or ``store``), analyse it
    (:func:`analyse_rank`) with the per-rank analyzers named in ``active`` and its share of the
    cross-rank findings, or read what that gave before from the results cache. ``graph``: the
    rank's dependency graph where the job's replay built it in this process (:func:`graph_job`),
    which its replay plan then shares. The plan comes back only with a store (this process)."""
    from gpuprof.analyzers import REGISTRY

    made: list[RankOutcome] = []

    def compute() -> tuple[OutcomeRecord | None, str | None]:
        r, spec = load_rank(job, part.nvml, part.nvml_period_s, store)
        outcome = analyse_rank(RankView(r, spec), part, [a for a in REGISTRY if a.name in active], cross, alone,
                               graph.graph if graph is not None else None)
        made.append(outcome)
        if not job.cache:  # no results cache to file it in (job_key is None): the outcome as made is all
            return None, None
        content = r.trace.meta.content_key
        record: OutcomeRecord = (outcome.contributions, to_records(outcome.claims), outcome.replay_ms,
                                 outcome.figures)
        # file changed between passes: keep no copy
        return record, content if content == part.meta.content_key else None

    extra = (tuple(active), digest(part.nvml), part.nvml_period_s, digest(list(cross)), alone)
    got: OutcomeRecord | None = cached(job, job_key(job, "rank", *extra), compute, OutcomeRecord,
                                       lambda content: job_key(job, "rank", *extra, content=content))
    if made:  # computed here, not read from the cache
        return made[0] if store is not None else replace(made[0], plan=None)
    assert got is not None  # read from the cache, which holds only records
    contributions, records, replay_ms, figures = got
    return RankOutcome(contributions, from_records(records), replay_ms, figures)


def host_free_job(job: Job, store: Store | None = None) -> float | None:
    """The rank's steady-state step replayed with the host's own time taken out (ms): the least
    step its GPU work and dependencies allow (:mod:`gpuprof.steptime`); None where the rank has no
    graph to replay."""
    from gpuprof.errors import GpuprofError
    from gpuprof.replay import steady_ms
    from gpuprof.replay.fixes import host_free
    from gpuprof.replay.graph import build

    def compute() -> tuple[float | None, str | None]:
        r, _ = load_rank(job, store=store)
        t = r.trace
        if not len(t.runtime) or not (len(t.kernels) + len(t.memcpys)):
            return None, None
        try:
            return float(steady_ms(host_free(build([t])))), t.meta.content_key
        except GpuprofError:
            return None, None

    # filed in the results cache: a run folder with such waits is not replayed again on each report
    out: float | None = cached(job, job_key(job, "host_free"), compute, float,
                               lambda content: job_key(job, "host_free", content=content))
    return out


def graph_job(job: Job, store: Store | None = None) -> RankGraph:
    """One rank's dependency graph, ready to join the others' (gpuprof.replay.job)."""
    from gpuprof.replay.job import rank_graph

    r, _ = load_rank(job, store=store)
    return rank_graph(r.trace)


def slow_job(job: Job, waits: pd.DataFrame, waiting: int, store: Store | None = None) -> dict[str, Any]:
    """The slow rank's detail for rank_imbalance (``analyzers.distributed.slow_detail``)."""
    from gpuprof.analyzers.distributed import slow_detail

    r, _ = load_rank(job, store=store)
    out: dict[str, Any] = slow_detail(r, waits, waiting)
    return out
