"""Transformations of a :class:`~gpuprof.replay.graph.Graph` (Daydream's primitives).

Each is a pure function ``(graph, ...) -> graph`` that changes weights, never the traced times, so
any list of them composes and the replay prices them together. Selectors are boolean masks over
the graph's host calls (``h_*``) or activities (``a_*``); :func:`kernels_of` and friends build
them from rows of the trace model's frames.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpuprof.replay.graph import Graph


def deflate(g: Graph, event_cost_us: float | np.ndarray) -> Graph:
    """Take the profiler's cost out of the host: each recorded host event (an op, a runtime call)
    cost ``event_cost_us`` (a scalar or one per rank), taken from the host time before the call
    (the gap, then the call itself). A call's wait for the GPU is untouched."""
    cost = np.asarray(event_cost_us, dtype=float)
    c = cost[g.h_rank] if cost.ndim else np.full(g.n_host, float(cost))
    owed = c * g.h_events
    gap_pos = np.maximum(g.h_gap, 0.0)
    from_gap = np.minimum(owed, gap_pos)
    from_dur = np.minimum(owed - from_gap, g.h_dur)
    return replace(g, h_gap=g.h_gap - from_gap, h_dur=g.h_dur - from_dur)


def scale_activities(g: Graph, sel: np.ndarray, factor: float | np.ndarray) -> Graph:
    """Selected kernels/copies run ``factor`` × as long (0.5: twice as fast)."""
    return set_durations(g, sel, g.a_dur[sel] * np.asarray(factor, dtype=float))


def set_durations(g: Graph, sel: np.ndarray, dur_us: float | np.ndarray) -> Graph:
    """Selected kernels/copies run ``dur_us`` µs (e.g. their roofline time at a new precision)."""
    d = g.a_dur.copy()
    d[sel] = dur_us
    return replace(g, a_dur=np.maximum(d, 0.0))


def remove_activities(g: Graph, sel: np.ndarray, with_launch: bool = True,
                      keep_gap: np.ndarray | None = None) -> Graph:
    """Selected kernels/copies vanish: no time on the GPU, no gap on their stream and, with
    ``with_launch``, no host time for the calls that launched them (gap before and the call),
    except the gap before the calls ``keep_gap`` selects (host work that stays)."""
    g = replace(g, a_dur=np.where(sel, 0.0, g.a_dur), a_sgap=np.where(sel, 0.0, g.a_sgap),
                a_lat=np.where(sel, 0.0, g.a_lat))
    if with_launch:
        calls = launches_of(g, sel)
        if keep_gap is None:
            return shrink_host(g, calls, 0.0)
        g = shrink_host(g, calls & ~keep_gap, 0.0)
        g = replace(g, h_dur=np.where(calls & keep_gap, 0.0, g.h_dur))
    return g


def fuse(g: Graph, groups: np.ndarray, dur_us: np.ndarray) -> Graph:
    """Each group of activities (``groups[k]`` = group id, -1 not fused) becomes one kernel of
    ``dur_us[group]`` µs: the group's first activity takes that time, the rest and their launches
    vanish."""
    sel = groups >= 0
    ids = np.flatnonzero(sel)
    _, first = np.unique(groups[ids], return_index=True)
    keep = np.zeros(g.n_acts, dtype=bool)
    keep[ids[first]] = True
    g = remove_activities(g, sel & ~keep)
    return set_durations(g, keep, np.asarray(dur_us, dtype=float)[groups[keep]])


def shrink_host(g: Graph, calls: np.ndarray, factor: float | np.ndarray) -> Graph:
    """The host time of the selected calls (the gap before each and the call) × ``factor``:
    0 removes the Python work and the launch cost (CUDA graphs, moving work to a worker)."""
    f = np.asarray(factor, dtype=float)
    gap = np.where(calls & (g.h_gap > 0), g.h_gap * f, g.h_gap)
    return replace(g, h_gap=gap, h_dur=np.where(calls, g.h_dur * f, g.h_dur))


def shrink_tail(g: Graph, calls: np.ndarray, factor: float | np.ndarray) -> Graph:
    """The selected waiting calls' time after the GPU work they waited for ended, until they
    returned (``h_tail``: a ``cudaFree``/``hipFree`` releasing memory after its device sync, a
    blocking call's own host work), × ``factor``."""
    f = np.asarray(factor, dtype=float)
    tail = np.where(calls & (g.h_tail > 0), g.h_tail * f, g.h_tail)
    return replace(g, h_tail=tail)


def typical_latency(g: Graph) -> np.ndarray:
    """Per activity: the median launch latency of its rank (launch call start to the activity's
    start, over the rank's launched activities), the weight an unobstructed launch gets."""
    out = np.zeros(g.n_acts)
    launched = g.a_launch >= 0
    for r in range(len(g.ranks)):  # ranks are few (one without activities sets nothing)
        m = g.a_rank == r
        lat = g.a_lat[m & launched]
        out[m] = float(np.median(lat)) if len(lat) else 0.0
    return out


def shrink_latency(g: Graph, acts: np.ndarray, factor: float | np.ndarray) -> Graph:
    """The selected activities' launch latency beyond their rank's typical one × ``factor``: the
    host time a call spent between its start and its work reaching the GPU (a blocking copy that
    staged or waited on the host for hundreds of ms before its transfer began)."""
    f = np.broadcast_to(np.asarray(factor, dtype=float), g.a_lat.shape)
    typ = typical_latency(g)
    over = acts & (g.a_lat > typ)
    lat = np.where(over, typ + (g.a_lat - typ) * f, g.a_lat)
    return replace(g, a_lat=lat)


def add_host(g: Graph, calls: np.ndarray, add_us: np.ndarray) -> Graph:
    """Host work a fix adds: call ``calls[j]`` (indices, repeats allowed) takes ``add_us[j]`` µs
    longer (e.g. the casts autocast inserts before a matrix op)."""
    d = g.h_dur.copy()
    np.add.at(d, np.asarray(calls, dtype=np.int64), np.asarray(add_us, dtype=float))
    return replace(g, h_dur=d)


def set_host_cost(g: Graph, calls: np.ndarray, per_call_us: float) -> Graph:
    """The selected calls cost ``per_call_us`` each with no host work between them (a CUDA
    graph: one launch for many kernels)."""
    gap = np.where(calls & (g.h_gap > 0), 0.0, g.h_gap)
    return replace(g, h_gap=gap, h_dur=np.where(calls, per_call_us, g.h_dur))


def drop_waits(g: Graph, calls: np.ndarray) -> Graph:
    """The selected calls no longer wait for the GPU (a sync removed, a copy made asynchronous);
    they cost what the same call costs when it does not wait."""
    return replace(g, h_wait=np.where(calls, -1, g.h_wait))


def rebalance_host(g: Graph, rank: int, factor: float) -> Graph:
    """Rank ``rank``'s host work between calls × ``factor`` (a slow rank brought in line)."""
    i = g.ranks.index(rank)
    return shrink_host(g, g.h_rank == i, factor)


def rebalance_to(g: Graph, slow: int, fast: int) -> Graph:
    """Rank ``slow``'s host work brought down to rank ``fast``'s: the excess host time in the
    profiled steps (the slow rank's gaps less the fast rank's) is cut from the slow rank's
    longest gaps first (all cut to one level), where a sleep, a straggler's extra data loading
    or logging shows up. Ranks of one data-parallel job run the same program, so the fast rank's
    host time is what the slow one's would be without its extra work."""
    si, fi = g.ranks.index(slow), g.ranks.index(fast)
    mine = np.flatnonzero((g.h_rank == si) & (g.h_step >= 0) & (g.h_gap > 0))
    theirs = (g.h_rank == fi) & (g.h_step >= 0) & (g.h_gap > 0)
    excess = float(g.h_gap[mine].sum() - g.h_gap[theirs].sum())
    return trim_host(g, mine, excess) if excess > 0 else g


def trim_host(g: Graph, calls: np.ndarray, total_us: float) -> Graph:
    """``total_us`` of host time cut from the longest gaps before the given calls (indices), all
    cut down to one level: the least change that removes that much."""
    gaps = np.maximum(g.h_gap[calls], 0.0)
    desc = np.sort(gaps)[::-1]
    # removing everything above desc[k] takes sum(desc[:k]) - k * desc[k]
    cost = np.cumsum(desc) - np.arange(1, len(desc) + 1) * desc
    k = int(np.searchsorted(cost, total_us))  # first level that removes enough
    k = min(max(k, 1), len(desc))
    level = max((float(desc[:k].sum()) - total_us) / k, 0.0)
    gap = g.h_gap.copy()
    gap[calls] = np.minimum(g.h_gap[calls], level)
    return replace(g, h_gap=gap)


# --- selectors from the trace model's rows -------------------------------------------------------
def activities_of(g: Graph, rank: int, kind: str, rows: np.ndarray) -> np.ndarray:
    """Mask of the activities that are rows ``rows`` of rank ``rank``'s kernels (``kind="kernel"``)
    or memcpys (``"memcpy"``) frame."""
    i = g.ranks.index(rank)
    k = 0 if kind == "kernel" else 1
    out: np.ndarray = (g.a_rank == i) & (g.a_kind == k) & np.isin(g.a_row, np.asarray(rows))
    return out


def calls_of(g: Graph, rank: int, rows: np.ndarray) -> np.ndarray:
    """Mask of the host calls that are rows ``rows`` of rank ``rank``'s runtime frame."""
    i = g.ranks.index(rank)
    out: np.ndarray = (g.h_rank == i) & np.isin(g.h_row, np.asarray(rows))
    return out


def launches_of(g: Graph, acts: np.ndarray) -> np.ndarray:
    """Mask of the host calls that launched the selected activities."""
    out = np.zeros(g.n_host, dtype=bool)
    out[g.a_launch[acts & (g.a_launch >= 0)]] = True
    return out


def calls_within(g: Graph, rank: int, runtime_tid: np.ndarray, spans: list[tuple[float, float, int]]) -> np.ndarray:
    """Mask of rank ``rank``'s host calls made inside any of ``spans`` (trace times ``(start, end,
    tid)``, e.g. the ops of one kind); ``runtime_tid`` is the tid column of the rank's runtime frame."""
    i = g.ranks.index(rank)
    mine = np.flatnonzero(g.h_rank == i)
    ts = g.h_ts[mine] - g.rank_offset_us[i]
    tid = np.asarray(runtime_tid)[g.h_row[mine]]
    out = np.zeros(g.n_host, dtype=bool)
    if not spans:
        return out
    sp = np.array(spans, dtype=float)
    for t in np.unique(sp[:, 2]):  # threads are few
        s = sp[sp[:, 2] == t]
        s = s[np.argsort(s[:, 0])]
        on = tid == t
        k = np.searchsorted(s[:, 0], ts[on], side="right") - 1
        inside = (k >= 0) & (ts[on] <= np.maximum.accumulate(s[:, 1])[np.maximum(k, 0)])
        out[mine[on][inside]] = True
    return out


def activities_launched_by(g: Graph, calls: np.ndarray) -> np.ndarray:
    """Mask of the activities launched by the selected host calls."""
    out: np.ndarray = (g.a_launch >= 0) & calls[np.maximum(g.a_launch, 0)]
    return out
