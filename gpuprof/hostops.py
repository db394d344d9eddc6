"""What the host was doing around the GPU's work, read from one rank's trace: the user's Python
frames behind a call, the syncs a pageable copy makes and the gaps they drain, and the
per-parameter update loops no optimizer annotated (a hand-written SGD over ``model.parameters()``).
Read by the analyzers and by the replay's transformations alike; the idle gaps themselves are
:mod:`gpuprof.idle`'s.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.idle import name_mask, optimizer_spans, outermost_aten
from gpuprof.trace.model import RankTrace
from gpuprof.trace.names import SYNC_CALLS


#: Python frames that are not the user's code: builtins, torch, installed packages, the standard
#: library, and the per-module events the profiler adds.
_LIB_FRAME = r"^<built-in|^<frozen|^torch/|site-packages/|dist-packages/|/lib/python3|^nn\.Module: |^Optimizer\.|" \
             r"^(?:threading|contextlib|functools|abc|typing)\.py\("

def python_frames(t: RankTrace, tids: np.ndarray, times: np.ndarray, outer: int = 0) -> np.ndarray:
    """Per (thread, time), the innermost frame of the user's own Python code running there
    (``file.py(line): function`` of a ``with_stack=True`` trace; None without stacks or outside
    user code); with ``outer`` > 0, rows of ``t.python`` instead: that frame and its user-code
    callers, ``outer + 1`` columns, -1 where none. Vectorised: one pass per nesting level."""
    from gpuprof.trace.links import nest

    n = len(times)
    py = getattr(t, "python", None)
    if py is None or not len(py) or not n:
        return np.full((n, outer + 1), -1, dtype=np.int64) if outer else np.full(n, None, dtype=object)
    _, parent = nest(py[["ts", "dur", "end", "tid"]].assign(pid=0))  # frames of one process
    ts, en, tid = py["ts"].to_numpy(dtype=float), py["end"].to_numpy(dtype=float), py["tid"].to_numpy()
    user = ~name_mask(py["name"], _LIB_FRAME)
    x = np.asarray(times, dtype=float)
    cur = np.full(n, -1, dtype=np.int64)
    for th in np.unique(tids):
        sel = np.flatnonzero(tids == th)
        m = np.flatnonzero(tid == th)
        if not len(m):
            continue
        m = m[np.argsort(ts[m], kind="stable")]
        k = np.searchsorted(ts[m], x[sel], side="right") - 1
        cur[sel] = np.where(k >= 0, m[np.maximum(k, 0)], -1)

    def climb(c: np.ndarray) -> np.ndarray:
        # the latest frame started before x: its first ancestor holding x that is user code
        c = c.copy()
        while True:
            ok = c >= 0
            cc = np.maximum(c, 0)
            need = ok & ~((ts[cc] <= x) & (en[cc] > x) & user[cc])
            if not need.any():
                return c
            c[need] = parent[c[need]]

    cur = climb(cur)
    if not outer:
        names = py["name"].astype(object).to_numpy()
        found = np.full(n, None, dtype=object)
        found[cur >= 0] = names[cur[cur >= 0]]
        return found
    out = np.full((n, outer + 1), -1, dtype=np.int64)
    out[:, 0] = cur
    for i in range(1, outer + 1):
        up = np.where(cur >= 0, parent[np.maximum(cur, 0)], -1)
        cur = climb(up)
        out[:, i] = cur
    return out



def pageable_copy_syncs(t: RankTrace, copies: np.ndarray | None = None) -> np.ndarray:
    """Rows of ``t.runtime``: the synchronising calls a host-to-device copy of pageable memory makes
    itself, inside the outermost aten op (``aten::to``, ``aten::copy_``) that launched the copy,
    on its thread. A blocking ``.to("cuda")`` of pageable memory is ``cudaMemcpyAsync`` then
    ``cudaStreamSynchronize`` in one op; with pinned memory and ``non_blocking=True`` neither waits,
    so these syncs are the copy's (pageable_memcpy's fix), not a fetched value's (host_sync's).
    ``copies``: only those of these rows of ``t.memcpys``."""
    m, ops, rt = t.memcpys, t.ops, t.runtime
    if not len(m) or not len(ops) or not len(rt) or "op" not in m.columns:
        return np.zeros(0, dtype=np.int64)
    # host to device only: a copy to the host (`.item()`, `.cpu()`) is a value the host waits
    # for whatever memory it lands in (host_sync)
    pg = (m["src"].astype(str) == "Pageable").to_numpy() & (m["kind"].astype(str) == "HtoD").to_numpy() \
        & (m["op"].to_numpy() >= 0)
    if copies is not None:
        pg &= np.isin(np.arange(len(m)), np.asarray(copies, dtype=np.int64))
    if not pg.any():
        return np.zeros(0, dtype=np.int64)
    rows = np.unique(outermost_aten(ops, m["op"].to_numpy()[pg].astype(np.int64)))
    sp = np.c_[ops["ts"].to_numpy(dtype=float)[rows], ops["end"].to_numpy(dtype=float)[rows]]
    tid = ops["tid"].to_numpy()[rows]
    sync = np.flatnonzero(name_mask(rt["name"], among=SYNC_CALLS))
    rts, rtid = rt["ts"].to_numpy(dtype=float)[sync], rt["tid"].to_numpy()[sync]
    inside = np.zeros(len(sync), dtype=bool)
    for th in np.unique(tid):  # threads are few
        s = sp[tid == th]
        s = s[np.argsort(s[:, 0], kind="stable")]
        on = rtid == th
        k = np.searchsorted(s[:, 0], rts[on], side="right") - 1
        inside[np.flatnonzero(on)] = (k >= 0) & (rts[on] <= s[np.maximum(k, 0), 1])
    out: np.ndarray = sync[inside]
    return out


def draining_call(t: RankTrace, g: pd.DataFrame, calls: np.ndarray) -> np.ndarray:
    """Per idle gap of ``g``, the row of ``t.runtime`` among ``calls`` (rows) that ended last at or
    before the gap's end, -1 if none: the call that drained the queue before a ``sync`` gap (one
    returned inside it) or before the refill gaps after it (:func:`classify_gaps`)."""
    if not len(g) or not len(calls):
        return np.full(len(g), -1, dtype=np.int64)
    calls = np.asarray(calls, dtype=np.int64)
    end = t.runtime["end"].to_numpy(dtype=float)[calls]
    o = np.argsort(end, kind="stable")
    k = np.searchsorted(end[o], g["end"].to_numpy(dtype=float), side="right") - 1
    out: np.ndarray = np.where(k >= 0, calls[o][np.maximum(k, 0)], -1)
    return out


def copy_sync_gaps(t: RankTrace, g: pd.DataFrame) -> np.ndarray:
    """Which ``sync`` gaps of ``g`` (rows of :func:`classify_gaps`) a pageable copy's own sync
    (:func:`pageable_copy_syncs`) drained: the last synchronising call to end before the gap did
    is one of them."""
    own = pageable_copy_syncs(t)
    if not len(g) or not len(own):
        return np.zeros(len(g), dtype=bool)
    every = np.flatnonzero(name_mask(t.runtime["name"], among=SYNC_CALLS))
    out: np.ndarray = (g["cause"] == "sync").to_numpy() & np.isin(draining_call(t, g, every), own)
    return out


#: A hand-written update loop repeats its ops once per parameter: at least this many repeats
#: (parameter tensors) of one pattern of at most ``UPDATE_MAX_PERIOD`` ops make one. A model's
#: smallest trainable stacks have tens of tensors (the hand-written MLP-Mixer 102, EfficientNet-B0
#: 213); a few repeats of two or three ops after backward (a loss, a metric) are no loop.
UPDATE_MIN_REPEATS = 16
UPDATE_MAX_PERIOD = 8


def update_loops(t: RankTrace, opt: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per-parameter update loops read from the ops alone, whatever launched them (a hand-written
    momentum SGD over ``model.parameters()`` in Python, an EMA of the weights, per-tensor
    clipping): after the last op autograd recorded in a step (its backward), outside every
    ``Optimizer.step#`` span (:func:`optimizer_spans` reads those), a run of top-level ``aten::``
    ops on one thread whose names repeat with a period of at most ``UPDATE_MAX_PERIOD`` ops, at
    least ``UPDATE_MIN_REPEATS`` times, on inputs of more than one shape (one set of ops per
    parameter, not one tensor updated again and again).

    Columns: ``ts``, ``end``, ``tid`` (the loop's host span), ``step``, ``period`` (ops per
    parameter), ``repeats`` (parameters), ``pattern`` (the op names of one repeat, joined by
    ", "), ``first`` (row of ``t.ops``: the loop's first op); sorted by start. ``opt``: the
    trace's :func:`optimizer_spans` where the caller has them already."""
    cols = ["ts", "end", "tid", "step", "period", "repeats", "pattern", "first"]
    ops, steps = t.ops, t.steps
    if not len(ops) or not len(steps) or "sequence_number" not in ops.columns:
        return pd.DataFrame(columns=cols)
    ts, en = ops["ts"].to_numpy(dtype=float), ops["end"].to_numpy(dtype=float)
    tid, depth = ops["tid"].to_numpy(), ops["depth"].to_numpy()
    tracked = ops["sequence_number"].to_numpy() >= 0
    names = ops["name"].astype("category")
    cats = pd.Series(names.cat.categories.astype(str))
    code = names.cat.codes.to_numpy()
    aten = cats.str.startswith("aten::").to_numpy()[code] & (code >= 0)
    top = (depth == 0) & aten & ~tracked
    if opt is None:
        opt = optimizer_spans(t)
    if len(opt):
        k = np.searchsorted(opt["ts"].to_numpy(), ts, side="right") - 1
        top &= ~((k >= 0) & (ts < opt["end"].to_numpy()[np.maximum(k, 0)]))
    st = steps.sort_values("cpu_start", kind="stable")
    starts = st["cpu_start"].to_numpy(dtype=float)
    bounds = np.r_[starts[1:], np.inf]
    dims = ops["input_dims"].astype(object).to_numpy() if "input_dims" in ops.columns else None
    out = []
    for step, lo, hi in zip(st["step"].to_numpy(), starts, bounds):  # steps are few
        bwd = tracked & (ts >= lo) & (ts < hi)
        if not bwd.any():
            continue  # no autograd in the step: no backward to follow
        after = float(en[bwd].max())
        for th in np.unique(tid[top & (ts >= after) & (ts < hi)]):  # threads are few
            rows = np.flatnonzero(top & (tid == th) & (ts >= after) & (ts < hi))
            rows = rows[np.argsort(ts[rows], kind="stable")]
            loop = _periodic_run(code[rows])
            if loop is None:
                continue
            a, b, p = loop
            sel = rows[a:b]
            heads = sel[::p]
            if dims is not None and len({str(dims[r]) for r in heads}) < 2:
                continue  # one tensor updated over and over, not one set of ops per parameter
            out.append((ts[sel[0]], float(en[sel].max()), th, step, p, (b - a) // p,
                        ", ".join(str(cats.iat[c]) for c in code[sel[:p]]), int(sel[0])))
    return pd.DataFrame(out, columns=cols).sort_values("ts", kind="stable").reset_index(drop=True)


def _periodic_run(seq: np.ndarray) -> tuple[int, int, int] | None:
    """The longest stretch ``[a, b)`` of ``seq`` that repeats one pattern of ``p`` items at least
    ``UPDATE_MIN_REPEATS`` times (whole repeats only), with the smallest such ``p``; None if none."""
    best: tuple[int, int, int] | None = None
    n = len(seq)
    for p in range(1, UPDATE_MAX_PERIOD + 1):
        if n < p * UPDATE_MIN_REPEATS:
            break
        same = np.r_[seq[p:] == seq[:-p], np.zeros(p, dtype=bool)]
        # runs of matches: item i repeats p later; a run of length L covers L + p items
        edges = np.flatnonzero(np.diff(np.r_[0, same.astype(np.int8), 0]))
        for s, e in zip(edges[0::2], edges[1::2]):
            reps = (e - s + p) // p
            if reps >= UPDATE_MIN_REPEATS and (best is None or reps * p > best[1] - best[0]):
                best = (int(s), int(s + reps * p), p)
        if best is not None:
            return best
    return best
