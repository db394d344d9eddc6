"""Claims: the units of work a finding would remove, and how findings share them without counting
any time twice.

Savings are claimed on *units*: a kernel instance ``("k", rank, row)``, a copy ``("m", rank, row)``,
an idle gap on the GPU timeline ``("gap", rank, i)`` (row ``i`` of the rank's classified gaps,
:func:`gpuprof.idle.classify_gaps`) or a stretch of one-off host work after a step
``("tail", rank, step)``. An analyzer returns :class:`Candidate` s whose ``units`` map each unit
its fix would shorten to the µs it would save there (summed over the profiled steps): the
description of the fix that the replay prices (:mod:`gpuprof.replay.fixes`). :func:`claim` gives
each unit to the first finding that claims it, so overlapping findings (a softmax that is both
unfused attention and an elementwise chain) never count the same time twice (a whole-GPU
condition, :attr:`Candidate.scale`, owns no unit and counts a share of what the owners leave);
:func:`merge` turns the ranks' shares into one :class:`~gpuprof.findings.Finding` each;
:func:`rank_findings` orders them and :func:`split_notes` sets apart those that save next to
nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.findings import Finding

Unit = tuple[Any, ...]


@dataclass(frozen=True)
class Candidate:
    id: str
    category: str
    title: str
    confidence: str
    recommendation: str
    units: dict[Unit, float]  # µs saved per unit, over all profiled steps of that unit's rank
    evidence: dict[str, Any] = field(default_factory=dict)
    generic: bool = False  # a catch-all (launch overhead): claims only what specific findings left
    informational: bool = False  # reported with no saving (severity "info"), e.g. memory headroom
    priority_ms: float | None = None  # claim order on its rank; default: its own saving per step there
    #: For a fix that regroups its kernels (``compile``): per kernel row, the kernel it fuses into
    #: (``group``, -1 for one that stays) and its share of the new kernel's time (``after_us``), as
    #: ``analyzers.compile_fusion.inductor_plan`` models Inductor. The replay runs each group as one
    #: kernel (gpuprof.replay.fixes).
    regroup: pd.DataFrame | None = field(default=None, compare=False, repr=False)
    #: A whole-GPU condition (clocks held below their maximum: ``gpu_throttling``), not work a fix
    #: removes: the share of each unit's time it would save, of whatever the findings that own the
    #: unit leave of it. Such a candidate owns no unit: it is claimed after every other one, takes
    #: no unit from them, and counts on each unit ``scale`` × what they left there.
    scale: float | None = None


@dataclass(frozen=True)
class Described:
    """What a finding says, whatever stage it is at."""

    id: str
    category: str
    title: str
    confidence: str
    recommendation: str
    evidence: dict[str, Any]


@dataclass(frozen=True)
class Contribution(Described):
    """A finding's share on one rank after claims: what it keeps there and what it asked for.
    Small (no units), so ranks analysed apart send these to be merged."""

    rank: int
    generic: bool
    informational: bool
    units: int  # how many units it asked for on this rank
    kept_us: float  # µs over the rank's profiled steps that no earlier finding had claimed
    total_us: float  # µs it asked for


def claim(rank: int, candidates: Sequence[Candidate], n_steps: int) -> list[Contribution]:
    """Give each of one rank's units to the first finding that claims it and return each finding's
    share. Order: specific before generic (idle gaps between an unfused optimizer's kernels belong
    to "fuse the optimizer", not to "launch overhead"), then by ``priority_ms`` (a cross-rank
    finding's saving for the whole job) or else the finding's own saving per step on this rank,
    largest first. Units claimed with 0 µs are still taken from later findings. A whole-GPU
    condition (:attr:`Candidate.scale`) comes last and keeps every unit at its share of what the
    owners left there, so the findings' savings add up to the fixes applied together."""
    return _contributions(rank, _assign(candidates, n_steps))


def _contributions(rank: int, assigned: Sequence[tuple[Candidate, dict[Unit, float]]]) -> list[Contribution]:
    out = []
    for c, kept in assigned:
        out.append(Contribution(id=c.id, category=c.category, title=c.title, confidence=c.confidence,
                                recommendation=c.recommendation, evidence=c.evidence, rank=rank, generic=c.generic,
                                informational=c.informational, units=len(c.units), kept_us=float(sum(kept.values())),
                                total_us=float(sum(c.units.values()))))
    return out


def _assign(candidates: Sequence[Candidate], n_steps: int) -> list[tuple[Candidate, dict[Unit, float]]]:
    """Each candidate in claim order with the units it keeps (see :func:`claim`)."""
    def key(c: Candidate) -> tuple[bool, bool, float, str]:
        p = c.priority_ms if c.priority_ms is not None else sum(c.units.values()) / n_steps / 1000.0
        return (c.scale is not None, c.generic, -p, c.id)

    taken: dict[Unit, float] = {}  # µs each owned unit's owner saves there
    out = []
    for c in sorted(candidates, key=key):
        if c.scale is not None:
            s = c.scale
            kept = {u: max(v - s * taken.get(u, 0.0), 0.0) for u, v in c.units.items()}
        else:
            kept = {u: v for u, v in c.units.items() if u not in taken}
            taken.update(kept)
        out.append((c, kept))
    return out


@dataclass(frozen=True)
class Claimed:
    """One candidate's share of one rank after claims: the units it keeps (``kept``, in its own
    order) and, where earlier findings took some, every unit it asked for (``asked``), with what
    the replay needs to price it (category, confidence, claim order, a regrouping). Made where the
    rank is analysed and kept: the views draw it, the projection and ``what_if`` price it again,
    and nothing runs the analyzers a second time."""

    id: str
    category: str
    confidence: str
    informational: bool
    priority_ms: float | None
    kept: dict[Unit, float]
    asked: dict[Unit, float]
    regroup: pd.DataFrame | None = field(default=None, compare=False, repr=False)
    #: :attr:`Candidate.scale` (a whole-GPU condition): ``asked`` then holds every unit at its
    #: share of the unit's whole time, the factor the replay applies after the owners' fixes
    scale: float | None = None


def claimed(candidates: Sequence[Candidate], n_steps: int) -> tuple[Claimed, ...]:
    """Each candidate in claim order with the units it keeps (see :func:`claim`)."""
    return _claimed(_assign(candidates, n_steps))


def _claimed(assigned: Sequence[tuple[Candidate, dict[Unit, float]]]) -> tuple[Claimed, ...]:
    return tuple(Claimed(c.id, c.category, c.confidence, c.informational, c.priority_ms, kept,
                         c.units if len(kept) < len(c.units) or c.scale is not None else kept, c.regroup,
                         c.scale)
                 for c, kept in assigned)


def rank_claims(rank: int, candidates: Sequence[Candidate], n_steps: int
                ) -> tuple[tuple[Claimed, ...], list[Contribution]]:
    """:func:`claimed` and :func:`claim` of one rank's candidates from one assignment of its units
    (a big rank's candidates ask for 10^5 units: assigning them twice cost a rank 5-8 ms)."""
    assigned = _assign(candidates, n_steps)
    return _claimed(assigned), _contributions(rank, assigned)


def owned_units(claims: Sequence[Claimed]) -> dict[str, dict[Unit, float]]:
    """The units each finding keeps on one rank, by finding id: exactly the time :func:`claim`
    counts for it (what the report and annotated traces show a finding owns)."""
    out: dict[str, dict[Unit, float]] = {}
    for c in claims:
        out.setdefault(c.id, {}).update(c.kept)
    return out


#: How a rank's claims travel through the results cache: one row per unit (``unit_columns``).
CLAIM_KINDS = ("k", "m", "gap", "tail")


def _units_frame(units: dict[Unit, float]) -> pd.DataFrame:
    keys = list(units)
    return pd.DataFrame({"kind": np.array([CLAIM_KINDS.index(u[0]) for u in keys], dtype=np.int64),
                         "rank": np.array([int(u[1]) for u in keys], dtype=np.int64),
                         "row": np.array([int(u[2]) for u in keys], dtype=np.int64),
                         "saved_us": np.array([units[u] for u in keys], dtype=np.float64)})


def _frame_units(f: pd.DataFrame) -> dict[Unit, float]:
    kinds = [CLAIM_KINDS[int(k)] for k in f["kind"].to_numpy()]
    return dict(zip(zip(kinds, f["rank"].tolist(), f["row"].tolist()), f["saved_us"].tolist()))


@dataclass(frozen=True)
class ClaimedRecord:
    """:class:`Claimed` as plain columns (what the results cache stores)."""

    id: str
    category: str
    confidence: str
    informational: bool
    priority_ms: float | None
    kept: pd.DataFrame
    asked: pd.DataFrame | None
    regroup: pd.DataFrame | None
    scale: float | None = None


def to_records(claims: Sequence[Claimed]) -> tuple[ClaimedRecord, ...]:
    return tuple(ClaimedRecord(c.id, c.category, c.confidence, c.informational, c.priority_ms,
                               _units_frame(c.kept), None if c.asked is c.kept else _units_frame(c.asked),
                               c.regroup, c.scale) for c in claims)


def from_records(records: Sequence[ClaimedRecord]) -> tuple[Claimed, ...]:
    out = []
    for r in records:
        kept = _frame_units(r.kept)
        out.append(Claimed(r.id, r.category, r.confidence, r.informational, r.priority_ms, kept,
                           kept if r.asked is None else _frame_units(r.asked), r.regroup, r.scale))
    return tuple(out)


def claimed_units(candidates: Sequence[Candidate], n_steps: int) -> dict[str, dict[Unit, float]]:
    """The units each finding keeps on one rank after claims, by finding id: exactly the time
    :func:`claim` counts for it (what the report and annotated traces show a finding owns)."""
    out: dict[str, dict[Unit, float]] = {}
    for c, kept in _assign(candidates, n_steps):
        out.setdefault(c.id, {}).update(kept)
    return out


#: Each candidate in claim order with the units it keeps (what the replay prices).
kept_units = _assign



def merge(contributions: Iterable[Contribution], steps: Mapping[int, int], step_ms: Mapping[int, float]
          ) -> list[Finding]:
    """One Finding per id from the ranks' contributions.

    A finding's saving per step is the largest over ranks of (µs it keeps on that rank) / (that
    rank's steps): ranks of one job step together, so the slowest rank's gain is the job's. Title
    and evidence come from the rank where it asked for most. Percentages are of each rank's step
    time ``step_ms`` (the unprofiled step when it is known, else the traced one); ``steps`` is each
    rank's number of profiled steps. A finding that saves nothing is left out, unless its fix
    removes GPU work (:func:`_gpu_held_ms`) that the replayed step does not get shorter by (the
    host, or other work, sets the step after it): then it is kept at no saving, marked
    ``replayed_step_no_shorter``, a note (:func:`split_notes`), so the report says what the fix
    would do and why it is not ranked (for a category whose estimate is its own arithmetic, not the
    replay, such as memory_bound_decode, the title says its estimate saves no step time).
    """
    by_id: dict[str, list[Contribution]] = {}
    for c in contributions:
        by_id.setdefault(c.id, []).append(c)
    out: list[Finding] = []
    for cs in by_id.values():
        with_units = [c for c in cs if c.units]
        best = cs[0]
        for c in cs[1:]:
            if c.total_us / steps[c.rank] > best.total_us / steps[best.rank]:
                best = c
        if with_units:
            top = max(with_units, key=lambda c: c.kept_us / steps[c.rank])
            saving, rank = top.kept_us / steps[top.rank] / 1000.0, top.rank
            total = max(c.total_us / steps[c.rank] for c in with_units) / 1000.0
        else:
            saving, rank, total = 0.0, next(iter(steps)), 0.0
        saving = min(saving, step_ms[rank])
        held = _gpu_held_ms(top, step_ms[rank]) if with_units and saving <= 0 else 0.0
        if saving <= 0 and not best.informational and not held:
            continue
        pct = 100.0 * saving / step_ms[rank] if step_ms[rank] > 0 else 0.0
        ev = dict(best.evidence)
        title = best.title
        if held:  # a note (split_notes): what the fix does to the GPU, though the step keeps its time
            ev["replayed_step_no_shorter"] = True
            why = ("the replayed step is no shorter" if top.evidence.get("estimate") == "replay"
                   else "its estimate saves no step time")  # a category that prices itself
            title += f" (removes {held:.2f} ms of GPU time a step, but {why})"
        if len(cs) > 1:
            ev["ranks"] = sorted({c.rank for c in with_units})
        if total - saving > 1e-6:
            ev["overlap_ms_counted_elsewhere"] = round(total - saving, 4)
        out.append(Finding(id=best.id, category=best.category, title=title, estimated_savings_ms=saving,
                           estimated_savings_pct=pct, confidence=best.confidence,  # type: ignore[arg-type]
                           recommendation=best.recommendation, evidence=ev))
    return out



def _gpu_held_ms(c: Contribution, step_ms: float) -> float:
    """The GPU time per step (ms) a fix the replay prices at no step saving still removes (evidence
    ``gpu_time_saved_ms_per_step``, :mod:`gpuprof.pricing`), where it is at least
    ``NEGLIGIBLE_PCT`` of the step; 0 otherwise."""
    gpu = float(c.evidence.get("gpu_time_saved_ms_per_step", 0.0) or 0.0)
    return gpu if step_ms > 0 and 100.0 * gpu / step_ms >= NEGLIGIBLE_PCT else 0.0


def units_of(kind: str, rank: int, rows: Iterable[int], saved_us: np.ndarray | pd.Series) -> dict[Unit, float]:
    """``{(kind, rank, row): µs}`` for the rows that save something, built in C from whole
    columns (a big trace has 10^5-10^6 kernel units; a Python loop over them was the cost)."""
    saved = np.asarray(saved_us, dtype=float)
    idx = np.asarray(rows if isinstance(rows, (np.ndarray, pd.Index, pd.Series)) else list(rows), dtype=np.int64)
    m = saved > 0
    n = int(m.sum())
    return dict(zip(zip(repeat(kind, n), repeat(rank, n), idx[m].tolist()), saved[m].tolist()))


def gap_units(rank: int, g: pd.DataFrame, saved_us: pd.Series | np.ndarray | None = None) -> dict[Unit, float]:
    return units_of("gap", rank, g.index, g["dur"] if saved_us is None else saved_us)


# --- ranking ---------------------------------------------------------------------------------

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
    saves nothing a user could see, so it is a note, not a fix; so is one whose GPU work the replay
    removes without shortening the step (evidence ``replayed_step_no_shorter``, :func:`merge`). Informational
    findings (no saving estimated, severity "info", e.g. memory headroom) stay with the fixes,
    after them."""
    notes = [f for f in findings
             if 0 < f.estimated_savings_pct < NEGLIGIBLE_PCT or f.evidence.get("replayed_step_no_shorter") is True]
    return [f for f in findings if f not in notes], notes
