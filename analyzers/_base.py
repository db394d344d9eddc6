"""What every analyzer shares: per-rank views, the idle gaps, and savings that never count twice.

Savings are claimed on *units*: a kernel instance ``("k", rank, row)`` or an idle gap on the GPU
timeline ``("gap", rank, i)``. An analyzer returns :class:`Candidate` s whose ``units`` map each
unit it would shorten to the µs it would save there (summed over the profiled steps). The
registry ranks candidates by total saving and gives each unit to the first finding that claims
it, so overlapping findings (a softmax that is both unfused attention and an elementwise chain)
never count the same time twice.

Kernel durations in a trace are what they would be without the profiler; host time is not:
torch.profiler with ``record_shapes`` adds a cost to every CPU op and runtime call it records
(the host ran 1.5–2.2× slower in docs/verification.md). Savings from faster GPU work are taken as
measured. Idle gaps caused by the host are deflated event by event: when the real (unprofiled)
step time is known (``--step-ms``, or measured by ``gpuprof record``), the profiler's cost per
recorded host event is ``c = (traced step − real step) / host events per step``, and a gap
holding n recorded events would have lasted ``max(0, gap − c·n)``. The real idle time per step
cannot exceed real step − GPU busy time; it is given out to sync bubbles first (device round
trips, little host work), then input stalls, then launch gaps (host work throughout, which the
profiler inflates most). Without the real step time gaps are taken as traced, at lower
confidence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpuprof.findings import Finding
from gpuprof.ranks import event_cost_us
from gpuprof.trace.names import SYNC_CALLS as SYNC_CALLS  # the one table (ROCm too); analyzers import it from here

if TYPE_CHECKING:
    from gpuprof.api import Analysis, RankResult
    from gpuprof.ranks import RankPart

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


class RankView:
    """One rank's kernels with their roofline columns, restricted to the profiled steps."""

    def __init__(self, r: RankResult) -> None:
        t = r.trace
        self.rank = t.meta.rank
        self.trace = t
        self.steps = t.steps
        self.n_steps = max(len(t.steps), 1)
        k = pd.concat([t.kernels, r.roofline], axis=1)
        self.kernels = k[k["step"] >= 0] if (k["step"] >= 0).any() else k
        self.step_time_us = float(r.summary.steps["time_us"].mean()) if len(r.summary.steps) else 0.0
        real = analysis_step_ms(r)
        self.host_scale_known = real is not None
        host = pd.concat([t.ops.loc[t.ops["step"] >= 0, "ts"], t.runtime.loc[t.runtime["step"] >= 0, "ts"]])
        # The profiler's cost per recorded host event (µs), from the traced vs. the real step time.
        self.event_cost_us, self.host_events_per_step = event_cost_us(r)
        g = classify_gaps(r)
        starts = np.sort(host.to_numpy())
        n = np.searchsorted(starts, g["end"].to_numpy()) - np.searchsorted(starts, g["start"].to_numpy())
        real_dur = np.maximum(0.0, g["dur"].to_numpy() - self.event_cost_us * n)
        if real:
            busy_us = self.step_time_us * (100.0 - r.summary.breakdown_pct["idle"]) / 100.0
            budget = max(0.0, real * 1000.0 - busy_us) * self.n_steps
            for cause in ("sync", "input", "launch", "other"):
                m = (g["cause"] == cause).to_numpy()
                total = real_dur[m].sum()
                if total > budget:
                    real_dur[m] *= budget / total
                budget = max(0.0, budget - real_dur[m].sum())
        self.gaps = g.assign(events=n, real_dur=real_dur)

    def kernel_units(self, rows: Iterable[int], saved_us: np.ndarray | pd.Series) -> dict[Unit, float]:
        saved = np.asarray(saved_us, dtype=float)
        return {("k", self.rank, int(i)): float(s) for i, s in zip(rows, saved) if s > 0}

    def inner_gap_units(self, rows: Iterable[int], exclude_first: Iterable[int] = (), after: bool = False
                        ) -> dict[Unit, float]:
        """The idle gaps just before the given kernels (and just after them, with ``after``), less
        the profiler's share: a fix that replaces those kernels also removes these launch gaps."""
        g = self.gaps
        if g.empty:
            return {}
        want = set(int(r) for r in rows) - set(int(r) for r in exclude_first)
        hit = (g["next_kind"] == "kernel").to_numpy() & g["next_row"].isin(want).to_numpy()
        if after:
            hit |= (g["prev_kind"] == "kernel").to_numpy() & g["prev_row"].isin(set(int(r) for r in rows)).to_numpy()
        m = hit & g["cause"].isin(["launch", "other"]).to_numpy()
        sel = g[m]
        return {("gap", self.rank, int(i)): float(d) for i, d in zip(sel.index, sel["real_dur"]) if d > 0}

    def in_optimizer(self) -> pd.Series:
        """Kernels launched inside an ``Optimizer.step#...`` span (torch.optim records one per step)."""
        a = self.trace.annotations
        spans = a[~a["on_gpu"] & a["name"].astype(str).str.startswith("Optimizer.step#")].sort_values("ts")
        k = self.kernels
        if spans.empty:
            return pd.Series(False, index=k.index)
        st, en = spans["ts"].to_numpy(), spans["end"].to_numpy()
        i = np.searchsorted(st, k["launch_ts"].to_numpy(), side="right") - 1
        inside = (i >= 0) & (k["launch_ts"].to_numpy() < en[np.maximum(i, 0)])
        return pd.Series(inside, index=k.index)

    def host_confidence(self, otherwise: str = "high") -> str:
        """Confidence of a host-side estimate: lower when the unprofiled step time is unknown."""
        return otherwise if self.host_scale_known else "low"


def analysis_step_ms(r: RankResult) -> float | None:
    """The rank's step time measured without the profiler, when the run or the user gave it."""
    v = getattr(r, "unprofiled_step_ms", None)
    return float(v) if v else None


_GAP_COLUMNS = ["step", "start", "end", "dur", "prev_kind", "prev_row", "next_kind", "next_row", "next_launch_ts",
                "next_op"]


def gaps(r: RankResult) -> pd.DataFrame:
    """Idle intervals of the GPU inside step windows, with what ended the gap.

    Columns: step, start, end, dur, prev_kind/prev_row (what ran last before the gap),
    next_kind (kernel/memcpy), next_row, next_launch_ts, next_op (row of ops or -1).
    Vectorised over all steps at once: each activity is listed once per step window it overlaps.
    """
    t = r.trace
    acts = pd.concat([
        t.kernels[["ts", "end", "launch_ts", "op"]].assign(kind="kernel", row=t.kernels.index),
        t.memcpys[["ts", "end", "launch_ts", "op"]].assign(kind="memcpy", row=t.memcpys.index),
    ], ignore_index=True).sort_values("ts", kind="stable").reset_index(drop=True)
    steps = t.steps.sort_values("start", kind="stable")
    st_start, st_end, st_no = (steps["start"].to_numpy(), steps["end"].to_numpy(), steps["step"].to_numpy())
    if acts.empty or steps.empty or (np.diff(st_end) < 0).any():
        return pd.DataFrame(columns=_GAP_COLUMNS)
    ts, en = acts["ts"].to_numpy(), acts["end"].to_numpy()
    lo = np.searchsorted(st_end, ts, side="right")  # first step ending after the activity starts
    hi = np.searchsorted(st_start, en, side="left")  # steps starting before it ends: [lo, hi)
    cnt = np.maximum(hi - lo, 0)
    act = np.repeat(np.arange(len(acts)), cnt)
    step_i = np.repeat(lo, cnt) + (np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt))
    order = np.lexsort((act, step_i))
    act, step_i = act[order], step_i[order]
    if not len(act):
        return pd.DataFrame(columns=_GAP_COLUMNS)
    first = np.r_[True, step_i[1:] != step_i[:-1]]
    grp = np.cumsum(first) - 1
    ends = en[act]
    run_max = pd.Series(ends).groupby(grp).cummax().to_numpy()
    prev_max = np.where(first, -np.inf, np.r_[-np.inf, run_max[:-1]])
    busy_until = np.maximum(prev_max, st_start[step_i])
    # the activity that ended last before each one: the latest to set its step's running maximum
    pos = np.arange(len(act))
    setter = pd.Series(np.where(ends == run_max, pos, -1)).groupby(grp).cummax().to_numpy()
    last = np.where(first, -1, np.r_[-1, setter[:-1]])
    idle = ts[act] - busy_until
    keep = idle > 0
    prev_act = act[np.maximum(last, 0)]
    kind, row = acts["kind"].to_numpy(), acts["row"].to_numpy()
    has_prev = last >= 0
    prev_kind = kind[prev_act].astype(object)
    prev_kind[~has_prev] = None
    return pd.DataFrame({
        "step": st_no[step_i][keep], "start": busy_until[keep], "end": ts[act][keep], "dur": idle[keep],
        "prev_kind": prev_kind[keep],
        "prev_row": np.where(has_prev, row[prev_act], -1)[keep],
        "next_kind": kind[act][keep], "next_row": row[act][keep],
        "next_launch_ts": acts["launch_ts"].to_numpy()[act][keep], "next_op": acts["op"].to_numpy()[act][keep],
    })


_LOADER = r"DataLoader|dataloader|_next_data|__next__"


def classify_gaps(r: RankResult) -> pd.DataFrame:
    """Each idle gap with one cause, so the host-side analyzers never share a gap:

    * ``sync``: a synchronising call (``.item()``, ``.cpu()``, ``synchronize``) returned inside
      the gap: the GPU drained its queue and waits for the host to refill it; and the launch
      gaps that follow such a call until the host is ahead of the GPU again (some kernel queued
      before the previous one ended), since without the sync the host would still be ahead;
    * ``input``: the host was inside a DataLoader span during the gap;
    * ``launch``: the next kernel was launched only after the gap began: the host could not
      launch fast enough;
    * ``other``: the next work was already queued (dependencies, events across streams).
    """
    t = r.trace
    g = gaps(r)
    if g.empty:
        return g.assign(cause=pd.Series(dtype=object))
    cause = np.full(len(g), "other", dtype=object)
    late = ~(g["next_launch_ts"].to_numpy() <= g["start"].to_numpy())
    cause[late] = "launch"
    cpu = t.annotations[~t.annotations["on_gpu"]]
    spans = pd.concat([cpu[["name", "ts", "end"]], t.ops.loc[t.ops["depth"] == 0, ["name", "ts", "end"]]])
    loader = spans[spans["name"].astype(str).str.contains(_LOADER)]
    if len(loader):
        ls, le = np.sort(loader["ts"].to_numpy()), loader["end"].to_numpy()[np.argsort(loader["ts"].to_numpy())]
        k = np.searchsorted(ls, g["end"].to_numpy(), side="right") - 1
        kk = np.maximum(k, 0)
        inside = (k >= 0) & (le[kk] > g["start"].to_numpy())
        cause[inside & late] = "input"
    rt = t.runtime
    syncs = rt[rt["name"].astype(str).isin(SYNC_CALLS)]
    if len(syncs):
        se = np.sort(syncs["end"].to_numpy())
        lo = np.searchsorted(se, g["start"].to_numpy(), side="left")
        hi = np.searchsorted(se, g["end"].to_numpy(), side="right")
        drained = hi > lo
        # Refill gaps: launch gaps after the latest sync with no backlog regained in between.
        acts = pd.concat([t.kernels[["ts", "end", "launch_ts"]], t.memcpys[["ts", "end", "launch_ts"]]]
                         ).sort_values("ts", kind="stable")
        nxt = acts["launch_ts"].shift(-1).to_numpy()
        ahead = np.sort(acts["end"].to_numpy()[nxt <= acts["end"].to_numpy()])
        last_sync = np.where(lo > 0, se[np.maximum(lo - 1, 0)], -np.inf)
        regained = np.searchsorted(ahead, g["start"].to_numpy()) - np.searchsorted(ahead, last_sync)
        refill = (cause == "launch") & (lo > 0) & (regained == 0)
        cause[drained | refill] = "sync"
    return g.assign(cause=cause)


def gap_units(rank: int, g: pd.DataFrame, saved_us: pd.Series | np.ndarray | None = None) -> dict[Unit, float]:
    saved = g["dur"].to_numpy() if saved_us is None else np.asarray(saved_us, dtype=float)
    return {("gap", rank, int(i)): float(s) for i, s in zip(g.index, saved) if s > 0}


HOST_NOTE = ("host time is as traced; torch.profiler slows the host (1.5-2.2x in docs/verification.md), so pass "
             "--step-ms with the step time measured without the profiler to scale this estimate")


_VIEWS: dict[int, tuple[Analysis, list[RankView]]] = {}


def views(analysis: Analysis) -> list[RankView]:
    """Per-rank views, built once per analysis while the analyzers run (see ``release_views``)."""
    hit = _VIEWS.get(id(analysis))
    if hit is not None and hit[0] is analysis:
        return hit[1]
    vs = [RankView(r) for r in analysis.ranks]
    _VIEWS[id(analysis)] = (analysis, vs)
    return vs


def release_views(analysis: Analysis) -> None:
    _VIEWS.pop(id(analysis), None)


def ms(us: float) -> float:
    return us / 1000.0


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
    largest first. Units claimed with 0 µs are still taken from later findings."""
    def key(c: Candidate) -> tuple[bool, float, str]:
        p = c.priority_ms if c.priority_ms is not None else sum(c.units.values()) / n_steps / 1000.0
        return (c.generic, -p, c.id)

    claimed: set[Unit] = set()
    out = []
    for c in sorted(candidates, key=key):
        kept = {u: v for u, v in c.units.items() if u not in claimed}
        claimed.update(kept)
        out.append(Contribution(id=c.id, category=c.category, title=c.title, confidence=c.confidence,
                                recommendation=c.recommendation, evidence=c.evidence, rank=rank, generic=c.generic,
                                informational=c.informational, units=len(c.units), kept_us=float(sum(kept.values())),
                                total_us=float(sum(c.units.values()))))
    return out


def merge(contributions: Iterable[Contribution], parts: Sequence[RankPart]) -> list[Finding]:
    """One Finding per id from the ranks' contributions.

    A finding's saving per step is the largest over ranks of (µs it keeps on that rank) / (that
    rank's steps): ranks of one job step together, so the slowest rank's gain is the job's. Title
    and evidence come from the rank where it asked for most. Percentages are of the real
    (unprofiled) step when it is known, else of the traced one.
    """
    steps = {p.rank: p.n_steps for p in parts}
    step_ms = {p.rank: p.unprofiled_step_ms or p.summary.step_time_ms for p in parts}
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
        if saving <= 0 and not best.informational:
            continue
        pct = 100.0 * saving / step_ms[rank] if step_ms[rank] > 0 else 0.0
        ev = dict(best.evidence)
        if len(cs) > 1:
            ev["ranks"] = sorted({c.rank for c in with_units})
        if total - saving > 1e-6:
            ev["overlap_ms_counted_elsewhere"] = round(total - saving, 4)
        out.append(Finding(id=best.id, category=best.category, title=best.title, estimated_savings_ms=saving,
                           estimated_savings_pct=pct, confidence=best.confidence,  # type: ignore[arg-type]
                           recommendation=best.recommendation, evidence=ev))
    return out


def finalize(analysis: Analysis, candidates: list[Candidate]) -> list[Finding]:
    """Claims rank by rank (:func:`claim`), then one Finding per id (:func:`merge`). A candidate
    with units on several ranks is split by rank first."""
    steps = {p.rank: p.n_steps for p in analysis.parts}
    per_rank: dict[int, list[Candidate]] = {r: [] for r in steps}
    for c in candidates:
        ranks = sorted({u[1] for u in c.units}) or [next(iter(steps))]
        for r in ranks:
            units = {u: v for u, v in c.units.items() if u[1] == r}
            per_rank[r].append(replace(c, units=units))
    contribs = [x for r, cs in per_rank.items() for x in claim(r, cs, steps[r])]
    return merge(contribs, analysis.parts)


def per_shape(ops: pd.DataFrame, rows: Iterable[int], fn: Any, by_name: bool = False) -> dict[int, Any]:
    """``fn(input dims)`` (or ``fn(op name, input dims)`` with ``by_name``) of the given op rows,
    computed once per distinct recorded value: a step repeats the same shapes thousands of times."""
    from gpuprof.trace.load import parse_arg

    values = ops["input_dims"].to_numpy()
    names = ops["name"].to_numpy() if by_name else None
    seen: dict[Any, Any] = {}
    out = {}
    for r in rows:
        i = int(r)
        key = (names[i], values[i]) if names is not None else values[i]
        if key not in seen:
            dims = parse_arg(values[i])
            seen[key] = fn(str(names[i]), dims) if names is not None else fn(dims)
        out[i] = seen[key]
    return out


def top_names(k: pd.DataFrame, n: int = 5, by: str = "dur") -> list[dict[str, Any]]:
    """The heaviest kernel names in ``k``: name, count, total µs (evidence rows)."""
    g = k.groupby(k["name"].astype(str))[by].agg(["size", "sum"]).sort_values("sum", ascending=False).head(n)
    return [{"kernel": name, "count": int(row["size"]), "total_us": round(float(row["sum"]), 1)} for name, row in g.iterrows()]
