"""Replaying a :class:`~gpuprof.replay.graph.Graph`: every node's time, and the step times.

Each chain (a rank's host calls, a stream's activities) is a max-plus recurrence
``v[j] = max(v[j-1] + a[j], b[j])``, where ``a`` is the edge from the chain predecessor and ``b``
gathers the edges from other chains (launches, waits, other streams, other ranks). Given ``b``, a
stretch of a chain is one vectorised scan: ``v[j] = A[j] + max_{m<=j} (b[m] - A[m])`` with ``A``
the cumulative sum of ``a`` (``np.maximum.accumulate``). The graph is acyclic, so its
longest-path times are the one fixed point. Three ways to reach it (:func:`simulate` picks):

* whole-graph passes from the traced times (:func:`_as_traced`): the unchanged graph settles in
  a few, whatever its syncs;
* in dependency order (:func:`_in_order`, graphs without collectives): each chain solved as far
  as its outside inputs are final, round after round, every node once. A sync costs a round of
  a few scans of the stretch since the last one (benchmarks/replay_speed.py: the 100k-kernel
  sync-heavy GPT, 76 ``.item()`` a step, every host span changed: 0.3-0.4 s, was 6 s by passes);
* windowed passes (:func:`_by_passes`, graphs with collectives, whose ends need every rank's
  arrival): host and GPU scans alternated over time-ordered windows until nothing moves, a pass
  per crossing from the GPU back to the host (or between streams or ranks against the pass
  order), plus one per window.

The rounds and the passes run in C where ``native/_solve.c`` is compiled, to the numpy loops'
floats bit for bit (tests/test_replay_solve.py); the numpy loops stay for where it is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuprof.errors import GpuprofError
from gpuprof.replay.graph import Graph

_native_in_order: Any
_native_passes_c: Any
try:
    from gpuprof.replay.native._solve import in_order as _native_in_order
except ImportError:  # not compiled (the extension is optional): the same rounds in numpy, slower
    _native_in_order = None
try:
    from gpuprof.replay.native._solve import passes as _native_passes_c
except ImportError:
    _native_passes_c = None

#: Whether :func:`_in_order` runs its rounds in C (``native/_solve.c``; the same floats as the numpy loop).
NATIVE = _native_in_order is not None

MAX_PASSES = 100_000
#: Items (host calls and GPU activities) per window of the time-ordered sweep.
WINDOW = 4096
#: Times closer than this (µs) count as settled.
SETTLED_US = 1e-6


@dataclass(frozen=True)
class Times:
    """Replayed start and end of every node (µs, shared clock) and how many passes it took."""

    h_start: np.ndarray
    h_end: np.ndarray
    a_start: np.ndarray
    a_end: np.ndarray
    passes: int


def _scan(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``v[j] = max(v[j-1] + a[j], b[j])`` with ``v[0] = b[0]`` (finite)."""
    acc = np.cumsum(a)
    acc -= a[0]  # the sum from a[1]: v[0] takes no edge from before the chain
    out: np.ndarray = acc + np.maximum.accumulate(b - acc)
    return out


def _interleave(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = np.empty(2 * len(x))
    out[0::2], out[1::2] = x, y
    return out


def _moved(new: np.ndarray, old: np.ndarray) -> bool:
    """More than rounding: a slice scanned alone sums in another order than its whole chain."""
    return bool(np.any(np.abs(new - old) > SETTLED_US))


def _segments(first: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.r_[np.flatnonzero(first), len(first)]
    return out


def _seg_cummax(x: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    out = x.copy()
    for lo, hi in zip(bounds[:-1], bounds[1:]):  # chains are few
        out[lo:hi] = np.maximum.accumulate(x[lo:hi])
    return out


class _State:
    """The replay's working times (local to one :func:`simulate` call) and one pass over a
    window: each chain's items in the window scanned once, their outside inputs gathered from
    the latest times."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.hs, self.he = g.h_ts.copy(), g.h_end.copy()
        self.as_, self.ae = g.a_ts.copy(), g.a_end.copy()
        cm = np.flatnonzero(g.a_coll >= 0)
        self.coll_members = cm[np.argsort(g.a_coll[cm], kind="stable")]  # by collective, for reduceat
        self.coll_bounds = np.flatnonzero(np.r_[True, np.diff(g.a_coll[self.coll_members]) != 0]) if len(cm) else cm
        self.coll_ids = g.a_coll[self.coll_members[self.coll_bounds]] if len(cm) else cm
        self.n_coll = int(g.a_coll.max()) + 1 if len(cm) else 0
        self.a_root = g.a_first & (g.a_launch < 0) & (g.a_dep < 0)
        self.last: dict[str, tuple[list[tuple[int, int]], np.ndarray, np.ndarray]] = {}
        self.idx: dict[str, tuple[list[tuple[int, int]], np.ndarray]] = {}

    def todo(self, side: str, ranges: list[tuple[int, int]], bs: np.ndarray, be: np.ndarray) -> np.ndarray | None:
        """Per range, whether its outside inputs changed since it was last scanned over the same
        ranges (None: scan all). A chain is a function of those inputs alone (its gaps and
        durations are fixed, the item before the window is final), so an unchanged one would
        give back what it holds: across ranks, most chains of a window settle passes before the
        last crossing does."""
        prev = self.last.get(side)
        self.last[side] = (ranges, bs, be)
        if prev is None or prev[0] is not ranges:
            return None
        changed = (bs != prev[1]) | (be != prev[2])
        out: np.ndarray = np.add.reduceat(changed, np.cumsum([0] + [hi - lo for lo, hi in ranges[:-1]])) > 0
        return out

    def index(self, side: str, ranges: list[tuple[int, int]]) -> np.ndarray:
        """The items of ``ranges``, in order (kept while a window is passed over)."""
        hit = self.idx.get(side)
        if hit is not None and hit[0] is ranges:
            return hit[1]
        idx = np.concatenate([np.arange(lo, hi) for lo, hi in ranges]) if ranges else np.zeros(0, np.int64)
        self.idx[side] = (ranges, idx)
        return idx

    def host(self, ranges: list[tuple[int, int]]) -> bool:
        g = self.g
        idx = self.index("h", ranges)
        if not len(idx):
            return False
        bs = np.where(g.h_first[idx], g.h_ts[idx], -np.inf)
        bp = g.h_bp[idx]
        m = bp >= 0
        bs[m] = np.maximum(bs[m], self.ae[bp[m]] + g.h_bpw[idx[m]])
        be = np.full(len(idx), -np.inf)
        w = g.h_wait[idx]
        m = w >= 0
        be[m] = self.ae[w[m]] + g.h_tail[idx[m]]
        return _solve_chains(ranges, g.h_gap, g.h_dur, g.h_first, bs, be, self.hs, self.he,
                             self.todo("h", ranges, bs, be))

    def gpu(self, ranges: list[tuple[int, int]]) -> bool:
        g = self.g
        idx = self.index("a", ranges)
        if not len(idx):
            return False
        bs = np.full(len(idx), -np.inf)
        ln = g.a_launch[idx]
        m = ln >= 0
        bs[m] = self.hs[ln[m]] + g.a_lat[idx[m]]
        dp = g.a_dep[idx]
        m = dp >= 0
        bs[m] = np.maximum(bs[m], self.ae[dp[m]] + g.a_depw[idx[m]])
        bs = np.where(self.a_root[idx], g.a_ts[idx], bs)
        be = np.full(len(idx), -np.inf)
        if self.n_coll:
            last = np.full(self.n_coll, -np.inf)
            last[self.coll_ids] = np.maximum.reduceat(self.as_[self.coll_members], self.coll_bounds)
            c = g.a_coll[idx]
            m = c >= 0
            be[m] = last[c[m]] + g.a_dur[idx[m]]
        return _solve_chains(ranges, g.a_sgap, g.a_dur, g.a_first, bs, be, self.as_, self.ae,
                             self.todo("a", ranges, bs, be))


def _solve_chains(ranges: list[tuple[int, int]], gap: np.ndarray, dur: np.ndarray, first: np.ndarray,
                  bs: np.ndarray, be: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                  todo: np.ndarray | None = None) -> bool:
    """Solve each chain ``[lo, hi)`` (a host thread's calls or a stream's activities) in one scan:
    every item starts after its predecessor's end plus ``gap`` and after its own bound ``bs``, and
    ends after ``dur`` and after ``be``; ``bs``/``be`` hold the ranges' items in order. A chain
    that continues an earlier one (``first`` false) starts after that item. ``starts``/``ends``
    are updated in place; returns whether any time moved. ``todo``: per range, whether to scan
    it (None: all)."""
    moved = False
    off = 0
    for j, (lo, hi) in enumerate(ranges):
        n = hi - lo
        if not n:
            continue
        if todo is not None and not todo[j]:
            off += n
            continue
        a = _interleave(gap[lo:hi], dur[lo:hi])
        b = _interleave(bs[off:off + n], be[off:off + n])
        if not first[lo]:
            b[0] = max(b[0], ends[lo - 1] + gap[lo])
        v = _scan(a, b)
        moved = moved or _moved(v[0::2], starts[lo:hi]) or _moved(v[1::2], ends[lo:hi])
        starts[lo:hi], ends[lo:hi] = v[0::2], v[1::2]
        off += n
    return moved


def _window_keys(g: Graph, h_bounds: np.ndarray, a_bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A time for each item such that (nearly) every edge runs from an earlier or equal key to a
    later one, non-decreasing along each chain: a call's start, or the start of the activity it
    waits for if later (a sync returns after its target ran); an activity's start, or a
    collective's last arrival."""
    hk = g.h_ts.copy()
    w = g.h_wait >= 0
    hk[w] = np.maximum(hk[w], g.a_ts[g.h_wait[w]])
    ak = g.a_ts.copy()
    if (g.a_coll >= 0).any():
        cm = np.flatnonzero(g.a_coll >= 0)
        last = np.full(int(g.a_coll.max()) + 1, -np.inf)
        np.maximum.at(last, g.a_coll[cm], g.a_ts[cm])
        ak[cm] = np.maximum(ak[cm], last[g.a_coll[cm]])
    return _seg_cummax(hk, h_bounds), _seg_cummax(ak, a_bounds)


def _ranges(keys: np.ndarray, bounds: np.ndarray, t0: float, t1: float) -> list[tuple[int, int]]:
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):  # chains are few
        a = lo + int(np.searchsorted(keys[lo:hi], t0, side="left"))
        b = lo + int(np.searchsorted(keys[lo:hi], t1, side="left"))
        if b > a:
            out.append((a, b))
    return out


def simulate(g: Graph, window: int = WINDOW) -> Times:
    """Longest-path times of every node of ``g`` (see the module docstring): in dependency order
    (:func:`_in_order`) where no collective couples the ranks, else by windowed passes
    (:func:`_by_passes`)."""
    if not (g.a_coll >= 0).any():
        t = _as_traced(g)
        if t is not None:
            return t
        t = _in_order(g)
        if t is not None:
            return t
    return _by_passes(g, window)


def _native_passes(st: _State, mode: int, h_ranges: list[tuple[int, int]], a_ranges: list[tuple[int, int]],
                   max_passes: int) -> int:
    """Passes over the stretches ``h_ranges``/``a_ranges`` in C (``native/_solve.c``), ``st``'s
    times written in place: the same scans in the same order as :meth:`_State.host` and
    :meth:`_State.gpu`, the same floats, without a dozen numpy calls per stretch and pass. ``mode``
    0 (:func:`_as_traced`): given up at the first time that moves (0; ``st``'s times are then left
    half written, to be discarded), else ended at the first pass that changes not a bit (the passes
    made); 1 (:func:`_by_passes`): until a pass moves nothing (the passes made; negated where none
    did within ``max_passes``)."""
    g = st.g
    f64, i64 = np.float64, np.int64

    def c(x: np.ndarray, dtype: Any) -> np.ndarray:
        return np.ascontiguousarray(x, dtype=dtype)

    def pairs(r: list[tuple[int, int]]) -> np.ndarray:
        return np.array(r, dtype=i64).reshape(-1, 2)

    st.hs, st.he, st.as_, st.ae = (c(x, f64) for x in (st.hs, st.he, st.as_, st.ae))  # written in place
    if st.n_coll:
        members, bounds, ids = c(st.coll_members, i64), c(st.coll_bounds, i64), c(st.coll_ids, i64)
    else:
        members = bounds = ids = np.zeros(0, dtype=i64)
    return int(_native_passes_c(
        mode, st.hs, st.he, st.as_, st.ae, pairs(h_ranges), pairs(a_ranges), c(g.h_gap, f64), c(g.h_dur, f64),
        c(g.h_ts, f64), c(g.h_first, np.bool_).view(np.uint8), c(g.h_bp, i64), c(g.h_bpw, f64), c(g.h_wait, i64),
        c(g.h_tail, f64), c(g.a_sgap, f64), c(g.a_dur, f64), c(g.a_ts, f64), c(g.a_first, np.bool_).view(np.uint8),
        c(g.a_launch, i64), c(g.a_lat, f64), c(g.a_dep, i64), c(g.a_depw, f64), c(g.a_coll, i64), members, bounds,
        ids, st.n_coll, SETTLED_US, max_passes))


def _as_traced(g: Graph, max_passes: int = 4, native: bool = NATIVE) -> Times | None:
    """The times when whole-graph passes from the traced times move nothing by more than
    ``SETTLED_US`` (the unchanged graph, or a change that moves nothing), else ``None``: a pass is
    a few scans, far cheaper than solving the graph in order (a round per sync). Passed over until
    not a bit changes (at most ``max_passes``), the floats are those :func:`_in_order` computes
    (the one fixed point of the whole-chain scans); after that, rounding still moving along the
    chains is left where it settled, as the windowed passes do. ``native``: the passes in C
    (:func:`_native_passes`), the same floats."""
    st = _State(g)
    hb, ab = _segments(g.h_first), _segments(g.a_first)
    full_h = [(int(lo), int(hi)) for lo, hi in zip(hb[:-1], hb[1:])]
    full_a = [(int(lo), int(hi)) for lo, hi in zip(ab[:-1], ab[1:])]
    if native and _native_passes_c is not None and max_passes >= 1:
        made = _native_passes(st, 0, full_h, full_a, max_passes)
        return Times(st.hs, st.he, st.as_, st.ae, made) if made else None
    for passes in range(1, max_passes + 1):
        before = (st.hs.copy(), st.he.copy(), st.as_.copy(), st.ae.copy())
        if st.host(full_h) or st.gpu(full_a):  # a host that moved needs no GPU pass to say so
            return None
        if all(np.array_equal(x, y) for x, y in zip(before, (st.hs, st.he, st.as_, st.ae))):
            break
    return Times(st.hs, st.he, st.as_, st.ae, passes)


def _by_passes(g: Graph, window: int = WINDOW, native: bool = NATIVE) -> Times:
    """Longest-path times of every node of ``g``, by passes until nothing moves.

    Swept in windows of about ``window`` items in time order: each window is passed over until
    it settles, with the earlier windows final, so a GPU→host crossing costs a pass over one
    window, not over the whole trace. A last loop of whole-graph passes confirms the fixed point
    (edges that run backwards in the window order, e.g. between overlapping host threads).
    ``native``: each window's passes in C (:func:`_native_passes`), the same floats."""
    st = _State(g)
    hb, ab = _segments(g.h_first), _segments(g.a_first)
    hk, ak = _window_keys(g, hb, ab)
    keys = np.sort(np.r_[hk, ak])
    edges = np.r_[keys[::max(window, 1)], np.inf] if len(keys) else np.array([np.inf])
    passes = 0
    native = native and _native_passes_c is not None
    for t0, t1 in zip(edges[:-1], edges[1:]):
        hr, ar = _ranges(hk, hb, float(t0), float(t1)), _ranges(ak, ab, float(t0), float(t1))
        if native:
            passes += abs(_native_passes(st, 1, hr, ar, MAX_PASSES))
            continue
        for _ in range(MAX_PASSES):
            passes += 1
            moved = st.host(hr)
            moved = st.gpu(ar) or moved
            if not moved:
                break
    full_h = [(int(lo), int(hi)) for lo, hi in zip(hb[:-1], hb[1:])]
    full_a = [(int(lo), int(hi)) for lo, hi in zip(ab[:-1], ab[1:])]
    if native:
        made = _native_passes(st, 1, full_h, full_a, MAX_PASSES)
        if made > 0:
            return Times(st.hs, st.he, st.as_, st.ae, passes + made)
        raise GpuprofError(f"replay did not settle after {MAX_PASSES} passes (a cycle in the dependency graph?)")
    for _ in range(MAX_PASSES):
        passes += 1
        moved = st.host(full_h)
        moved = st.gpu(full_a) or moved
        if not moved:
            return Times(st.hs, st.he, st.as_, st.ae, passes)
    raise GpuprofError(f"replay did not settle after {MAX_PASSES} passes (a cycle in the dependency graph?)")


class _Chain:
    """One chain (a rank's host calls or a stream's activities) as half-items: ``2k`` is item
    ``k``'s start, ``2k + 1`` its end, each ``v[h] = max(v[h-1] + w[h], b[h])``; its place in the
    global half arrays starts at ``base``. ``needs``: per other chain, the cumulative max over this
    chain's half-items of how far that chain must be solved (in half-items) before each can be;
    ``inputs``: per kind of outside edge (at most one of a kind enters a half-item), for each
    half-item whether it comes from the host side, the global half it comes from (the values'
    last slot, always -inf, where none does) and its weight."""

    def __init__(self, base: int, w: np.ndarray, const: np.ndarray) -> None:
        self.base = base
        self.n = len(w)
        acc = np.cumsum(w)
        acc -= w[0]  # the first item takes no edge from before its chain
        self.acc = acc
        self.const = const
        self.needs: list[tuple[int, np.ndarray]] = []
        self.inputs: list[tuple[bool, np.ndarray, np.ndarray]] = []
        self.done = 0
        #: the running max of ``b - acc`` over the half-items solved so far: with it, a stretch
        #: solved alone gives the same floats as the whole chain scanned at once
        self.top = -np.inf


def _chains(g: Graph) -> list[_Chain]:
    """The host and stream chains of ``g`` with their outside edges (host chains first)."""
    hb, ab = _segments(g.h_first), _segments(g.a_first)
    h_chain = np.repeat(np.arange(len(hb) - 1), np.diff(hb))
    a_chain = np.repeat(np.arange(len(ab) - 1), np.diff(ab)) + len(hb) - 1
    chains: list[_Chain] = []
    for lo, hi in zip(hb[:-1], hb[1:]):
        const = np.full(2 * (hi - lo), -np.inf)
        const[0] = g.h_ts[lo]  # the first call of a rank starts as traced
        chains.append(_Chain(2 * int(lo), _interleave(g.h_gap[lo:hi], g.h_dur[lo:hi]), const))
    root = g.a_first & (g.a_launch < 0) & (g.a_dep < 0)
    for lo, hi in zip(ab[:-1], ab[1:]):
        const = np.full(2 * (hi - lo), -np.inf)
        const[0::2] = np.where(root[lo:hi], g.a_ts[lo:hi], -np.inf)
        chains.append(_Chain(2 * int(lo), _interleave(g.a_sgap[lo:hi], g.a_dur[lo:hi]), const))
    # (target chain, target half (global), from the host side?, source chain, source half (global), weight)
    edges: list[tuple[np.ndarray, np.ndarray, bool, np.ndarray, np.ndarray, np.ndarray]] = []
    i = np.flatnonzero(g.h_bp >= 0)
    edges.append((h_chain[i], 2 * i, False, a_chain[g.h_bp[i]], 2 * g.h_bp[i] + 1, g.h_bpw[i]))
    i = np.flatnonzero(g.h_wait >= 0)
    edges.append((h_chain[i], 2 * i + 1, False, a_chain[g.h_wait[i]], 2 * g.h_wait[i] + 1, g.h_tail[i]))
    j = np.flatnonzero(g.a_launch >= 0)
    edges.append((a_chain[j], 2 * j, True, h_chain[g.a_launch[j]], 2 * g.a_launch[j], g.a_lat[j]))
    j = np.flatnonzero(g.a_dep >= 0)
    edges.append((a_chain[j], 2 * j, False, a_chain[g.a_dep[j]], 2 * g.a_dep[j] + 1, g.a_depw[j]))
    for tc, th, from_host, sc, sh, w in edges:
        if not len(tc):
            continue
        for c in np.unique(tc):  # chains are few
            m = tc == c
            ch = chains[int(c)]
            pos = th[m] - ch.base
            src = np.full(ch.n, 2 * (g.n_host if from_host else g.n_acts), dtype=np.int64)
            src[pos] = sh[m]
            weight = np.zeros(ch.n)
            weight[pos] = w[m]
            ch.inputs.append((from_host, src, weight))
            for d in np.unique(sc[m]):
                md = sc[m] == d
                need = np.zeros(ch.n, dtype=np.int64)
                np.maximum.at(need, pos[md], sh[m][md] - chains[int(d)].base + 1)
                ch.needs.append((int(d), np.maximum.accumulate(need)))
    for ch in chains:  # one need array per source chain
        merged: dict[int, np.ndarray] = {}
        for d, need in ch.needs:
            merged[d] = np.maximum(merged[d], need) if d in merged else need
        ch.needs = list(merged.items())
    return chains


def _native_rounds(g: Graph, hv: np.ndarray, av: np.ndarray) -> int | None:
    """:func:`_in_order`'s rounds in C (``native/_solve.c``), ``hv``/``av`` solved in place from the
    graph's own arrays (the chains :func:`_chains` builds, built there). The number of rounds, or
    None (no chain could go on: a cycle)."""
    f64, i64 = np.float64, np.int64

    def c(x: np.ndarray, dtype: Any) -> np.ndarray:
        return np.ascontiguousarray(x, dtype=dtype)

    rounds = int(_native_in_order(
        hv, av, _segments(g.h_first).astype(i64), _segments(g.a_first).astype(i64),
        c(g.h_gap, f64), c(g.h_dur, f64), c(g.h_ts, f64), c(g.h_bp, i64), c(g.h_bpw, f64), c(g.h_wait, i64),
        c(g.h_tail, f64), c(g.a_sgap, f64), c(g.a_dur, f64), c(g.a_ts, f64), c(g.a_launch, i64), c(g.a_lat, f64),
        c(g.a_dep, i64), c(g.a_depw, f64), c(g.a_first, np.bool_).view(np.uint8)))
    return rounds if rounds >= 0 else None


def _in_order(g: Graph, native: bool = NATIVE) -> Times | None:
    """Longest-path times of ``g`` solved in dependency order: each chain is solved as far as its
    outside inputs are final (one scan of that stretch), round after round, so every half-item
    is computed once, from final inputs. A sync costs one round (the host up to the call, the
    GPU up to the work it waits for), a few scans of the stretch between syncs, not a pass over
    a window. ``None`` when no chain can go on before all are solved (a cycle: the windowed
    passes say so). ``native``: the rounds in C (:data:`NATIVE`), the same floats as the numpy
    loop below (one max, subtraction and addition per value, in the same order)."""
    hv = np.r_[_interleave(g.h_ts, g.h_end), -np.inf]  # the last slot: "no edge"
    av = np.r_[_interleave(g.a_ts, g.a_end), -np.inf]
    if native and _native_in_order is not None and (g.n_host or g.n_acts):
        got = _native_rounds(g, hv, av)
        if got is None:
            return None
        return Times(hv[0:-1:2].copy(), hv[1:-1:2].copy(), av[0:-1:2].copy(), av[1:-1:2].copy(), got)
    chains = _chains(g)
    n_host_chains = int(g.h_first.sum())
    rounds = 0
    left = sum(ch.n for ch in chains)
    while left:
        rounds += 1
        moved = False
        for c, ch in enumerate(chains):
            p = ch.done
            if p == ch.n:
                continue
            q = ch.n
            for d, need in ch.needs:
                q = min(q, int(need.searchsorted(chains[d].done, side="right")))
            if q <= p:
                continue
            b = ch.const[p:q]
            for from_host, src, w in ch.inputs:
                b = np.maximum(b, (hv if from_host else av)[src[p:q]] + w[p:q])
            acc = ch.acc[p:q]
            b = b - acc
            b[0] = max(b[0], ch.top)
            top = np.maximum.accumulate(b)
            ch.top = top[-1]
            (hv if c < n_host_chains else av)[ch.base + p:ch.base + q] = acc + top
            ch.done = q
            left -= q - p
            moved = True
        if not moved:
            return None
    return Times(hv[0:-1:2].copy(), hv[1:-1:2].copy(), av[0:-1:2].copy(), av[1:-1:2].copy(), rounds)


def step_windows(g: Graph, t: Times) -> tuple[np.ndarray, np.ndarray]:
    """Replayed (start, end) of each step (``g.s_*`` order), by the trace model's rule: a step
    starts on the GPU once its CPU span has begun and earlier GPU work is done (never after its
    own first activity) and ends when its last activity ends."""
    ns = len(g.s_rank)
    start, end = np.full(ns, np.nan), np.full(ns, np.nan)
    shift = np.where(g.s_anchor >= 0, t.h_start[np.maximum(g.s_anchor, 0)] - g.h_ts[np.maximum(g.s_anchor, 0)]
                     if g.n_host else 0.0, 0.0)
    cpu = g.s_cpu_start + shift
    for r in np.unique(g.s_rank):  # ranks are few
        rows = np.flatnonzero(g.s_rank == r)
        on = g.a_rank == r
        step = g.a_step[on]
        ts, en, first_ts = t.a_start[on], t.a_end[on], g.a_ts[on]
        k = len(rows)
        inside = step >= 0
        lo = np.full(k, np.inf)
        hi = np.full(k, -np.inf)
        np.minimum.at(lo, step[inside], ts[inside])
        np.maximum.at(hi, step[inside], en[inside])
        first_traced = np.full(k, np.inf)
        np.minimum.at(first_traced, step[inside], first_ts[inside])
        before = ~inside & (first_ts < first_traced[0]) if k else inside
        prev = np.r_[en[before].max() if before.any() else -np.inf, hi[:-1]]
        s = np.fmin(np.maximum(cpu[rows], prev), lo)
        has = np.isfinite(lo)
        start[rows] = np.where(has, s, np.nan)
        end[rows] = np.where(has, hi, np.nan)
    return start, end
