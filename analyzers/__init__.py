"""The analyzer registry: every analyzer gpuprof runs, listed explicitly, in one place.

An analyzer is a pure function ``(analysis) -> list[Candidate]`` that reads one rank's trace model
and roofline frames and never mutates them (the cross-rank ones work from every rank's small
collective table: :mod:`gpuprof.analyzers.distributed`). Each declares what it needs (GPU events, shapes, several
ranks, NVML samples); when a trace lacks it, the analyzer is skipped and the report says why.
Findings are ranked by estimated saving, best first (``RANKING`` says how, in words); those that
save next to nothing are notes (:func:`split_notes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpuprof.analyzers import (
    allocator,
    attention_fusion,
    compile_fusion,
    distributed,
    elementwise_fusion,
    host_gaps,
    memory_format,
    nvml,
    optimizer_fusion,
    precision,
    shape_alignment,
    transfers,
)
from gpuprof.analyzers._base import Candidate, Contribution, claim, kept_units, merge, release_views, views
from gpuprof.analyzers.distributed import CrossCandidate, to_candidate

from gpuprof.findings import Finding

if TYPE_CHECKING:
    from gpuprof.api import Analysis
    from gpuprof.ranks import RankPart
    from gpuprof.specs import GpuSpec


@dataclass(frozen=True)
class Analyzer:
    name: str
    run: Callable[[Analysis], list[Candidate]] | None  # None: a cross-rank analyzer (distributed.plan)
    needs: tuple[str, ...] = ()  # "gpu", "cpu", "runtime", "shapes", "multi_rank", "spec", "nvml"


#: Every analyzer, in the order they run. Add new ones here. The per-rank ones see one rank at a
#: time; the cross-rank ones are planned from every rank's collectives (analyzers.distributed).
REGISTRY: tuple[Analyzer, ...] = (
    Analyzer("precision", precision.run, ("gpu", "shapes", "spec")),
    Analyzer("shape_alignment", shape_alignment.run, ("gpu", "shapes", "spec")),
    Analyzer("memory_format", memory_format.run, ("gpu", "shapes", "spec")),
    Analyzer("attention_fusion", attention_fusion.run, ("gpu", "shapes", "spec")),
    Analyzer("elementwise_fusion", elementwise_fusion.run, ("gpu", "shapes", "spec")),
    Analyzer("compile", compile_fusion.run, ("gpu", "shapes", "spec")),
    Analyzer("optimizer_fusion", optimizer_fusion.run, ("gpu", "shapes", "spec")),
    Analyzer("input_pipeline", host_gaps.input_pipeline, ("gpu", "cpu")),
    Analyzer("host_work", host_gaps.host_work, ("gpu", "cpu")),
    Analyzer("host_stall", host_gaps.host_stall, ("gpu", "cpu")),
    Analyzer("allocator_churn", allocator.run, ("gpu", "runtime")),
    Analyzer("host_sync", host_gaps.host_sync, ("gpu", "runtime")),
    Analyzer("launch_overhead", host_gaps.launch_overhead, ("gpu", "runtime")),
    Analyzer("pageable_memcpy", transfers.pageable_memcpy, ("gpu",)),
    Analyzer("memory_bound_decode", transfers.memory_bound_decode, ("gpu", "shapes", "spec")),
    Analyzer("exposed_communication", None, ("gpu",)),
    Analyzer("rank_imbalance", None, ("gpu", "multi_rank")),
    Analyzer("gpu_throttling", nvml.gpu_throttling, ("gpu", "nvml")),
    Analyzer("memory_capacity", nvml.memory_capacity, ("nvml",)),
)


def _unmet(parts: Sequence[RankPart], spec: GpuSpec | None, needs: tuple[str, ...]) -> str | None:
    if "gpu" in needs and not any(p.has_gpu for p in parts):
        return "the trace has no GPU events"
    if "cpu" in needs and not any(p.meta.cpu_events for p in parts):
        return "the trace has no CPU ops (a GPU-only trace: profile with activities=[CPU, CUDA])"
    if "runtime" in needs and not any(p.meta.runtime_calls for p in parts):
        return "the trace has no CUDA/HIP runtime calls, so no launch or sync times"
    if "shapes" in needs and not any(p.meta.record_shapes for p in parts):
        return "the trace has no input shapes (record_shapes=False)"
    if "multi_rank" in needs and len(parts) < 2:
        return "needs traces of two or more ranks"
    if "nvml" in needs and not any(p.nvml is not None and len(p.nvml) for p in parts):
        return "no NVML samples (record the run with `gpuprof record` on a GPU machine)"
    if "spec" in needs and spec is None:
        return "the GPU is unknown (pass --gpu NAME or --gpu-spec FILE)"
    return None


def select(parts: Sequence[RankPart], spec: GpuSpec | None, only: Sequence[str] | None = None,
           registry: Sequence[Analyzer] | None = None) -> tuple[list[Analyzer], list[dict[str, str]]]:
    """The analyzers to run on this job (those named in ``only``, whose needs the traces meet)
    and, for the others that were asked for, why they were skipped."""
    active, skipped = [], []
    for a in (REGISTRY if registry is None else registry):
        if only is not None and a.name not in only:
            continue
        why = _unmet(parts, spec, a.needs)
        if why:
            skipped.append({"analyzer": a.name, "reason": why})
        else:
            active.append(a)
    return active, skipped


#: Ranking weight of a low-confidence saving: host time measured under the profiler, which ran
#: the host 1.5-2.2x slower on the real traces of docs/accuracy.md. Only the order uses it; the
#: reported saving is the estimate itself.
LOW_CONFIDENCE_WEIGHT = 0.5

#: A saving below this share of the step is no fix: a tenth of the run-to-run spread of the
#: steadiest step timings in sample_traces/ (1 %), far below what any measurement could confirm.
NEGLIGIBLE_PCT = 0.1

#: How findings are ordered, in words: the JSON report's ``ranking.by``, shown by every report.
RANKING = (f"ranked by estimated saving per step; low-confidence savings count x{LOW_CONFIDENCE_WEIGHT:g}, as "
           "host time measured under the profiler runs slow")


def ranked_saving_ms(f: Finding) -> float:
    """What a finding is ranked by: its estimated saving per step, times ``LOW_CONFIDENCE_WEIGHT``
    when its confidence is low."""
    return f.estimated_savings_ms * (LOW_CONFIDENCE_WEIGHT if f.confidence == "low" else 1.0)


def rank_findings(findings: Sequence[Finding]) -> list[Finding]:
    """Best first by :func:`ranked_saving_ms`, so a bare trace's profiler-inflated host time does
    not outrank a defect of similar size we can stand behind; then by id for a stable order."""
    return sorted(findings, key=lambda f: (-ranked_saving_ms(f), f.id))


def split_notes(findings: Sequence[Finding]) -> tuple[list[Finding], list[Finding]]:
    """(fixes, notes): a finding whose saving is positive but below ``NEGLIGIBLE_PCT`` of the step
    saves nothing a user could see, so it is a note, not a fix. Informational findings (no saving
    estimated, severity "info", e.g. memory headroom) stay with the fixes, after them."""
    notes = [f for f in findings if 0 < f.estimated_savings_pct < NEGLIGIBLE_PCT]
    return [f for f in findings if f not in notes], notes


def rank_contributions(one_rank: Analysis, active: Sequence[Analyzer], cross: Sequence[CrossCandidate] = ()
                       ) -> list[Contribution]:
    """One rank's findings after claims: the per-rank analyzers in ``active`` run on the
    one-rank analysis ``one_rank`` (its frames in memory), joined by its share of the
    cross-rank findings."""
    (part,) = one_rank.parts
    try:
        candidates: list[Candidate] = []
        for a in active:
            if a.run is not None:
                candidates.extend(a.run(one_rank))
        if cross:
            (view,) = views(one_rank)
            candidates.extend(to_candidate(cc, view) for cc in cross)
        out: list[Contribution] = claim(part.rank, candidates, part.n_steps)
        from gpuprof.views import keep_candidates  # the views' claims reuse them (no second run)

        keep_candidates(one_rank, candidates)
        return replayed(one_rank, candidates, out)
    finally:
        release_views(one_rank)


def replayed(one_rank: Analysis, candidates: Sequence[Candidate], contribs: list[Contribution]) -> list[Contribution]:
    """The rank's contributions with their fixes replayed (gpuprof.replay.fixes): each priced
    finding's evidence gets ``replay_before_ms``/``replay_after_ms``; where replay is the estimate
    (``REPLAY_USED``), its kept saving is the replayed one."""
    from gpuprof.replay import fixes

    (part,) = one_rank.parts
    contribs = [distributed.replayed_share(c, part.n_steps) for c in contribs]
    (view,) = views(one_rank)
    p = fixes.plan(view, kept_units(candidates, part.n_steps), part.unprofiled_step_ms)
    priced = fixes.price(p, part.n_steps, part.unprofiled_step_ms or part.summary.step_time_ms) if p else {}
    out = []
    for c in contribs:
        got = priced.get(c.id)
        if got is None:
            ev = c.evidence
            why = fixes.NOT_USED_WHY.get(c.category) or (fixes.NO_GRAPH_WHY if p is None else None)
            if why and c.units and "replay_before_ms" not in ev:  # a cross-rank replay fills its own
                ev = {**ev, "replay_not_used": why}
            out.append(replace(c, evidence=ev))
            continue
        ev = dict(c.evidence)
        if got["evidence"].get("estimate") == "replay" and "estimate" in ev:
            ev["estimate_inputs"] = ev.pop("estimate")  # how the fix's new times were found
        ev.update(got["evidence"])
        out.append(replace(c, evidence=ev, kept_us=float(got.get("kept_us", c.kept_us))))
    return out


def contributions_in_memory(analysis: Analysis, only: Sequence[str] | None = None,
                            registry: Sequence[Analyzer] | None = None
                            ) -> tuple[list[Contribution], list[dict[str, str]]]:
    """Every rank's contributions (and the skips) for an analysis whose ranks are in memory."""
    from gpuprof.replay.ranks import fix_steps, rank_graph

    active, skipped = select(analysis.parts, analysis.spec, only, registry)
    results = {r.trace.meta.rank: r for r in analysis.ranks}
    names = [a.name for a in active]
    cross = distributed.plan(analysis.parts, lambda slow, waits, waiting: distributed.slow_detail(
        results[slow], waits, waiting), names, replay=lambda cats: fix_steps(
        [rank_graph(r.trace) for r in analysis.ranks], analysis.parts[0].unprofiled_step_ms, cats))
    contribs: list[Contribution] = []
    for part in analysis.parts:
        one = analysis.one_rank(part.rank)
        contribs.extend(rank_contributions(one, active, cross.get(part.rank, ())))
    return contribs, skipped


def findings_of(parts: Sequence[RankPart], contribs: Sequence[Contribution]) -> list[Finding]:
    """Ranked findings from the ranks' contributions."""
    return rank_findings(merge(contribs, parts))


def run_analyzers(analysis: Analysis, only: Sequence[str] | None = None,
                  registry: Sequence[Analyzer] | None = None) -> tuple[list[Finding], list[dict[str, str]]]:
    """Run the registered analyzers (or those named in ``only``) on an analysis whose ranks are
    in memory; return ranked findings and skips. :func:`gpuprof.api.analyze` does the same with
    ranks spread over worker processes or a Dask cluster."""
    contribs, skipped = contributions_in_memory(analysis, only, registry)
    return findings_of(analysis.parts, contribs), skipped
