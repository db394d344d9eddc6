"""Idle gaps on the GPU timeline and what caused each: the trace's own evidence of where the
host held the GPU up (a sync, an allocator call, a DataLoader, user Python, slow launches).

:func:`gaps` finds every interval inside a step window in which the GPU ran nothing;
:func:`classify_gaps` gives each one cause, so the host-side findings never share a gap. The
helpers here (the host time outside the ops that drive the GPU, the user-facing aten op of a
call, the optimizer's own spans) are read by the analyzers and by the replay's transformations
alike; what the host did beyond that (Python frames, copy syncs, update loops) is
:mod:`gpuprof.hostops`'s. Everything works on one rank's trace (:class:`gpuprof.trace.model.RankTrace`), vectorised
over whole columns.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np
import pandas as pd

from gpuprof.trace.model import RankTrace
from gpuprof.trace.names import ALLOCATOR_CALLS, GRAPH_LAUNCH_CALLS, SYNC_CALLS, call_kinds

#: Gap causes in the order the real (unprofiled) idle budget is given out: device round trips
#: first (little host work inside them), then stalls and input, then host work, which the
#: profiler inflates most.
CAUSE_ORDER = ("sync", "alloc", "stall", "input", "host_work", "launch", "graph", "other")

_GAP_COLUMNS = ["step", "start", "end", "dur", "prev_kind", "prev_row", "next_kind", "next_row", "next_launch_ts",
                "next_op"]

def gaps(t: RankTrace) -> pd.DataFrame:
    """Idle intervals of the GPU inside step windows, with what ended the gap.

    Columns: step, start, end, dur, prev_kind/prev_row (what ran last before the gap),
    next_kind (kernel/memcpy), next_row, next_launch_ts, next_op (row of ops or -1).
    Vectorised over all steps at once: each activity is listed once per step window it overlaps.
    """
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

#: A stretch of host time outside every op that drives the GPU is user Python (tokenising, data
#: preparation, logging), not dispatch glue, once it lasts this long: on the launch-bound real
#: samples the longest such stretch inside a step is 0.34 ms (tiny_eager, the autograd engine
#: starting) and 0.45 ms (gpt_bf16, views before attention), under the profiler; 1 ms is twice that.
HOST_WORK_MIN_US = 1000.0

#: One idle gap is a host *stall* (a blocking copy, a pause, a checkpoint save) when it alone holds
#: this share of its step and one op or runtime call covers most of it; launch-bound idle is many
#: gaps of kernel size, none of which holds a fifth of the step.
STALL_STEP_SHARE = 0.2

STALL_MIN_US = 1000.0

def in_graph(kernels: pd.DataFrame) -> np.ndarray:
    """Kernels launched by a graph replay: the loader's ``in_graph`` column when it has one,
    else from the launch call's name."""
    if "in_graph" in kernels.columns:
        return kernels["in_graph"].fillna(False).to_numpy(dtype=bool)
    if "launch_api" not in kernels.columns or not len(kernels):
        return np.zeros(len(kernels), dtype=bool)
    return kernels["launch_api"].astype(object).isin(GRAPH_LAUNCH_CALLS).to_numpy(dtype=bool)

def graph_capture_calls(t: RankTrace) -> int:
    """How many graph-capture calls the trace records: the loader's ``graph_capture_calls`` when it
    counts them, else counted here from the runtime calls' names."""
    v = getattr(t.meta, "graph_capture_calls", None)
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if not len(t.runtime):
        return 0
    return int((call_kinds(t.runtime["name"]) == "graph_capture").sum())

def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The sorted disjoint union of intervals, with for each piece the (sorted) index of the first
    interval in it and of the interval that ends it."""
    if not len(starts):
        e = np.zeros(0)
        return e, e, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    s, en = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    reach = np.maximum.accumulate(en)
    new = np.r_[True, s[1:] > reach[:-1]]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(s) - 1]
    pos = np.arange(len(s))
    setter = pd.Series(np.where(en == reach, pos, -1)).cummax().to_numpy()
    return s[first], reach[last], first, setter[last]

def covered(starts: np.ndarray, ends: np.ndarray, qs: np.ndarray, qe: np.ndarray) -> np.ndarray:
    """For each query interval [qs, qe], the time the union of the intervals (starts, ends) covers."""
    o = np.argsort(starts, kind="stable")
    us, ue, _, _ = _union(np.asarray(starts)[o], np.asarray(ends)[o])
    if not len(us):
        return np.zeros(len(qs))
    cum = np.r_[0.0, np.cumsum(ue - us)]

    def upto(x: np.ndarray) -> np.ndarray:
        j = np.searchsorted(us, x, side="right") - 1  # the last piece starting at or before x
        jj = np.maximum(j, 0)
        v: np.ndarray = np.where(j >= 0, cum[jj] + np.minimum(x, ue[jj]) - us[jj], 0.0)
        return v

    out: np.ndarray = np.maximum(upto(np.asarray(qe, dtype=float)) - upto(np.asarray(qs, dtype=float)), 0.0)
    return out

def _pairs(a_lo: np.ndarray, a_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Expand per-query index ranges [lo, hi) into (query, index) pairs."""
    cnt = np.maximum(a_hi - a_lo, 0)
    q = np.repeat(np.arange(len(a_lo)), cnt)
    idx = np.repeat(a_lo, cnt) + (np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt))
    return q, idx

def optimizer_spans(t: RankTrace, zero_grad: bool = False) -> pd.DataFrame:
    """The host spans of the optimizer's own work, sorted by start (columns ts, end, tid): each
    ``Optimizer.step#`` annotation from the end of the last op inside it that autograd recorded
    (a forward or backward op carries a ``Sequence number``; an update under ``no_grad`` does not)
    to its end, and with ``zero_grad`` the ``Optimizer.zero_grad#`` ones whole. An annotation is
    context, not ownership: a framework that runs its training closure inside ``optimizer.step``
    (Lightning's automatic optimisation, ``LBFGS``) puts the whole forward and backward inside
    the span, and those are the model's, not the optimizer's."""
    a = t.annotations
    pattern = r"^Optimizer\.(?:step|zero_grad)#" if zero_grad else r"^Optimizer\.step#"
    sel = ~a["on_gpu"].to_numpy(dtype=bool) & name_mask(a["name"], pattern)
    spans = pd.DataFrame({"ts": a["ts"].to_numpy(dtype=float)[sel], "end": a["end"].to_numpy(dtype=float)[sel],
                          "tid": a["tid"].to_numpy()[sel],
                          "step": name_mask(a["name"], r"^Optimizer\.step#")[sel]})
    ops = t.ops
    if len(spans) and len(ops) and "sequence_number" in ops.columns:
        tracked = (ops["sequence_number"].to_numpy() >= 0)
        o_ts = ops["ts"].to_numpy(dtype=float)[tracked]
        o_end = ops["end"].to_numpy(dtype=float)[tracked]
        order = np.argsort(o_ts, kind="stable")
        o_ts, o_end = o_ts[order], o_end[order]
        lo = np.searchsorted(o_ts, spans["ts"].to_numpy(), side="left")
        hi = np.searchsorted(o_ts, spans["end"].to_numpy(), side="right")
        start, stop = spans["ts"].to_numpy().copy(), spans["end"].to_numpy()
        for i in np.flatnonzero(spans["step"].to_numpy() & (hi > lo)):  # one per optimizer step
            ends = o_end[lo[i]:hi[i]]
            inside = ends[ends <= stop[i]]
            if len(inside):
                start[i] = max(start[i], float(inside.max()))
        spans["ts"] = start
    return spans.drop(columns="step").sort_values("ts", kind="stable").reset_index(drop=True)


#: :func:`driving_spans` of a trace: (starts, ends, op rows; -1 for an annotation).
Spans = tuple[np.ndarray, np.ndarray, np.ndarray]


def driving_spans(t: RankTrace, opt: pd.DataFrame | None = None) -> Spans:
    """The spans of the top-level ops that drive the GPU (a runtime call inside them, on their
    thread) and of the optimizer's ``Optimizer.step#``/``zero_grad#`` annotations (``opt``: those
    already read, :func:`optimizer_spans` with ``zero_grad``), sorted by start: (starts, ends, op
    rows; -1 for an annotation). :class:`gpuprof.rank.RankView` reads them once per rank."""
    ops, rt = t.ops, t.runtime
    ots_all, oen_all, otid, orows = _cols(ops, (ops["depth"] == 0).to_numpy())
    rts_all, _, rtid, _ = _cols(rt)
    drives = np.zeros(len(ots_all), dtype=bool)
    for tid in np.unique(otid):  # top-level ops of one thread do not overlap
        m = np.flatnonzero(otid == tid)
        m = m[np.argsort(ots_all[m], kind="stable")]
        ots, oen = ots_all[m], oen_all[m]
        rts = np.sort(rts_all[rtid == tid])
        k = np.searchsorted(ots, rts, side="right") - 1
        inside = (k >= 0) & (rts < oen[np.maximum(k, 0)])
        drives[m[np.unique(k[inside])]] = True
    if opt is None:
        opt = optimizer_spans(t, zero_grad=True)
    starts = np.r_[ots_all[drives], opt["ts"].to_numpy()]
    ends = np.r_[oen_all[drives], opt["end"].to_numpy()]
    rows = np.r_[orows[drives], np.full(len(opt), -1)]
    order = np.argsort(starts, kind="stable")
    return starts[order], ends[order], rows[order]

def time_in_ops(t: RankTrace, s: np.ndarray, e: np.ndarray, spans: Spans | None = None) -> np.ndarray:
    """Per interval [s, e] (trace times), the µs inside the union of :func:`driving_spans` (``spans``
    where already read): host time the model's ops (or the optimizer) account for, as opposed to
    user Python or CPU-only work between them (:func:`host_outside_ops`)."""
    s, e = np.asarray(s, dtype=float), np.asarray(e, dtype=float)
    if not len(t.ops) or not len(s):
        return np.zeros(len(s))
    us, ue, _, _ = _union(*(driving_spans(t) if spans is None else spans)[:2])
    if not len(us):
        return np.zeros(len(s))
    cum = np.r_[0.0, np.cumsum(ue - us)]

    def covered(x: np.ndarray) -> np.ndarray:  # µs of the union before x
        j = np.searchsorted(us, x, side="right") - 1
        jj = np.maximum(j, 0)
        part = np.clip(x - us[jj], 0.0, ue[jj] - us[jj])
        out: np.ndarray = np.where(j >= 0, cum[jj] + part, 0.0)
        return out

    inside: np.ndarray = np.maximum(covered(e) - covered(s), 0.0)
    return inside

def host_outside_ops(t: RankTrace, g: pd.DataFrame, spans: Spans | None = None) -> pd.DataFrame:
    """Per gap, the host time outside every top-level op that drives the GPU (an op with a runtime
    call inside it) on any thread, and outside the optimizer's own spans: user Python or CPU-only
    ops. Every thread counts, since a thread waiting for another (``loss.backward()`` waits for
    the autograd thread) is not doing work of its own; ``Optimizer.step#``/``zero_grad#`` spans
    count as driving, since their Python is the optimizer's, which fused or compiled optimizers
    remove.

    Columns: outside_us (in the gap), longest_us (the longest such stretch in the gap), hole_start,
    hole_end (that stretch, unclipped), prev_op, next_op (rows of ``ops`` bounding it, -1 if none).
    A trace without ops (GPU-only, some old formats) gives 0: nothing can be told apart.
    ``spans``: :func:`driving_spans` of ``t``, where already read.
    """
    n = len(g)
    out = {"outside_us": np.zeros(n), "longest_us": np.zeros(n), "hole_start": np.full(n, np.nan),
           "hole_end": np.full(n, np.nan), "prev_op": np.full(n, -1, dtype=np.int64),
           "next_op": np.full(n, -1, dtype=np.int64)}
    if not n or not len(t.ops):
        return pd.DataFrame(out, index=g.index)
    gs, ge = g["start"].to_numpy(dtype=float), g["end"].to_numpy(dtype=float)
    starts, ends, rows = driving_spans(t) if spans is None else spans
    us, ue, first, ender = _union(starts, ends)
    hs, he = np.r_[-np.inf, ue], np.r_[us, np.inf]
    h_prev = np.r_[-1, rows[ender]] if len(us) else np.array([-1])
    h_next = np.r_[rows[first], -1] if len(us) else np.array([-1])
    q, h = _pairs(np.searchsorted(he, gs, side="right"), np.searchsorted(hs, ge, side="left"))
    if not len(q):
        return pd.DataFrame(out, index=g.index)
    clip = np.maximum(np.minimum(he[h], ge[q]) - np.maximum(hs[h], gs[q]), 0.0)
    out["outside_us"] = np.bincount(q, weights=clip, minlength=n)
    order = np.lexsort((-clip, q))
    best = order[np.r_[True, q[order][1:] != q[order][:-1]]]
    gi, hb = q[best], h[best]
    out["longest_us"][gi] = clip[best]
    out["hole_start"][gi], out["hole_end"][gi] = hs[hb], he[hb]
    out["prev_op"][gi], out["next_op"][gi] = h_prev[hb], h_next[hb]
    return pd.DataFrame(out, index=g.index)

def name_mask(names: pd.Series, pattern: str | None = None, among: Iterable[str] = ()) -> np.ndarray:
    """Which names match ``pattern`` (a regex searched) or are ``among`` the given ones, decided
    once per distinct name (name columns are categorical: thousands of rows, tens of names)."""
    cat = names if isinstance(names.dtype, pd.CategoricalDtype) else names.astype("category")
    # a Python loop over the few distinct names: pandas' string methods cost ~1 ms a call whatever
    # the size, and the analyzers and the replay ask some twenty times a rank
    wanted = set(among)
    found = re.compile(pattern).search if pattern is not None else None
    text = [str(c) for c in cat.cat.categories]
    hit = np.fromiter((c in wanted or (found is not None and found(c) is not None) for c in text), dtype=bool,
                      count=len(text))
    codes = cat.cat.codes.to_numpy()
    return hit[codes] & (codes >= 0) if len(hit) else np.zeros(len(names), dtype=bool)

def has_backward(ops: pd.DataFrame) -> bool:
    """Whether autograd's backward ran among the recorded ops (a training step)."""
    return bool(name_mask(ops["name"], "Backward|autograd::engine").any())

def forward_only(trace: RankTrace) -> bool:
    """No backward and no ``Optimizer.step`` annotation in the trace: a forward-only program."""
    return not has_backward(trace.ops) and not name_mask(trace.annotations["name"], r"^Optimizer\.step#").any()

def _spans_in(starts: np.ndarray, ends: np.ndarray, gs: np.ndarray, ge: np.ndarray) -> np.ndarray:
    """Whether some span (sorted by start) overlaps each interval [gs, ge]: the last span starting
    before ge ends after gs. Exact for spans that do not nest, as DataLoader spans do not."""
    k = np.searchsorted(starts, ge, side="right") - 1
    return (k >= 0) & (ends[np.maximum(k, 0)] > gs)

def loader_spans(t: RankTrace) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the host's DataLoader spans (``enumerate(DataLoader)#...__next__``
    annotations, and top-level ops of such names in traces that record them as ops), sorted."""
    an, ops = t.annotations, t.ops
    a_m = ~an["on_gpu"].to_numpy(dtype=bool) & name_mask(an["name"], _LOADER)
    o_m = (ops["depth"] == 0).to_numpy() & name_mask(ops["name"], _LOADER)
    ls = np.r_[an["ts"].to_numpy(dtype=float)[a_m], ops["ts"].to_numpy(dtype=float)[o_m]]
    le = np.r_[an["end"].to_numpy(dtype=float)[a_m], ops["end"].to_numpy(dtype=float)[o_m]]
    o = np.argsort(ls, kind="stable")
    return ls[o], le[o]


def loader_us_per_step(t: RankTrace) -> float:
    """Host time per profiled step inside DataLoader spans (:func:`loader_spans`, their union),
    within the steps' host windows (``cpu_start``..``cpu_end``): what the profiled steps waited
    for (or spent loading) their batches, to set against the unprofiled steps' own figure
    (:mod:`gpuprof.steptime`)."""
    s = t.steps
    if not len(s) or "cpu_start" not in s.columns:
        return 0.0
    ls, le = loader_spans(t)
    if not len(ls):
        return 0.0
    le = np.maximum.accumulate(le)  # union of the spans: each start clipped to the ends before it
    prev = np.r_[-np.inf, le[:-1]]
    ls = np.maximum(ls, prev)
    total = 0.0
    for a, b in zip(s["cpu_start"].to_numpy(dtype=float), s["cpu_end"].to_numpy(dtype=float)):  # a few steps
        total += float(np.clip(np.minimum(le, b) - np.maximum(ls, a), 0.0, None).sum())
    return total / len(s)


def _cols(frame: pd.DataFrame, mask: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
    """ts, end, tid and row of a frame's events (optionally only where ``mask``), as arrays: the
    frames carry wide object columns that a row filter would copy for nothing."""
    ts, en = frame["ts"].to_numpy(dtype=float), frame["end"].to_numpy(dtype=float)
    tid, rows = frame["tid"].to_numpy(), frame.index.to_numpy()
    if mask is None:
        return ts, en, tid, rows
    return ts[mask], en[mask], tid[mask], rows[mask]

def _longest_on_thread(ev: tuple[np.ndarray, ...], g: pd.DataFrame, tids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per gap, the event of ``ev`` (``_cols``) on the launching thread that covers most of it:
    (row, µs covered), -1/0 where none. All (gap, event) overlaps are expanded at once, per thread."""
    n = len(g)
    row, cov = np.full(n, -1, dtype=np.int64), np.zeros(n)
    ts, en, tid_all, rows_all = ev
    if not len(ts):
        return row, cov
    gs, ge = g["start"].to_numpy(dtype=float), g["end"].to_numpy(dtype=float)
    for tid in np.unique(tids[tids >= 0]):
        sel = np.flatnonzero(tids == tid)
        m = np.flatnonzero(tid_all == tid)
        if not len(m):
            continue
        m = m[np.argsort(ts[m], kind="stable")]
        fs, fe = ts[m], en[m]
        reach = np.maximum.accumulate(fe)  # an event overlaps [gs, ge] only past the first reaching gs
        q, idx = _pairs(np.searchsorted(reach, gs[sel], side="right"), np.searchsorted(fs, ge[sel], side="left"))
        if not len(q):
            continue
        c = np.maximum(np.minimum(fe[idx], ge[sel][q]) - np.maximum(fs[idx], gs[sel][q]), 0.0)
        order = np.lexsort((-c, q))
        best = order[np.r_[True, q[order][1:] != q[order][:-1]]]
        gi = sel[q[best]]
        row[gi], cov[gi] = rows_all[m[idx[best]]], c[best]
    return row, cov

def classify_gaps(t: RankTrace, spans: Spans | None = None) -> pd.DataFrame:
    """Each idle gap with one cause, so the host-side analyzers never share a gap. In order of
    precedence:

    * ``input``: the host was inside a DataLoader span for at least half of a gap it ended late;
    * ``alloc``: an allocator call (``cudaFree``, ``hipMalloc``...) returned inside the gap or
      covers half of it (and the refill gaps after one, as for ``sync``), where such calls recur
      in at least half of the steps (a pool that grows once, in warm-up, is not churn);
    * ``graph``: a gap between two kernels of one graph replay (GPU-side; no host fix);
    * ``stall``: one gap holding ``STALL_STEP_SHARE`` of its step, mostly inside one op or call,
      or host work (below) found in fewer than half of the steps (a checkpoint every N steps);
    * ``host_work``: a late gap that the launching thread spent mostly outside every op driving
      the GPU, in one stretch of at least ``HOST_WORK_MIN_US`` (user Python, CPU preprocessing);
    * ``sync``: a synchronising call (``.item()``, ``.cpu()``, ``synchronize``) returned inside
      the gap: the GPU drained its queue and waits for the host to refill it; and the launch
      gaps that follow such a call until the host is ahead of the GPU again (some kernel queued
      before the previous one ended), since without the sync the host would still be ahead
      (the trace's host is slowed by the profiler: behind in the trace is not behind for real);
      where the host is never truly ahead again for the rest of the step (work queued at least
      one launch latency, the trace's own, before the GPU ran dry) it is behind with or without
      the call, and those gaps stay ``launch``.
      Calls made inside a DataLoader span (pinning, collation), or with nothing in flight when
      their op began (a ``synchronize()`` before the step's first launch), do not count;
    * ``launch``: the next kernel was launched only after the gap began: the host could not
      launch fast enough;
    * ``other``: the next work was already queued (dependencies, events across streams).

    Extra columns: ``call_row``/``call_us`` and ``op_row``/``op_us`` (the runtime call and the
    top-level op on the launching thread covering most of the gap, rows or -1, and µs covered),
    ``launch_tid``, and the :func:`host_outside_ops` columns (``spans``: :func:`driving_spans` of
    ``t``, where already read).
    """
    g = gaps(t)
    if g.empty:
        return g.assign(cause=pd.Series(dtype=object))
    gs, ge, dur = g["start"].to_numpy(dtype=float), g["end"].to_numpy(dtype=float), g["dur"].to_numpy(dtype=float)
    cause = np.full(len(g), "other", dtype=object)
    late = ~(g["next_launch_ts"].to_numpy() <= gs)
    cause[late] = "launch"
    is_k = (g["next_kind"] == "kernel").to_numpy()
    nxt = g["next_row"].to_numpy().astype(np.int64)
    k_tid = t.kernels["launch_tid"].to_numpy() if len(t.kernels) else np.zeros(0, dtype=np.int64)
    m_tid = t.memcpys["launch_tid"].to_numpy() if len(t.memcpys) else np.zeros(0, dtype=np.int64)
    tids = np.where(is_k, k_tid[np.where(is_k, nxt, 0)] if len(k_tid) else -1,
                    m_tid[np.where(is_k, 0, nxt)] if len(m_tid) else -1).astype(np.int64)

    ops = t.ops
    ls, le = loader_spans(t)
    in_loader = _spans_in(ls, le, gs, ge) if len(ls) else np.zeros(len(g), dtype=bool)

    rt = t.runtime[["name", "ts", "end", "step", "external_id"]]
    syncs = rt[name_mask(rt["name"], among=SYNC_CALLS)]
    if len(syncs) and len(ls):  # a sync made by the DataLoader is part of the input stall
        syncs = syncs[~_spans_in(ls, le, syncs["ts"].to_numpy(), syncs["end"].to_numpy())]
    allocs = rt[name_mask(rt["name"], among=ALLOCATOR_CALLS)]
    n_steps = int((t.steps["step"] >= 0).sum()) if len(t.steps) else 0
    if n_steps >= 2 and allocs.loc[allocs["step"] >= 0, "step"].nunique() < 0.5 * n_steps:
        allocs = allocs.iloc[:0]  # a pool growing once (warm-up) is not churn: its gaps keep their other cause
    acts = pd.concat([t.kernels[["ts", "end", "launch_ts"]], t.memcpys[["ts", "end", "launch_ts"]]]
                     ).sort_values("ts", kind="stable")
    nxt_launch = acts["launch_ts"].shift(-1).to_numpy()
    ahead = np.sort(acts["end"].to_numpy()[nxt_launch <= acts["end"].to_numpy()])
    # Truly ahead: the next work launched at least one launch latency before the GPU ran dry, so
    # the GPU did not wait for it. The latency is the trace's own, the median time from launch to
    # start of work launched onto an idle GPU (about 7 µs on CUDA, 18 µs on ROCm here): a launch
    # 4 µs before the end on an MI300X still leaves the GPU idle.
    on_idle = late & (g["next_launch_ts"].to_numpy() <= ge)
    latency = float(np.median(ge[on_idle] - g["next_launch_ts"].to_numpy()[on_idle])) if on_idle.any() else 0.0
    truly_ahead = np.sort(acts["end"].to_numpy()[nxt_launch + latency <= acts["end"].to_numpy()])
    st_sorted = t.steps.sort_values("start")
    st_s, st_e = st_sorted["start"].to_numpy(dtype=float), st_sorted["end"].to_numpy(dtype=float)

    def step_end_of(x: np.ndarray) -> np.ndarray:
        """End of the step window holding each time (inf outside every step)."""
        k = np.searchsorted(st_s, x, side="right") - 1
        inside = (k >= 0) & (x < st_e[np.maximum(k, 0)]) if len(st_s) else np.zeros(len(x), dtype=bool)
        return np.where(inside, st_e[np.maximum(k, 0)] if len(st_e) else np.inf, np.inf)

    e_order = np.argsort(acts["end"].to_numpy(), kind="stable")
    by_end = acts["end"].to_numpy()[e_order]
    launch_min_by_end = np.minimum.accumulate(acts["launch_ts"].fillna(np.inf).to_numpy()[e_order][::-1])[::-1]
    op_ext = ops["external_id"].to_numpy()
    op_order = np.argsort(op_ext, kind="stable")
    op_sorted = op_ext[op_order]

    def op_start_of(ext: np.ndarray) -> np.ndarray:
        """Start of the user-facing op (outermost aten op) a runtime call belongs to; inf if none."""
        if not len(op_sorted):
            return np.full(len(ext), np.inf)
        pos = np.clip(np.searchsorted(op_sorted, ext), 0, len(op_sorted) - 1)
        hit = (op_sorted[pos] == ext) & (ext >= 0)
        out = np.full(len(ext), np.inf)
        out[hit] = ops["ts"].to_numpy()[outermost_aten(ops, op_order[pos[hit]])]
        return out

    def drained_by(calls: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Gaps inside which one of ``calls`` returned, and the launch gaps refilling after one."""
        if len(calls) and len(acts):
            # A call drains something only if work launched before it returned was still in flight
            # when its op began (a synchronize() before the step's first launch waits for nothing).
            ref = np.minimum(calls["ts"].to_numpy(), op_start_of(calls["external_id"].to_numpy()))
            j = np.searchsorted(by_end, ref, side="right")
            calls = calls[(j < len(by_end)) & (launch_min_by_end[np.minimum(j, len(by_end) - 1)] < calls["end"].to_numpy())]
        if not len(calls):
            z = np.zeros(len(g), dtype=bool)
            return z, np.full(len(g), -np.inf)
        se = np.sort(calls["end"].to_numpy())
        lo = np.searchsorted(se, gs, side="left")
        hi = np.searchsorted(se, ge, side="right")
        last = np.where(lo > 0, se[np.maximum(lo - 1, 0)], -np.inf)
        regained = np.searchsorted(ahead, gs) - np.searchsorted(ahead, last)
        refill = late & (lo > 0) & (regained == 0)
        if refill.any():
            # A host that is never truly ahead of the GPU again for the rest of the step after
            # the call is behind with or without it: tiny kernels each launched after the last one
            # ended leave the same gaps with no sync at all, so those are launch gaps. The call
            # owns its refill only where the host does get ahead again within the step.
            ci = lo[refill] - 1
            nxt = np.searchsorted(truly_ahead, se, side="right")
            first_ahead = np.r_[truly_ahead, np.inf][nxt]
            refill[refill] = (first_ahead <= step_end_of(se))[ci]
        return (hi > lo) | refill, np.where(hi > lo, se[np.maximum(hi - 1, 0)], last) if len(se) else last

    sync_hit, sync_last = drained_by(syncs)
    alloc_hit, alloc_last = drained_by(allocs)
    alloc_cov = covered(allocs["ts"].to_numpy(), allocs["end"].to_numpy(), gs, ge) if len(allocs) else 0 * gs
    # Where both a sync and an allocator call drained the queue, the later one left the GPU idle.
    alloc_gap = (alloc_hit & (~sync_hit | (alloc_last >= sync_last))) | (alloc_cov >= 0.5 * dur)

    prev = g["prev_row"].to_numpy().astype(np.int64)
    graph = np.zeros(len(g), dtype=bool)
    if len(t.kernels):
        ig = in_graph(t.kernels)
        corr = t.kernels["correlation"].to_numpy()
        both = is_k & (g["prev_kind"] == "kernel").to_numpy() & (prev >= 0)
        pk, nk = np.where(both, prev, 0), np.where(both, nxt, 0)
        graph = both & ig[pk] & ig[nk] & (corr[pk] == corr[nk])

    call_row, call_us = _longest_on_thread(_cols(t.runtime), g, tids)
    op_row, op_us = _longest_on_thread(_cols(t.ops, (t.ops["depth"] == 0).to_numpy()), g, tids)
    step_time = t.steps.set_index("step")["time"] if "time" in t.steps.columns else pd.Series(dtype=float)
    st = g["step"].map(step_time).fillna(0.0).to_numpy(dtype=float)
    stall = (dur >= np.maximum(STALL_MIN_US, STALL_STEP_SHARE * st)) & (np.maximum(call_us, op_us) >= 0.5 * dur)

    outside = host_outside_ops(t, g, spans)
    work = late & (outside["longest_us"].to_numpy() >= np.maximum(HOST_WORK_MIN_US, 0.5 * dur))
    # Long host work in only some of the steps (a checkpoint save every N steps) is a stall:
    # work that recurs every step (tokenising) is input work. One profiled step cannot tell.
    steps_total = int(t.steps["step"].nunique()) if len(t.steps) else 0
    in_steps = pd.Series(g["step"].to_numpy()[work]).nunique()
    if steps_total >= 2 and in_steps < 0.5 * steps_total:
        stall |= work
        work[:] = False

    cause[sync_hit] = "sync"
    cause[work] = "host_work"
    cause[stall] = "stall"
    cause[graph] = "graph"
    cause[alloc_gap] = "alloc"
    # most of the gap inside the loader, as for the other causes: a short __next__ at the edge of a
    # long gap (a worker queue that was ready) does not make it an input stall
    loader_cov = covered(ls, le, gs, ge) if len(ls) else np.zeros(len(g))
    cause[in_loader & late & (loader_cov >= 0.5 * dur)] = "input"
    return g.assign(cause=cause, call_row=call_row, call_us=call_us, op_row=op_row, op_us=op_us, launch_tid=tids, **{c: outside[c].to_numpy() for c in outside.columns})

def outermost_aten(ops: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """For each op row, the outermost op of the chain of ``aten::`` ops it is nested in (itself if
    it is not an aten op): the user-facing call (``aten::item`` over ``aten::_local_scalar_dense``).
    Vectorised: one pass per nesting level."""
    cur = np.asarray(rows, dtype=np.int64).copy()
    if not len(cur):
        return cur
    names = ops["name"].astype("category")
    aten = np.array([str(c).startswith("aten::") for c in names.cat.categories], dtype=bool)
    is_aten = aten[names.cat.codes.to_numpy()] if len(aten) else np.zeros(len(ops), dtype=bool)
    parent = ops["parent"].to_numpy().astype(np.int64)
    active = is_aten[cur]
    while active.any():
        p = parent[cur]
        ok = active & (p >= 0)
        ok[ok] = is_aten[p[ok]]
        cur[ok] = p[ok]
        active = ok
    return cur
