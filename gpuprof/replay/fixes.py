"""A finding's fix as replay transformations on the rank's dependency graph (:class:`Plan`).

Every candidate finding already says what it removes: its claim ``units``
(:mod:`gpuprof.claims`), each with the µs it saves there, and its category. This module turns
those units into :mod:`gpuprof.replay.transforms`; :mod:`gpuprof.pricing` replays the plan with
and without each fix and decides what each finding's estimate is.

* kernel units ``("k", rank, row)``: that kernel runs ``(dur − saved) / dur`` as long; one the fix
  does away with (``saved >= dur``: a layout transpose) goes with its launch, and with the host
  work before the launch only where that was its op's own: an op that still runs (the
  convolution around cuDNN's transposes) keeps the work before its first call (:func:`_kept_gaps`). ``precision`` also
  adds the host work autocast brings (:func:`_autocast_casts`: a weight cast per forward
  convolution/linear call, and its backward in training; with torch.compile's fix applied too,
  one kernel launch each instead). For a fusion
  (``FUSING``) each run of claimed kernels back to back on one stream (a memset their own ops
  issue between them does not end it) becomes one kernel of the run's new time, and the other
  kernels' launches and the host work before them go. ``compile``
  (``REGROUPING``) regroups its kernels as the analyzer models Inductor (one kernel per iteration
  space of a run, split-reduction passes in place of kernels that go:
  the candidate's ``regroup``), and its host chain keeps the eager host
  cost per launched kernel for the kernels left (its gap units claim that host work; they are not
  replayed one by one);
* copy units ``("m", rank, row)`` (pageable copies): the copy at its saved duration, its
  launch call no longer waits for it and the syncs its op made cost nothing (pinned memory,
  ``non_blocking=True``); the gaps those syncs drained are claimed, not replayed one by one;
* gap units ``("gap", rank, i)`` (row ``i`` of the rank's classified idle gaps): the host work
  that held the GPU idle shrinks by ``saved / real_dur``: every call made while the gap lasted up
  to the launch that ended it, and the call the host sat in for most of it, lose that share of
  the gap before them, their own cost, their return after a wait, and the time their own work
  (and the work that ended the gap) waited past a typical launch. Per fix: ``host_sync`` drops
  the waits and the op that fetched the value (its copy too); ``allocator_churn`` removes every
  allocator call of the steps and its wait; ``host_stall`` removes the GPU work launched during
  the step's stalled stretch (the one-off work leaves the step);
* tail units ``("tail", rank, step)`` (``host_stall``: one-off host work after the step's last GPU
  work, before the next step starts, which no idle gap inside a step window holds): the host gaps
  over that stretch lose the µs saved there.

Cross-rank fixes (``exposed_communication``, ``rank_imbalance``) are not replayed here: a rank's
analysis sees one rank's graph, and a collective's end depends on the other ranks' arrival.

The graph is first deflated to its host floor (:func:`gpuprof.replay.host_bounds`): the identified
host where the unprofiled step measures it (the trace's bracket cost per event, then one host-speed
factor); where it does not (the GPU sets that step, or it is unknown), each fix is also replayed
with the host taken out and priced between.
See docs/replay.md for the assumptions and the accuracy table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pandas as pd

from gpuprof.errors import GpuprofError
from gpuprof.replay import transforms as tf
from gpuprof.replay.graph import Graph, build, named
from gpuprof.replay.host import host_bounds
from gpuprof.replay.run import steady_ms
from gpuprof.replay.transforms import deflate
from gpuprof.trace.names import REPLAY_COPY_CALLS, REPLAY_SYNC_CALLS

if TYPE_CHECKING:
    from gpuprof.claims import Claimed
    from gpuprof.rank import RankView

#: Cross-rank categories: a rank's graph cannot see when the other ranks arrive, so their fixes are
#: replayed on the job's graph (gpuprof.replay.job), never on one rank's.
CROSS_RANK = frozenset({"exposed_communication", "rank_imbalance"})
#: Fixes that fuse their kernels: each run of claimed kernels becomes one kernel (one launch).
FUSING = frozenset({"elementwise_fusion", "optimizer_fusion", "attention_fusion"})
#: Fixes that regroup their kernels as the analyzer models them (``torch.compile``: several
#: Inductor kernels per run, one per iteration space, plus split-reduction passes; ``batching``:
#: the same kernel of every request as one kernel at the batched shape), the host keeping its cost
#: per launched kernel.
REGROUPING = frozenset({"compile", "batching"})

_T = TypeVar("_T")


@dataclass
class FixMemo:
    """What one fix's transformation reads that replaying it again would compute again: its own
    units parsed and the masks they select (``own``), and what the trace and the graph's fixed
    structure give every fix alike (``shared``: the optimizer's spans, the time inside ops, names
    matched). Transformations change weights and waits, never the traced times, rows, names or
    launches (:mod:`gpuprof.replay.transforms`), so on any graph of one structure these are the
    same arrays: a :class:`Plan` replays each fix on two such graphs (the host floor, the host taken
    out), alone and with the others, and computes them once. Nothing in here depends on a weight or
    on ``h_wait`` (which ``drop_waits`` changes)."""

    shared: dict[str, Any] = field(default_factory=dict)
    own: dict[str, Any] = field(default_factory=dict)

    def trace(self, key: str, make: Callable[[], _T]) -> _T:
        if key not in self.shared:
            self.shared[key] = make()
        out: _T = self.shared[key]
        return out

    def fix(self, key: str, make: Callable[[], _T]) -> _T:
        if key not in self.own:
            self.own[key] = make()
        out: _T = self.own[key]
        return out

    def given(self, key: str, mask: np.ndarray, make: Callable[[], _T]) -> _T:
        """:meth:`fix`'s entry for a mask the fix derives from the graph it is applied to (the calls
        that still wait, which an earlier fix applied with it may have changed): made again
        whenever that mask differs from the one it was made for."""
        hit = self.own.get(key)
        if hit is None or not np.array_equal(hit[0], mask):
            hit = self.own[key] = (mask.copy(), make())
        out: _T = hit[1]
        return out


@dataclass(frozen=True)
class Plan:
    """One rank's deflated graph and, per finding id, the units it kept after claims."""

    graph: Graph  # deflated to the host floor (gpuprof.replay.host_bounds): the identified host where it is
    view: RankView
    units: dict[str, dict[tuple[Any, ...], float]]
    categories: dict[str, str]
    confidence: dict[str, str]
    before_ms: float  # the steady-state step replayed (the mean of the two bounds' where the host is unknown)
    raw: Graph  # the graph as traced, not deflated (summary.replay_step_time_ms replays it)
    #: Where the trace does not identify the unprofiled host (the GPU sets the real step, or no real
    #: step is known): the graph with the host taken out, the other bound. Every fix is replayed on
    #: both, and its estimate is the middle of the two savings (docs/replay.md, "The host floor")
    free_graph: Graph | None = None
    floor_us: float = 0.0  # the profiler's cost per recorded event taken out of ``graph``
    real_known: bool = False  # whether the unprofiled step time was given (the replay is calibrated to it)
    cache: dict[tuple[Any, ...], float] = field(default_factory=dict)
    #: Findings that claim after every specific one by design (``priority_ms`` 0: compile, which
    #: covers the fusions' kernels too) with all the units they asked for: a pair realises such a
    #: fix applied alone, so that is priced too (``estimated_saving_alone_ms``)
    alone: dict[str, dict[tuple[Any, ...], float]] = field(default_factory=dict)
    #: Per finding id, a regrouping fix's new kernels (:attr:`gpuprof.claims.Candidate.regroup`)
    regroups: dict[str, pd.DataFrame] = field(default_factory=dict)
    #: Findings applied after every other one: a whole-GPU condition (clocks held down,
    #: :attr:`gpuprof.claims.Candidate.scale`) scales the kernels as the other fixes leave them
    last: frozenset[str] = frozenset()
    #: Per fix (its kept units, or all it asked for alone): what its transformation reads that is the
    #: same on every graph of this plan (:class:`FixMemo`); one ``shared`` part for all of them
    memos: dict[tuple[str, str], FixMemo] = field(default_factory=dict)

    def memo(self, which: str, i: str) -> FixMemo:
        """The memo of fix ``i``'s kept units (``which="kept"``) or of all it asked for (``"alone"``)."""
        shared = self.memos.setdefault(("", ""), FixMemo()).shared  # the trace's part, one for all
        return self.memos.setdefault((which, i), FixMemo(shared))

    def order(self, ids: Sequence[str]) -> list[str]:
        """The findings of ``ids`` this plan prices, in the order their fixes are applied together:
        by id, whole-GPU conditions (:attr:`last`) after every other fix."""
        return sorted(set(i for i in ids if i in self.units), key=lambda i: (i in self.last, i))

    def compiled(self, ids: Sequence[str]) -> bool:
        """Whether the fixes of ``ids`` include ``torch.compile`` (:func:`apply`'s ``compiled``)."""
        return any(self.categories.get(i) == "compile" for i in ids if i in self.units)

    def applied(self, ids: Sequence[str], free: bool = False) -> Graph:
        g = self.free_graph if free and self.free_graph is not None else self.graph
        compiled = self.compiled(ids)
        for i in self.order(ids):
            g = apply(g, self.view, self.categories[i], self.units[i], self.regroups.get(i), self.memo("kept", i),
                      compiled)
        return g

    def by_class_ms(self, ids: Sequence[str]) -> dict[str, float]:
        """Mean replayed time per step in each class (and idle), the fixes of ``ids`` applied (on
        the host floor's graph)."""
        from gpuprof.replay.simulate import simulate, step_windows
        from gpuprof.timeline import exclusive_times

        g = self.applied(ids)
        t = simulate(g)
        lo, hi = step_windows(g, t)
        k = self.view.kernels
        kcls = k["cls"].reindex(range(len(self.view.trace.kernels))).fillna("unknown").to_numpy(dtype=object) \
            if "cls" in k.columns else np.full(len(self.view.trace.kernels), "unknown", dtype=object)
        cls = np.where(g.a_kind == 0, kcls[np.minimum(g.a_row, max(len(kcls) - 1, 0))] if len(kcls) else "unknown",
                       "memcpy").astype(object)
        out = exclusive_times(t.a_start, t.a_end, cls, lo, hi)
        ok = np.isfinite(lo) & np.isfinite(hi)
        return {c: float(v[ok].mean()) / 1000.0 if ok.any() else 0.0 for c, v in out.items()}

    def bounds_ms(self, ids: Sequence[str]) -> tuple[float, float]:
        """Steady-state step time (:func:`gpuprof.replay.steady_ms`) with the fixes of ``ids``
        applied together: on the host floor's graph, and on the host-free graph (the same figure
        where the host is identified)."""
        key = tuple(sorted(set(i for i in ids if i in self.units)))
        out: list[float] = []
        for free in (False, True):
            if free and self.free_graph is None:
                return out[0], out[0]
            if (free, *key) not in self.cache:
                self.cache[(free, *key)] = steady_ms(self.applied(key, free))
            out.append(self.cache[(free, *key)])
        return out[0], out[1]

    def alone_bounds_ms(self, i: str) -> tuple[float, float]:
        """:meth:`bounds_ms` of finding ``i`` applied alone with every unit it asked for."""
        out = []
        for g in (self.graph, self.free_graph if self.free_graph is not None else self.graph):
            if ("alone", g is self.graph, i) not in self.cache:
                self.cache[("alone", g is self.graph, i)] = steady_ms(apply(g, self.view, self.categories[i],
                                                                            self.alone[i], self.regroups.get(i),
                                                                            self.memo("alone", i)))
            out.append(self.cache[("alone", g is self.graph, i)])
        return out[0], out[1]

    def after_ms(self, ids: Sequence[str]) -> float:
        """Replayed steady-state step time with the fixes of ``ids`` applied together: the middle
        of its two bounds where the unprofiled host is not identified (:meth:`bounds_ms`)."""
        lo, hi = self.bounds_ms(ids)
        return 0.5 * (lo + hi)


def _parsed(units: dict[tuple[Any, ...], float]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per kind of unit (``k``, ``m``, ``gap``, ``tail``): the rows it names and the µs it saves,
    in the units' order."""
    if not units:
        return {}
    kinds = np.array([u[0] for u in units], dtype=object)
    rows = np.array([u[2] for u in units], dtype=np.int64)
    saved = np.fromiter(units.values(), float, len(units))
    out = {}
    for kind in dict.fromkeys(kinds.tolist()):  # a handful of kinds
        m = kinds == kind
        out[kind] = (rows[m], saved[m])
    return out


_NONE = (np.zeros(0, np.int64), np.zeros(0))


def apply(g: Graph, v: RankView, category: str, units: dict[tuple[Any, ...], float],
          regroup: pd.DataFrame | None = None, memo: FixMemo | None = None, compiled: bool = False) -> Graph:
    """``g`` with one finding's kept ``units`` removed (see the module docstring); a regrouping
    fix's kernels regrouped as its candidate's ``regroup`` says. ``memo``: what an earlier call
    with these units on a graph of ``g``'s structure computed (:class:`FixMemo`), filled in here.
    ``compiled``: applied together with ``torch.compile`` (a ``compile`` finding's fix), under
    which autocast's casts are traced into the compiled graph: each stays its own kernel
    (gpuprof.analyzers.compile_fusion), launched at the step's host cost per launched kernel, not
    dispatched as eager ops (:func:`_autocast_casts`)."""
    m_ = memo if memo is not None else FixMemo()
    t = v.trace
    rank = v.rank
    parsed = m_.fix("units", lambda: _parsed(units))
    k_rows, saved = parsed.get("k", _NONE)
    if len(k_rows):
        def kernel_factor() -> np.ndarray:
            dur = t.kernels["dur"].to_numpy(dtype=float)
            fac = np.ones(len(dur))
            fac[k_rows] = np.clip((dur[k_rows] - saved) / np.maximum(dur[k_rows], 1e-9), 0.0, 1.0)
            return fac

        fac = m_.fix("kernel_factor", kernel_factor)
        sel = m_.fix("kernels", lambda: tf.activities_of(g, rank, "kernel", k_rows))
        if category in REGROUPING and regroup is not None:
            g = _inductor(g, v, sel, regroup, m_)
        elif category in FUSING:
            def memsets() -> np.ndarray:
                # memsets issued by the fused ops themselves (cuBLAS's workspace clear under aten::bmm)
                m = t.memcpys
                memset_rows = np.flatnonzero(((m["kind"].astype(str) == "Memset") & (m["op"] >= 0)
                                              & m["op"].isin(t.kernels["op"].to_numpy()[k_rows])).to_numpy()) \
                    if {"kind", "op"} <= set(m.columns) and "op" in t.kernels.columns else np.zeros(0, np.int64)
                return tf.activities_of(g, rank, "memcpy", memset_rows)

            fac_a = m_.fix("kernel_factor_a", lambda: fac[np.minimum(g.a_row, len(fac) - 1)] if len(fac) else None)
            g = _fuse_runs(g, sel, g.a_dur * fac_a if fac_a is not None else g.a_dur, m_.fix("memsets", memsets))
        else:
            g = tf.set_durations(g, sel, g.a_dur[sel] * fac[g.a_row[sel]])
            # a kernel the fix does away with (a layout transpose) goes with its launch; the host
            # work before that launch goes only where it was the launching op's own (_kept_gaps)
            gone = m_.fix("gone", lambda: sel & (fac[np.minimum(g.a_row, len(fac) - 1)] <= 0.0))
            kept_gap = m_.fix("kept_gaps", lambda: _kept_gaps(g, v, gone))
            g = tf.remove_activities(g, gone, keep_gap=kept_gap)
    if category == "precision" and len(k_rows):
        g = _autocast_casts(g, v, k_rows, m_, compiled)
    m_rows, saved_m = parsed.get("m", _NONE)
    if len(m_rows):
        def copy_durations() -> np.ndarray:
            d = t.memcpys["dur"].to_numpy(dtype=float).copy()
            d[m_rows] = np.maximum(d[m_rows] - saved_m, 0.0)
            return d

        d = m_.fix("copy_durations", copy_durations)
        sel = m_.fix("copies", lambda: tf.activities_of(g, rank, "memcpy", m_rows))
        g = tf.set_durations(g, sel, d[g.a_row[sel]])
        g = tf.drop_waits(g, m_.fix("copy_launches", lambda: tf.launches_of(g, sel)))
        if category == "pageable_memcpy":
            # non_blocking=True: the op that copied no longer synchronises its stream
            from gpuprof.hostops import pageable_copy_syncs

            own = m_.fix("copy_syncs", lambda: tf.calls_of(g, rank, pageable_copy_syncs(t, m_rows)))
            g = tf.shrink_host(tf.drop_waits(g, own), own, 0.0)
    gi, saved_g = parsed.get("gap", _NONE)
    # a regrouping fix's gaps are the host work its own host model takes out (its claim); a pageable
    # copy's are the waits of its own calls, dropped above
    if len(gi) and not v.gaps.empty and category not in REGROUPING | {"pageable_memcpy"}:
        g = _gap_fix(g, v, category, gi, saved_g, m_)
    tail_rows, tail_saved = parsed.get("tail", _NONE)
    tails = {int(r): float(x) for r, x in zip(tail_rows, tail_saved)}
    if tails:
        g = _tail_fix(g, v, tails)
    return g


def _kept_gaps(g: Graph, v: RankView, gone: np.ndarray) -> np.ndarray:
    """Of the host calls that launched the activities ``gone`` (a fix does away with them), those
    whose gap before them stays: each call costs nothing once its kernel goes, and the gap before
    it goes too, except where the call is its op's first runtime call (the earliest of its
    external id on the rank) and the op still runs, launching work that stays (a cuDNN
    convolution whose NCHW<->NHWC transposes go in channels-last still runs its convolution): that
    gap is the Python, dispatch and setup before the op, which stay in front of its next call. A
    later call's gap is the op's own work around the launch that goes. A call in no op (external
    id < 0) takes its gap along, as every removed launch did before."""
    calls = tf.launches_of(g, gone)
    keep = np.zeros(g.n_host, dtype=bool)
    idx = np.flatnonzero(calls)
    rt = v.trace.runtime
    if not len(idx) or "external_id" not in rt.columns or not len(rt):
        return keep
    mine = np.flatnonzero(g.h_rank == g.ranks.index(v.rank))  # sorted by start (Graph)
    ext_all = np.full(g.n_host, -1, dtype=np.int64)
    rows = g.h_row[mine]
    ok = (rows >= 0) & (rows < len(rt))
    ext_all[mine[ok]] = rt["external_id"].to_numpy()[rows[ok]]
    ext = ext_all[idx]
    # ops that still run: they launch work that stays
    launching = np.zeros(g.n_host, dtype=bool)
    launching[g.a_launch[g.a_launch >= 0]] = True
    kept = mine[launching[mine] & ~calls[mine]]
    stays = np.isin(ext, np.unique(ext_all[kept]))
    # each op's first runtime call on the rank
    with_id = mine[ext_all[mine] >= 0]
    _, at = np.unique(ext_all[with_id], return_index=True)
    first = np.isin(idx, with_id[at])
    keep[idx[(ext >= 0) & stays & first]] = True
    return keep


#: The user-facing forward ops (the outermost aten op of a kernel's chain) that take a weight
#: operand autocast casts to 16 bits on every call.
AUTOCAST_WEIGHT_OPS = ("aten::linear", "aten::addmm", "aten::conv1d", "aten::conv2d", "aten::conv3d",
                       "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d",
                       "aten::convolution")
#: Recorded ops of one autocast weight cast: forward ``aten::to`` > ``aten::_to_copy`` >
#: ``aten::empty_strided``, ``aten::copy_``; in training also its backward
#: (``autograd::engine::evaluate_function: ToCopyBackward0``, ``ToCopyBackward0`` and the same four).
AUTOCAST_CAST_OPS, AUTOCAST_CAST_BACKWARD_OPS = 4, 6


def _autocast_casts(g: Graph, v: RankView, k_rows: np.ndarray, memo: FixMemo, compiled: bool = False) -> Graph:
    """The host work autocast adds, which a host-bound step pays in full: one weight cast per
    call of each forward weight op (:data:`AUTOCAST_WEIGHT_OPS`) whose FP32 kernels the fix
    converts (the FP8 fix's 16-bit kernels add none), forward and (training) backward, each
    priced at this trace's own host cost per recorded op (the replayed host's busy time per step
    over the ops recorded in steps, per step), added to the launch of that op's first converted
    kernel. ``compiled`` (with torch.compile's fix): each cast is one kernel forward and one
    backward instead, at the host cost per launched kernel of the step (the compile model's
    price of a kernel it keeps)."""
    from gpuprof.idle import has_backward, outermost_aten

    def where() -> tuple[np.ndarray, int]:
        """(the launch calls that carry the casts, the ops recorded per cast): the graph's structure only."""
        t = v.trace
        ops, k = t.ops, t.kernels
        if not len(ops) or "parent" not in ops.columns or "op" not in k.columns:
            return np.zeros(0, np.int64), 0
        rows = np.sort(np.asarray(k_rows, dtype=np.int64))
        # FP32 math only (GP-PREC-001): FP8's units are 16-bit GEMMs, whose recipes cast otherwise
        dtype = v.kernels["dtype"].reindex(rows).astype(str).to_numpy() if "dtype" in v.kernels.columns else None
        rows = rows[dtype == "fp32"] if dtype is not None else rows[:0]
        own = k["op"].to_numpy(dtype=np.int64)[rows]
        rows, own = rows[own >= 0], own[own >= 0]
        owner = outermost_aten(ops, own)
        mine = np.isin(ops["name"].astype(str).to_numpy()[owner], AUTOCAST_WEIGHT_OPS)
        if not mine.any():
            return np.zeros(0, np.int64), 0
        _, first = np.unique(owner[mine], return_index=True)
        first_rows = rows[mine][first]  # each weight op's first converted kernel
        i = g.ranks.index(v.rank)
        acts = np.flatnonzero((g.a_rank == i) & (g.a_kind == 0))
        act_of = np.full(len(k), -1, dtype=np.int64)
        act_of[g.a_row[acts]] = acts
        pos = act_of[first_rows]
        calls = g.a_launch[pos[pos >= 0]]
        return calls[calls >= 0], has_backward(ops)

    calls, training = memo.fix("autocast_casts", where)
    if not len(calls):
        return g
    i = g.ranks.index(v.rank)
    in_step = (g.h_rank == i) & (g.h_step >= 0)
    n = max(v.n_steps, 1)
    busy = float((np.maximum(g.h_gap[in_step], 0.0) + g.h_dur[in_step]).sum()) / n
    if compiled:
        launched = (g.a_rank == i) & (g.a_kind == 0) & (g.a_launch >= 0)
        per_kernel = busy / max(float((launched & in_step[np.maximum(g.a_launch, 0)]).sum()) / n, 1.0)
        cost = per_kernel * (2 if training else 1)
    else:
        ops = v.trace.ops
        in_ops = int((ops["step"].to_numpy() >= 0).sum()) if "step" in ops.columns else 0
        per_op = busy / max((in_ops or len(ops)) / n, 1.0)
        cost = per_op * (AUTOCAST_CAST_OPS + (AUTOCAST_CAST_BACKWARD_OPS if training else 0))
    return tf.add_host(g, calls, np.full(len(calls), cost))


def _tail_fix(g: Graph, v: RankView, saved: dict[int, float]) -> Graph:
    """Tail units ``("tail", rank, step)`` (``analyzers.host_gaps.step_tails``: one-off host work
    after a step's last GPU work, before the next step starts): the host gaps overlapping that
    stretch lose ``saved[step]`` µs, shared in proportion to their overlap with it."""
    s = v.steps.sort_values("start", kind="stable")
    nxt = dict(zip(s["step"].to_numpy()[:-1], s["start"].to_numpy(dtype=float)[1:]))
    end = dict(zip(s["step"].to_numpy(), s["end"].to_numpy(dtype=float)))
    i = g.ranks.index(v.rank)
    mine = np.flatnonzero(g.h_rank == i)
    ts = g.h_ts[mine] - g.rank_offset_us[i]
    prev_end = np.r_[-np.inf, g.h_end[mine][:-1] - g.rank_offset_us[i]]
    gap = g.h_gap.copy()
    for step, us in saved.items():  # one per stalled step: a handful
        if step not in nxt:
            continue
        overlap = np.maximum(np.minimum(ts, nxt[step]) - np.maximum(prev_end, end[step]), 0.0)
        total = float(overlap.sum())
        if total > 0:
            gap[mine] -= np.minimum(us * overlap / total, np.maximum(gap[mine], 0.0))
    return replace(g, h_gap=gap)


def _fuse_runs(g: Graph, sel: np.ndarray, after_us: np.ndarray, memsets: np.ndarray | None = None) -> Graph:
    """A fusion's claimed kernels that ran back to back on one stream in one step become one
    kernel each run, as long as the run's kernels take after the fix (``after_us``, the analyzer's
    fused time spread over them); the other kernels of the run vanish with their launches and the
    host work before each (the ops a fused kernel no longer dispatches), whichever finding
    claimed the idle gaps there: priced alone, the fix removes them all. A memset between two of
    a run's kernels issued by one of the claimed kernels' own ops (``memsets``: the 4-byte
    workspace clear cuBLAS issues under each ``aten::bmm`` of an unfused attention) belongs to the
    ops the fused kernel replaces: it goes with them rather than splitting the run; any other
    activity between two claimed kernels ends the run."""
    ms = memsets if memsets is not None else np.zeros(g.n_acts, dtype=bool)
    idx = np.flatnonzero(sel | ms)  # activities are in (rank, stream, start) order
    if not sel.any():
        return g
    brk = np.r_[True, (np.diff(idx) != 1) | (g.a_stream[idx[1:]] != g.a_stream[idx[:-1]])
                | (g.a_step[idx[1:]] != g.a_step[idx[:-1]])]
    run_id = np.cumsum(brk) - 1
    is_k = sel[idx]
    pos = np.arange(len(idx))
    lo = pd.Series(pos[is_k]).groupby(run_id[is_k]).min().reindex(range(run_id[-1] + 1)).to_numpy()
    hi = pd.Series(pos[is_k]).groupby(run_id[is_k]).max().reindex(range(run_id[-1] + 1)).to_numpy()
    inner = ~is_k & (pos > lo[run_id]) & (pos < hi[run_id])  # NaN (no kernel in the run) compares False
    dur = np.bincount(run_id[is_k], weights=after_us[idx[is_k]], minlength=run_id[-1] + 1)
    first = np.zeros(g.n_acts, dtype=bool)
    first[idx[is_k & (pos == lo[run_id])]] = True
    gone = sel & ~first
    gone[idx[inner]] = True
    g = tf.remove_activities(g, gone)
    return tf.set_durations(g, first, dur[run_id[is_k & (pos == lo[run_id])]])


def _inductor(g: Graph, v: RankView, sel: np.ndarray, ip: pd.DataFrame, memo: FixMemo) -> Graph:
    """``torch.compile``'s kernels in place of the selected ones (the finding's kept kernels):
    each group of the finding's ``regroup`` (:class:`gpuprof.claims.Candidate`: one iteration
    space of a fusible run) becomes one kernel where its first kept member ran, as long as its
    kept members' share of the fused time; its other members go with their launches and the host
    work before each (the ops Inductor's kernel no longer dispatches); a split-reduction pass's
    slot stays a kernel, launched as before, at the pass's time. A member another finding claimed
    first stays as it ran."""
    def groups() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        idx = np.flatnonzero(sel)  # activities in (rank, stream, start) order
        rows = g.a_row[idx]
        known = ip.index.isin(rows)
        sub = ip[known]
        at = pd.Series(np.arange(len(idx)), index=rows)
        pos = at.reindex(sub.index).to_numpy()
        grp = sub["group"].to_numpy()
        after = sub["after_us"].to_numpy(dtype=float)
        acts = idx[pos]
        member = grp >= 0
        # the group's kernel takes the place of its first kept member
        order = np.argsort(acts[member], kind="stable")
        m_acts, m_grp, m_after = acts[member][order], grp[member][order], after[member][order]
        lead = ~pd.Series(m_grp).duplicated().to_numpy()
        total = pd.Series(m_after).groupby(m_grp).sum()
        gone = np.zeros(g.n_acts, dtype=bool)
        gone[m_acts[~lead]] = True
        return acts[~member], after[~member], m_acts[lead], total.reindex(m_grp[lead]).to_numpy(), gone

    split_acts, split_us, lead_acts, lead_us, gone = memo.fix("inductor", groups)
    dur = g.a_dur.copy()
    dur[split_acts] = split_us  # the split passes' slots
    dur[lead_acts] = lead_us
    g = tf.set_durations(g, np.ones(g.n_acts, dtype=bool), dur)
    return _compiled_host(g, tf.remove_activities(g, gone), v, gone, memo)


def _compiled_host(before: Graph, g: Graph, v: RankView, gone: np.ndarray, memo: FixMemo) -> Graph:
    """The compiled model's host: Inductor's wrapper launches each kernel it keeps at the eager
    step's host cost per launched kernel (the compiled twins launched at 0.91-1.09x it:
    gpuprof.analyzers.compile_fusion), so the host time of the steps outside the optimizer
    (``torch.compile(model)`` leaves ``optimizer.step()`` eager) shrinks to that share of its
    kernels kept: the launches that went took the host work before each with them, and the
    rest (the Python and the ops that launch no kernel, which the compiled graph no longer runs)
    shrinks by what is left to take."""
    from gpuprof.idle import HOST_WORK_MIN_US, time_in_ops

    i = g.ranks.index(v.rank)

    def model_region() -> tuple[np.ndarray, np.ndarray]:
        # the update stays eager: torch.optim's steps, or a per-parameter loop no optimizer annotated
        opt = pd.concat([v.optimizer_spans(zero_grad=True), v.update_loops()[["ts", "end", "tid"]]],
                        ignore_index=True)
        spans = list(zip(opt["ts"].to_numpy(dtype=float), opt["end"].to_numpy(dtype=float), opt["tid"].to_numpy()))
        region = ((g.h_rank == i) & (g.h_step >= 0)
                  & ~tf.calls_within(g, v.rank, v.trace.runtime["tid"].to_numpy(), spans))
        launched = (g.a_launch >= 0) & (g.a_kind == 0)
        return region, launched & region[np.maximum(g.a_launch, 0)]

    region, in_region = memo.trace("compiled_region", model_region)
    k_all = float(in_region.sum())
    k_gone = float((in_region & gone).sum())
    if k_all <= 0:
        return g
    went = memo.fix("launches_gone", lambda: tf.launches_of(g, gone))

    def in_ops() -> np.ndarray:
        # A gap's stretch outside every op that drives the GPU, once it is long enough to be user host
        # work (HOST_WORK_MIN_US, the rule the host-work finding uses: a busy loop, tokenising,
        # logging), is not Inductor's to remove; the short Python between a model's ops is.
        mine = np.flatnonzero(g.h_rank == i)
        prev_end = np.r_[g.h_ts[mine[0]], g.h_end[mine[:-1]]] if len(mine) else np.zeros(0)
        s = np.minimum(prev_end, g.h_ts[mine]) - g.rank_offset_us[i]
        e = g.h_ts[mine] - g.rank_offset_us[i]
        span = e - s
        covered = time_in_ops(v.trace, s, e, v.driving_spans)
        user = span - covered >= HOST_WORK_MIN_US
        inside = np.ones(g.n_host)
        inside[mine] = np.where(user, covered / np.where(span > 0, span, 1.0), 1.0)
        return inside

    inside = memo.trace("host_in_ops", in_ops)

    def model_host(x: Graph, m: np.ndarray) -> float:
        return float((np.maximum(x.h_gap, 0.0) * inside + x.h_dur)[m].sum())

    target = model_host(before, region) * (k_all - k_gone) / k_all
    left = model_host(g, region & ~went)
    f = min(1.0, target / left) if left > 0 else 1.0
    keep = region & ~went
    factor = np.where(keep, inside * f + (1.0 - inside), 1.0)  # the gap: its in-op share × f
    gap = np.where(keep & (g.h_gap > 0), g.h_gap * factor, g.h_gap)
    return replace(g, h_gap=gap, h_dur=np.where(keep, g.h_dur * f, g.h_dur))


def _gap_fix(g: Graph, v: RankView, category: str, gi: np.ndarray, saved: np.ndarray, memo: FixMemo) -> Graph:
    """The host work that held the GPU idle in the gaps ``gi`` (rows of ``v.gaps``), less by
    ``saved / real_dur`` each: every host call made while a gap lasted, up to the launch of the
    work that ended it, loses that share of its host time: the gap before it, its own cost, the
    time it took to return after the GPU work it waited for ended, and the time its own GPU work
    waited beyond a typical launch. The fix decides what else goes:

    * ``host_sync``: the synchronising calls there no longer wait (the value stays on the GPU);
    * ``allocator_churn``: every allocator call of the steps costs nothing and no longer waits
      (without the free there is no device sync);
    * ``host_stall``: the one-off work leaves the step: the GPU work launched during the step's
      stalled stretch (the checkpoint's copies) goes too."""
    i = g.ranks.index(v.rank)

    def held_calls() -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...], np.ndarray, np.ndarray]:
        gaps = v.gaps
        at = gaps.index.get_indexer(pd.Index(gi))  # by position: the columns read below, not a copy of every one
        if (at < 0).any():
            raise KeyError(f"gaps {gi[at < 0][:5].tolist()} are not this rank's")

        def col(c: str) -> np.ndarray:
            out: np.ndarray = gaps[c].to_numpy()[at]
            return out

        real = col("real_dur").astype(float)
        share = np.clip(saved / np.maximum(real, 1e-9), 0.0, 1.0)
        lo = col("start").astype(float)
        nl = col("next_launch_ts").astype(float)
        hi = np.where(np.isfinite(nl) & (nl > lo), nl, col("end").astype(float))
        mine = np.flatnonzero(g.h_rank == i)
        ts = g.h_ts[mine] - g.rank_offset_us[i]
        end = g.h_end[mine] - g.rank_offset_us[i]
        o = np.argsort(lo)
        lo, hi, share, rows = lo[o], hi[o], share[o], gi[o]
        # the host call's gap (or the call) lies in an idle gap when it ends after the gap began
        k = np.searchsorted(lo, end, side="right") - 1
        inside = (k >= 0) & (ts <= hi[np.maximum(k, 0)])
        calls = np.zeros(g.n_host, dtype=bool)
        calls[mine[inside]] = True
        factor = np.ones(g.n_host)
        factor[mine[inside]] = 1.0 - share[k[inside]]
        # the call the host sat in for most of the gap (a 463 ms blocking copy), even when it began
        # after the work that ended the gap was launched: its own span is the stall
        cr, cu = col("call_row")[o], col("call_us").astype(float)[o]
        held = (cr >= 0) & (cu >= 0.5 * col("dur").astype(float)[o])
        if held.any():
            rows_share = pd.Series(share[held], index=cr[held].astype(np.int64))
            rows_share = rows_share.groupby(level=0).max()
            sel = tf.calls_of(g, v.rank, rows_share.index.to_numpy())
            calls |= sel
            factor[sel] = np.minimum(factor[sel], 1.0 - rows_share.reindex(g.h_row[sel]).to_numpy())
        # the work that ended each gap, launched before it and held past a typical launch while the
        # host was stalled (a stream blocked by a synchronous copy), starts as the host comes back
        ending = np.zeros(g.n_acts, dtype=bool)
        f_act = np.ones(g.n_acts)
        next_kind, next_row = col("next_kind"), col("next_row")
        for kind in ("kernel", "memcpy"):
            m = (next_kind == kind)[o]
            if m.any():
                sel = tf.activities_of(g, v.rank, kind, next_row[o][m].astype(np.int64))
                row_share = pd.Series(share[m], index=next_row[o][m].astype(np.int64))
                row_share = row_share[~row_share.index.duplicated()]
                ending |= sel
                f_act[sel] = 1.0 - row_share.reindex(g.a_row[sel]).fillna(0.0).to_numpy()
        return calls, factor, (mine, ts, rows, lo, hi), ending, f_act

    calls, factor, stretch, ending, f_act = memo.fix("gaps", held_calls)
    calls, factor = calls.copy(), factor.copy()
    if category == "allocator_churn":
        alloc = (g.h_rank == i) & (g.h_step >= 0) & g.h_driver  # the rank's allocation calls in steps
        calls |= alloc
        factor[alloc] = 0.0
        g = tf.drop_waits(g, alloc)
    if category == "host_sync":
        # the value stays on the GPU: no call there waits for it, the synchronising ones nor the
        # device-to-host copy an `.item()` waits on
        from gpuprof.trace.names import SYNC_CALLS

        def fetching() -> tuple[np.ndarray, np.ndarray]:
            # a copy that waits is the fetch only when it brings the value to the host: a blocking
            # host-to-device `.to()` (a pageable batch) still has its data to move, which is
            # pageable_memcpy's fix, not the fetch's
            to_host = _to_host(g, v)
            fetches = np.zeros(g.n_host, dtype=bool)
            fetches[g.a_launch[to_host & (g.a_launch >= 0)]] = True
            every = REPLAY_SYNC_CALLS | SYNC_CALLS | REPLAY_COPY_CALLS
            syncs = named(g.h_name, [n for n in every if "ynchronize" in n])
            return to_host, syncs | (named(g.h_name, every) & fetches)

        to_host, may_wait = memo.trace("fetches", fetching)
        waiting = calls & (g.h_wait >= 0) & may_wait
        g = tf.drop_waits(g, waiting)
        g = _drop_syncing_ops(g, v, waiting, to_host, memo)
    if category == "host_stall":
        g = _remove_one_off(g, v, *stretch)
    g = tf.shrink_host(g, calls, factor)
    g = tf.shrink_tail(g, calls, factor)
    acts = tf.activities_launched_by(g, calls)
    g = tf.shrink_latency(g, acts, factor[np.maximum(g.a_launch, 0)])
    return tf.shrink_latency(g, ending, f_act)


def _to_host(g: Graph, v: RankView) -> np.ndarray:
    """Mask of the rank's copies that move data from the device to the host."""
    i = g.ranks.index(v.rank)
    kind = v.trace.memcpys["kind"].astype(str).to_numpy() if len(v.trace.memcpys) else np.array([], dtype=object)
    out: np.ndarray = (g.a_rank == i) & (g.a_kind == 1) & (g.a_row < len(kind))
    out[out] = kind[g.a_row[out]] == "DtoH"
    return out


def _drop_syncing_ops(g: Graph, v: RankView, waiting: np.ndarray, to_host: np.ndarray,
                      memo: FixMemo | None = None) -> Graph:
    """With the value kept on the GPU, the op that fetched it (``aten::item``, ``.cpu()``: the
    outermost aten op around each waiting call) no longer runs: its runtime calls cost nothing,
    with the host work before each inside the op, and its device-to-host copy goes. ``memo``: the
    fix's, where which calls and copies those are was found for these ``waiting`` calls already
    (they depend on the graph's structure and on ``waiting`` alone)."""
    from gpuprof.idle import outermost_aten

    t = v.trace
    ops, rt = t.ops, t.runtime
    if not len(ops) or not waiting.any():
        return g

    def fetching_ops() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        ext = rt["external_id"].to_numpy()[g.h_row[waiting]]
        op_ext = ops["external_id"].to_numpy()
        order = np.argsort(op_ext, kind="stable")
        pos = np.clip(np.searchsorted(op_ext[order], ext), 0, len(ops) - 1)
        hit = (op_ext[order][pos] == ext) & (ext >= 0)
        rows = np.unique(outermost_aten(ops, order[pos[hit]]))
        spans = list(zip(ops["ts"].to_numpy(dtype=float)[rows], ops["end"].to_numpy(dtype=float)[rows],
                         ops["tid"].to_numpy()[rows]))
        inside = tf.calls_within(g, v.rank, rt["tid"].to_numpy(), spans) | waiting
        copies = tf.activities_launched_by(g, inside) & to_host
        # the host work before a call goes only as far as it lies inside the op: what ran before the
        # op began (tokenising before a batch's blocking `.to()`, say) is the program's own work, not
        # the fetch's
        idx = np.flatnonzero(inside)
        at = g.h_ts[idx] - g.rank_offset_us[g.h_rank[idx]]
        in_op = np.full(len(idx), np.inf)  # a waiting call in no aten op: its whole gap, as before
        if spans:
            sp = np.array(spans, dtype=float)
            sp = sp[np.argsort(sp[:, 0], kind="stable")]
            k = np.maximum(np.searchsorted(sp[:, 0], at, side="right") - 1, 0)
            within = (at >= sp[k, 0]) & (at <= sp[k, 1])
            in_op[within] = at[within] - sp[k[within], 0]
        return inside, copies, idx, in_op

    inside, copies, idx, in_op = (memo.given("fetching_ops", waiting, fetching_ops) if memo is not None
                                  else fetching_ops())
    g = tf.remove_activities(g, copies, with_launch=False)
    gap = g.h_gap.copy()
    gap[idx] = np.where(gap[idx] > 0, gap[idx] - np.minimum(gap[idx], in_op), gap[idx])
    return replace(g, h_gap=gap, h_dur=np.where(inside, 0.0, g.h_dur))


def _remove_one_off(g: Graph, v: RankView, mine: np.ndarray, ts: np.ndarray, rows: np.ndarray,
                    lo: np.ndarray, hi: np.ndarray) -> Graph:
    """Without the stall's one-off work, the GPU work it launched goes too. The stalled gaps of
    one step are one episode (a checkpoint save, a pause: one-off work happens once where it
    happens), from the first gap's start to the launch that ended the last one (that launch is
    the step's own next work and stays); what the host launched in between was the episode's."""
    step = v.gaps.loc[rows, "step"].to_numpy()
    first = pd.Series(lo).groupby(step).min()
    last = pd.Series(hi).groupby(step).max()
    run_lo, run_hi = first.to_numpy(), last.reindex(first.index).to_numpy()
    k = np.searchsorted(run_lo, ts, side="right") - 1
    during = (k >= 0) & (ts < run_hi[np.maximum(k, 0)])
    calls = np.zeros(g.n_host, dtype=bool)
    calls[mine[during]] = True
    return tf.remove_activities(g, tf.activities_launched_by(g, calls), with_launch=False)


def host_free(g: Graph) -> Graph:
    """``g`` with the host's own time taken out (every gap and call cost 0; waits stay)."""
    return tf.shrink_host(g, np.ones(g.n_host, dtype=bool), 0.0)


def plan(v: RankView, claims: Sequence[Claimed], unprofiled_step_ms: float | None, raw: Graph | None = None
         ) -> Plan | None:
    """The rank's deflated graph and each finding's kept units (the rank's claims after
    :func:`gpuprof.claims.claimed`); ``None`` when the rank has no graph to replay (no runtime
    calls or GPU work) or the replay fails. Cross-rank findings (``CROSS_RANK``) are left out: a
    rank's graph cannot see when the other ranks arrive. ``raw``: the rank's graph as traced
    (``build([v.trace])``) where it was built already."""
    t = v.trace
    if not len(t.runtime) or not (len(t.kernels) + len(t.memcpys)):
        return None
    try:
        raw = build([t]) if raw is None else raw
        hb = host_bounds(raw, unprofiled_step_ms, v.bracket_cost_us())
        g = hb.apply(raw)
        free = None if hb.identified else host_free(raw)
    except GpuprofError:
        return None
    units: dict[str, dict[tuple[Any, ...], float]] = {}
    alone: dict[str, dict[tuple[Any, ...], float]] = {}
    cats: dict[str, str] = {}
    conf: dict[str, str] = {}
    for c in claims:
        # a whole-GPU condition (clocks held down) scales each of its kernels by its own factor
        # after the owners' fixes, so applied with them it counts only what they left
        u = c.asked if c.scale is not None else c.kept
        if c.informational or c.category in CROSS_RANK or not u:
            continue
        units.setdefault(c.id, {}).update(u)
        cats[c.id], conf[c.id] = c.category, c.confidence
        if c.priority_ms == 0.0 and len(u) < len(c.asked):
            alone.setdefault(c.id, {}).update(c.asked)
    regroups = {c.id: c.regroup for c in claims if c.id in units and c.regroup is not None}
    last = frozenset(c.id for c in claims if c.id in units and c.scale is not None)
    p = Plan(g, v, units, cats, conf, 0.0, raw, free, hb.floor_us, bool(unprofiled_step_ms), alone=alone,
             regroups=regroups, last=last)
    try:
        before = p.after_ms([])
    except GpuprofError:
        return None
    if not np.isfinite(before):
        return None
    return replace(p, before_ms=before, cache=p.cache)


