"""Pricing: the one home of every estimated saving.

Analyzers describe (:mod:`gpuprof.analyzers`: candidates with the units their fix would remove);
the replay builds and runs the dependency graph (:mod:`gpuprof.replay`); this module decides what
each finding is estimated to save and says how, in one place:

* one rank's findings (:func:`price_rank`): each fix replayed alone on the rank's graph, deflated
  to the host the trace allows (:func:`gpuprof.replay.host_bounds`, fed by
  :mod:`gpuprof.hostcost`); where replay is the estimate (``REPLAY_USED``) the replayed saving is
  what the finding keeps, elsewhere the sum of its claimed units, and the evidence says why;
* the cross-rank findings (:func:`price_cross`): the job's graph, every rank joined, replayed
  before and after each fix (:mod:`gpuprof.replay.job`);
* fixes applied together (:func:`projection`, :func:`what_if_rank`, :func:`what_if_job`): the
  summary's projected step time and ``Analysis.what_if`` replay the same plans the findings were
  priced on.
See docs/replay.md for the assumptions and the accuracy table.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuprof.claims import Contribution
from gpuprof.errors import GpuprofError, GpuprofWarning
from gpuprof.replay.fixes import CROSS_RANK, REGROUPING, Plan, apply

if TYPE_CHECKING:
    from gpuprof.analyzers.distributed import CrossCandidate
    from gpuprof.findings import Finding
    from gpuprof.parts import RankPart
    from gpuprof.replay.graph import Graph
    from gpuprof.replay.job import RankGraph
    from gpuprof.steptime import InputWaits
    from gpuprof.trace.model import RankTrace


#: Categories whose replayed saving is the reported estimate (``"estimate": "replay"``). Chosen on
#: the real pairs with realised savings (``python -m benchmarks.fix_replay_accuracy``, table in
#: docs/replay.md): over the category's pairs the replayed savings are in total at least as close
#: to the realised ones as the analyzer's own sum of its claims was (Σ |error|, allowing the
#: realised savings' own uncertainty: half the spread of each program's two timing windows), and
#: no pair the analyzer had within ±35 % falls outside it. The analyzers no longer sum their
#: claims for these: their units are the transformation's inputs (new kernel times, the claimed
#: gaps), and the step time replayed with and without them is the saving.
REPLAY_USED: frozenset[str] = frozenset({
    "precision", "shape_alignment", "attention_fusion", "elementwise_fusion", "optimizer_fusion",
    "launch_overhead", "input_pipeline", "pageable_memcpy", "memory_format",
    "allocator_churn", "host_stall", "compile", "host_sync", "kv_cache", "batching",
})

#: Why a priced category's replay is not its estimate.
PRICED_NOT_USED_WHY = {
    "memory_bound_decode": "no real pair with a realised saving to validate the replay on (the 8-bit fix was not run)",
    "gpu_throttling": "no real pair with a realised saving to validate the replay on",
}

#: Why a category is not priced on one rank's graph.
NOT_USED_WHY = dict.fromkeys(sorted(CROSS_RANK), "cross-rank: a rank's graph cannot see when the other ranks arrive")

BARE_HOST_WHY = ("no unprofiled step time to calibrate the replayed host on: the claimed gaps, deflated by the "
                 "trace's own estimate of the profiler's cost per event, are the estimate (--step-ms gives the replay)")

DEFAULT_WHY = "replay was not closer to the realised saving than this estimate on the real pairs (docs/replay.md)"

#: Why a finding of a replayed category kept the sum of its claims: the rank had no graph to replay.
NO_GRAPH_WHY = "no dependency graph to replay on this rank (no runtime calls or GPU work, or the replay failed)"

#: Fixes of the GPU's own work: on a bare trace their replay is the estimate (between the host floor
#: and no host); host-side fixes there keep their deflated gaps (``BARE_HOST_WHY``). compile counts
#: here: its host change follows the kernels it removes (no claimed gap is its estimate).
GPU_SIDE = frozenset({"compile", "batching", "kv_cache", "precision", "shape_alignment", "attention_fusion", "elementwise_fusion",
                      "optimizer_fusion",
                      "memory_format", "pageable_memcpy", "memory_bound_decode", "gpu_throttling"})

#: Cross-rank categories whose estimate is the job's replay (gpuprof.replay.job) when the trace
#: has two or more ranks: on the real pairs the replayed saving was at least as close to the
#: realised one as the analyzer's own arithmetic (docs/replay.md, "Cross-rank"). With one rank the
#: arithmetic stays: a collective's kernel time there mixes its transfer with waiting for ranks
#: not in the trace, which only its clip (the time GPU work was queued behind it) bounds.
CROSS_REPLAY_USED = frozenset({"exposed_communication", "rank_imbalance"})
#: Why a cross-rank category keeps its own estimate although its fix is replayed (none today).
CROSS_NOT_USED_WHY: dict[str, str] = {}

#: The job's replayed step (the slowest rank's, ms) before and after each named category's fix
#: (:func:`gpuprof.replay.job.fix_steps`), computed on demand; None: not available.
JobReplay = Callable[[Sequence[str]], "dict[str, list[float]] | None"]

#: The most trace events (all ranks) whose job graph the cross-rank replay builds in the driver:
#: a graph node is about 200 bytes and real traces make about 3 nodes per 14 events, so about
#: 1 GB at this size (8 ranks of 100k kernels are about 11M events). Above it the cross-rank
#: findings keep their own estimates, saying why.
JOB_REPLAY_MAX_EVENTS = 20_000_000

#: Cross-rank categories that claim by their own arithmetic even where replay is the estimate (see
#: :func:`_price_on_job`).
CLAIMS_BY_OWN = frozenset({"rank_imbalance"})


def _replayed_fixes(p: Plan, n_steps: int, step_ms: float) -> dict[str, dict[str, Any]]:
    """Per finding id: evidence to add (its fix replayed alone: ``replay_before_ms``,
    ``replay_after_ms``) and, for the categories in ``REPLAY_USED``, ``kept_us``: the replayed
    saving over the rank's steps. Each fix is priced alone, on the units it kept after claims (a
    unit belongs to the first finding that claims it); what fixes applied together save is the
    projection (``summary.projected_step_time_ms``, ``Analysis.what_if``): a fusion in a
    launch-bound step saves its launches alone, and nothing more once a CUDA graph removed them.

    With the unprofiled step time (:attr:`Plan.real_known`) the saving is the replayed share of the
    step, ``(before − after) / before``, of ``step_ms`` (the replay is calibrated to it, so this is
    ``before − after`` where the host is identified); without it, ``before − after``: on a bare
    trace whose first profiled step is cut short (its mean window is shorter than the
    steady-state period) a fix cannot save more than the step. Where the trace does not identify
    the unprofiled host (:attr:`Plan.free_graph`) the fix is replayed on the host floor and with
    the host taken out; the two savings bound what it realises (``replay_saving_bounds_ms``) and
    the estimate is their middle, the figure whose error is smallest in the worst case when
    nothing in the trace places the host between them."""
    out: dict[str, dict[str, Any]] = {}
    b_floor, b_free = p.bounds_ms([])
    for i in p.units:
        a_floor, a_free = p.bounds_ms([i])
        before, after = 0.5 * (b_floor + b_free), 0.5 * (a_floor + a_free)
        ev: dict[str, Any] = {"replay_before_ms": round(before, 4), "replay_after_ms": round(after, 4)}
        pairs = [(b_floor, a_floor), (b_free, a_free)]
        savings = [max(b - a, 0.0) * (step_ms / b if p.real_known and b > 0 else 1.0) for b, a in pairs]
        saved = 0.5 * (savings[0] + savings[1])
        if i in p.alone and p.categories[i] in REPLAY_USED:
            pairs_alone = list(zip((b_floor, b_free), p.alone_bounds_ms(i)))
            ev["estimated_saving_alone_ms"] = round(0.5 * sum(
                max(b - a, 0.0) * (step_ms / b if p.real_known and b > 0 else 1.0) for b, a in pairs_alone), 4)
        elif i in p.alone or p.categories[i] in REGROUPING:
            ev["estimated_saving_alone_ms"] = round(saved, 4)
        if p.free_graph is not None:
            ev["replay_saving_bounds_ms"] = {"host_floor": round(savings[0], 4), "no_host": round(savings[1], 4)}
            ev["host_floor_us_per_event"] = round(p.floor_us, 3)
        gpu_us = sum(x for u, x in p.units[i].items() if u[0] in ("k", "m"))
        if gpu_us > 0:  # the change to the GPU's own work, whether or not the step gets that much shorter
            ev["gpu_time_saved_ms_per_step"] = round(gpu_us / n_steps / 1000.0, 4)
        entry: dict[str, Any] = {"evidence": ev}
        if p.categories[i] in REPLAY_USED and not p.real_known and p.categories[i] not in GPU_SIDE:
            # a host-side fix on a bare trace: no real step to calibrate the host on, and the raw
            # host is the profiler's (torch 1.8: ~16 µs per event); the claimed gaps, deflated by
            # the trace's own profiler-cost estimate, stay the estimate (closer on the bare pairs:
            # docs/accuracy.md, and on torch 1.8's DataLoader-bound TB run: docs/corpus.md)
            ev["replay_not_used"] = BARE_HOST_WHY
        elif p.categories[i] in REPLAY_USED:
            ev["estimate"] = "replay"
            entry["kept_us"] = saved * 1000.0 * n_steps
        else:
            ev["replay_not_used"] = PRICED_NOT_USED_WHY.get(p.categories[i], DEFAULT_WHY)
        out[i] = entry
    return out


def price_rank(p: Plan | None, contribs: Sequence[Contribution], part: RankPart) -> list[Contribution]:
    """One rank's contributions priced: each finding with a fix to replay gets ``replay_before_ms``/
    ``replay_after_ms`` (its fix alone on the rank's graph ``p``), and where replay is the
    estimate (``REPLAY_USED``) its kept saving is the replayed one; a cross-rank finding keeps the
    job's replayed saving (:func:`replayed_share`). Where nothing is replayed, the evidence says
    why (``replay_not_used``)."""
    contribs = [replayed_share(c, part.n_steps) for c in contribs]
    priced = _replayed_fixes(p, part.n_steps, part.unprofiled_step_ms or part.summary.step_time_ms) if p else {}
    out = []
    for c in contribs:
        got = priced.get(c.id)
        if got is None:
            ev = c.evidence
            why = NOT_USED_WHY.get(c.category) or (NO_GRAPH_WHY if p is None else None)
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


def replayed_share(c: Contribution, n_steps: int) -> Contribution:
    """A cross-rank finding's share on one rank with the job's replayed saving (evidence
    ``replay_before_ms − replay_after_ms`` per step) as what it keeps, where replay is its
    estimate; otherwise as it is."""
    ev = c.evidence
    if c.category not in CROSS_REPLAY_USED or ev.get("estimate") != "replay" or not c.units:
        return c
    saving_ms = max(float(ev["replay_before_ms"]) - float(ev["replay_after_ms"]), 0.0)
    return replace(c, kept_us=saving_ms * 1000.0 * n_steps)


def price_cross(out: dict[int, list[CrossCandidate]], parts: Sequence[RankPart], replay: JobReplay | None) -> None:
    """The cross-rank findings (``analyzers.distributed.plan``'s shares, ``out``) priced on the
    job's replay: ``replay(categories)`` replays the job across ranks before and after each
    finding's fix (evidence ``replay_before_ms``/``replay_after_ms``: the slowest rank's step);
    for the categories of ``CROSS_REPLAY_USED`` that replayed saving is the estimate
    (:func:`replayed_share`) and the claim order. A job above ``JOB_REPLAY_MAX_EVENTS`` is not
    replayed: its findings keep their own estimate and say why."""
    if replay is None or not out or len(parts) < 2:
        return
    events = sum(p.meta.events for p in parts)
    if events <= JOB_REPLAY_MAX_EVENTS:
        _price_on_job(out, replay)
    else:
        for cc in {id(cc): cc for ccs in out.values() for cc in ccs}.values():
            cc.evidence["replay_not_used"] = (f"the job's {events:,} trace events are more than the cross-rank "
                                              f"replay builds in one process ({JOB_REPLAY_MAX_EVENTS:,})")


def _price_on_job(out: dict[int, list[CrossCandidate]], replay: JobReplay) -> None:
    found = {cc.category: cc for ccs in out.values() for cc in ccs}
    try:
        got = replay(sorted(found))
    except GpuprofError:
        return
    if got is None:
        return
    saving: dict[str, float] = {}
    for category, cc in found.items():
        before, after = got[category]
        if not (np.isfinite(before) and np.isfinite(after)):
            continue
        # one evidence dict is shared by the finding's shares on every rank
        cc.evidence.update(replay_before_ms=round(before, 4), replay_after_ms=round(after, 4))
        if category in CROSS_REPLAY_USED:
            cc.evidence["estimate"] = "replay"
            saving[category] = max(before - after, 0.0)
        else:
            cc.evidence["replay_not_used"] = CROSS_NOT_USED_WHY.get(category, "")
    # Claim order: the replayed saving for the job, except where the finding takes the slow ranks'
    # idle gaps inside the others' waits as the same lost time (``CLAIMS_BY_OWN``): there the
    # per-rank host findings (input_pipeline, host_work) claim those gaps by their own sum of claims,
    # and so does this one, by the waits; else a replay a little below that sum hands the slow
    # rank's busy stretch to a per-rank finding that prices the same time again.
    for rank, ccs in out.items():
        out[rank] = [replace(cc, priority_ms=saving[cc.category])
                     if cc.category in saving and cc.category not in CLAIMS_BY_OWN else cc for cc in ccs]


def finite(x: Any) -> float | None:
    """``x`` as a float, or None where it is not a finite number (what reports show as null)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) else None


def unchanged_ms(p: Plan | None, trace: RankTrace) -> float | None:
    """One rank's unchanged trace replayed alone: its mean step window (ms), on the graph its
    findings were priced on (``p``) when there is one; None where it cannot be replayed. Its gap
    to the traced step time is the replay's own error (``summary.replay_step_time_ms``)."""
    from gpuprof.replay import replay
    from gpuprof.replay.run import run

    try:
        got = run(p.raw).step_time_ms if p is not None else replay(trace).step_time_ms
    except GpuprofError as e:
        # not the end of the report: a note on it (gpuprof.document) and this line on stderr
        warnings.warn(GpuprofWarning(f"no replay: {e}"), stacklevel=2)
        return None
    return got if np.isfinite(got) else None


#: Confidences whose fixes the summary's projection applies together.
PROJECTED_CONFIDENCE = ("high", "medium")

NO_PROJECTION: dict[str, Any] = {"projected_step_time_ms": None, "projected_findings": []}


def projection(p: Plan | None, findings: Sequence[Finding]) -> dict[str, Any]:
    """One rank: ``projected_step_time_ms``, every high- and medium-confidence fix applied in one
    replay of the plan its findings were priced on, which findings that is
    (``projected_findings``, in the report's order) and the replayed step before them
    (``projected_from_ms``)."""
    if not findings or p is None:
        return dict(NO_PROJECTION)
    ids = [f.id for f in findings if f.confidence in PROJECTED_CONFIDENCE and f.id in p.units]
    if not ids:
        return dict(NO_PROJECTION)
    return {"projected_step_time_ms": finite(p.after_ms(ids)), "projected_findings": ids,
            "projected_from_ms": finite(p.before_ms)}


def with_input_waits(figures: dict[str, Any], waits: InputWaits, findings: Sequence[Finding]) -> dict[str, Any]:
    """The projection's figures (replayed on the step without the DataLoader waits the profiled
    steps missed: :class:`gpuprof.steptime.InputWaits`) as the program runs: from its real mean
    step, with the waits' own fix among those applied where it is projected (high or medium
    confidence), else the waits kept on top of the replayed step."""
    from gpuprof.steptime import INPUT_WAIT_ID

    wait = next((f for f in findings if f.id == INPUT_WAIT_ID), None)
    applied = wait is not None and wait.confidence in PROJECTED_CONFIDENCE
    ids = list(figures.get("projected_findings") or [])
    after = figures.get("projected_step_time_ms")
    before = figures.get("projected_from_ms")
    if after is None:  # no other fix projected: the waits alone
        if not applied:
            return {}
        return {"projected_step_time_ms": waits.typical_ms, "projected_findings": [INPUT_WAIT_ID],
                "projected_from_ms": waits.unprofiled_ms}
    order = [f.id for f in findings]
    if applied:
        ids = sorted([*ids, INPUT_WAIT_ID], key=lambda i: order.index(i) if i in order else len(order))
    return {"projected_step_time_ms": as_run(after, waits, applied), "projected_findings": ids,
            "projected_from_ms": (before + waits.saving_ms) if before is not None else waits.unprofiled_ms}


def as_run(replayed_ms: float, waits: InputWaits, loader_fixed: bool) -> float:
    """A step replayed on the step without the DataLoader waits (:class:`gpuprof.steptime.InputWaits`)
    as the program would run it: with the loader's fix, the replay itself; without it, the waits
    on top and never shorter than the loader's pace (it gives a batch every ``unprofiled_ms``)."""
    return replayed_ms if loader_fixed else max(replayed_ms + waits.saving_ms, waits.unprofiled_ms)


def what_if_rank(p: Plan, ids: Sequence[str]) -> dict[str, Any]:
    """One rank: the replayed steady-state step with the fixes of ``ids`` applied together, beside
    the unchanged replay, and the time per step by class after them."""
    ids = list(ids)
    return {"before_ms": p.before_ms, "step_time_ms": p.after_ms(ids), "by_class_ms": p.by_class_ms(ids),
            "applied": sorted(i for i in set(ids) if i in p.units),
            "not_applied": sorted(i for i in set(ids) if i not in p.units)}


#: Cross-rank categories whose fix is a transformation of the job graph (gpuprof.replay.job.cross_fix).
CROSS_FIXES = ("rank_imbalance", "exposed_communication")


def what_if_job(plans: Sequence[Plan | None], traces: Sequence[RankTrace], parts: Sequence[RankPart],
                findings: Sequence[Finding], ids: Sequence[str], cost_us: float | None = None,
                graphs: Sequence[RankGraph] | None = None, before_ms: float | None = None,
                joined: Graph | None = None) -> dict[str, Any]:
    """Several ranks: each rank's findings applied to its part of the job graph as for one rank
    (its plan's units), the cross-rank ones by their cross-rank transformation; step times are the
    slowest rank's steady-state step. The plans are those the ranks' findings were priced on; the
    job is deflated by ``cost_us`` per recorded host event where the cross-rank findings' replay
    found it (else calibrated here). ``graphs``: the ranks' graphs ready to join, where the
    cross-rank replay made them (the plans' own graphs, built once); ``before_ms``: the job's
    replayed step that replay found on them with this ``cost_us`` (not replayed again);
    ``joined``: the job graph it joined them to and deflated by ``cost_us`` (not joined again).
    ``by_class_ms`` is not computed."""
    from gpuprof.replay.job import cross_fix, job, rank_graph, slowest_ms

    if sum(p.meta.events for p in parts) > JOB_REPLAY_MAX_EVENTS:
        raise GpuprofError(f"what-if: the job's trace events are more than the cross-rank replay builds in one "
                           f"process ({JOB_REPLAY_MAX_EVENTS:,})")
    ids = list(ids)
    # the graphs the findings were priced on (as traced), joined: no rank's graph built twice
    ready = graphs is not None and len(graphs) == len(traces)
    rank_graphs = (list(graphs) if graphs is not None and ready
                   else [rank_graph(t, p.raw if p is not None else None) for t, p in zip(traces, plans)])
    g = joined if ready and joined is not None else job(rank_graphs, parts[0].unprofiled_step_ms, cost_us)
    before = slowest_ms(g) if before_ms is None or not ready else before_ms
    by_id = {f.id: f for f in findings}
    applied: set[str] = set()
    after = g
    for p in plans:
        if p is None:
            continue
        compiled = p.compiled(ids)
        for i in p.order(ids):
            after = apply(after, p.view, p.categories[i], p.units[i], p.regroups.get(i), compiled=compiled)
            applied.add(i)
    for i in sorted(set(ids)):
        cat = by_id[i].category if i in by_id else None
        if cat in CROSS_FIXES:
            after = cross_fix(cat, after, rank_graphs)
            applied.add(i)
    return {"before_ms": before, "step_time_ms": slowest_ms(after), "by_class_ms": None,
            "applied": sorted(applied), "not_applied": sorted(set(ids) - applied)}


def job_projection(plans: Sequence[Plan | None], traces: Sequence[RankTrace], parts: Sequence[RankPart],
                   findings: Sequence[Finding], cost_us: float | None = None,
                   graphs: Sequence[RankGraph] | None = None, before_ms: float | None = None,
                   joined: Graph | None = None) -> dict[str, Any]:
    """Several ranks: the projection as :func:`what_if_job` of every high- and medium-confidence
    finding it can apply, so the two agree by construction (``graphs``, ``before_ms``, ``joined``:
    as there)."""
    ids = [f.id for f in findings if f.confidence in PROJECTED_CONFIDENCE]
    if not ids:
        return dict(NO_PROJECTION)
    try:
        w = what_if_job(plans, traces, parts, findings, ids, cost_us, graphs, before_ms, joined)
    except GpuprofError:
        return dict(NO_PROJECTION)
    applied = [i for i in ids if i in w["applied"]]
    if not applied:
        return dict(NO_PROJECTION)
    return {"projected_step_time_ms": finite(w["step_time_ms"]), "projected_findings": applied,
            "projected_from_ms": finite(w["before_ms"])}
