"""Replaying a :class:`~gpuprof.replay.graph.Graph`: every node's time, and the step times.

Each chain (a rank's host calls, a stream's activities) is a max-plus recurrence
``v[j] = max(v[j-1] + a[j], b[j])``, where ``a`` is the edge from the chain predecessor and ``b``
gathers the edges from other chains (launches, waits, other streams, other ranks). Given ``b``, a
whole chain is one vectorised scan: ``v[j] = A[j] + max_{m<=j} (b[m] - A[m])`` with ``A`` the
cumulative sum of ``a`` (``np.maximum.accumulate``). The
simulator alternates host scans and GPU scans, gathering ``b`` from the other side's latest
times, until nothing moves: the graph is acyclic, so this reaches its one fixed point, the
longest-path times. Each pass costs O(n); the number of passes is the number of times the
critical path crosses from the GPU back to the host or between streams or ranks *in an order the
pass does not already follow* (a sync that held the host up, a wait on another stream), a few
per step in training loops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuprof.errors import GpuprofError
from gpuprof.replay.graph import Graph

MAX_PASSES = 5_000


@dataclass(frozen=True)
class Times:
    """Replayed start and end of every node (µs, shared clock) and how many passes it took."""

    h_start: np.ndarray
    h_end: np.ndarray
    a_start: np.ndarray
    a_end: np.ndarray
    passes: int


def chain_scan(a: np.ndarray, b: np.ndarray, start: np.ndarray) -> np.ndarray:
    """``v[j] = max(v[j-1] + a[j], b[j])`` along each segment (``start`` marks its first node,
    where ``v = b``, which must be finite). Segments (one per rank or stream) are few, so they
    are scanned one at a time: exact, where one scan with offsets between segments would round."""
    out = np.empty(len(a))
    bounds = np.r_[np.flatnonzero(start), len(a)]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        acc = np.cumsum(np.r_[0.0, a[lo + 1:hi]])
        out[lo:hi] = acc + np.maximum.accumulate(b[lo:hi] - acc)
    return out


def _interleave(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = np.empty(2 * len(x))
    out[0::2], out[1::2] = x, y
    return out


def simulate(g: Graph) -> Times:
    """Longest-path times of every node of ``g`` (see the module docstring)."""
    nh, na = g.n_host, g.n_acts
    h_start_flags = _interleave(g.h_first, np.zeros(nh, dtype=bool)).astype(bool)
    a_start_flags = _interleave(g.a_first, np.zeros(na, dtype=bool)).astype(bool)
    h_a = _interleave(g.h_gap, g.h_dur)
    a_a = _interleave(g.a_sgap, g.a_dur)
    has_launch = g.a_launch >= 0
    has_dep = g.a_dep >= 0
    has_wait = g.h_wait >= 0
    has_bp = g.h_bp >= 0
    coll = g.a_coll
    in_coll = coll >= 0
    n_coll = int(coll.max()) + 1 if in_coll.any() else 0
    # First activity of a stream without a launch or dependency edge: fixed at its traced start.
    root = g.a_first & ~has_launch & ~has_dep
    h_start, h_end = g.h_ts.copy(), g.h_end.copy()
    a_start, a_end = g.a_ts.copy(), g.a_end.copy()
    for passes in range(1, MAX_PASSES + 1):
        hb_s = np.where(g.h_first, g.h_ts, -np.inf)
        hb_s[has_bp] = np.maximum(hb_s[has_bp], a_end[g.h_bp[has_bp]] + g.h_bpw[has_bp])
        hb_e = np.full(nh, -np.inf)
        hb_e[has_wait] = a_end[g.h_wait[has_wait]] + g.h_tail[has_wait]
        hv = chain_scan(h_a, _interleave(hb_s, hb_e), h_start_flags)
        new_hs, new_he = hv[0::2], hv[1::2]
        ab_s = np.full(na, -np.inf)
        ab_s[has_launch] = new_hs[g.a_launch[has_launch]] + g.a_lat[has_launch]
        ab_s[has_dep] = np.maximum(ab_s[has_dep], a_end[g.a_dep[has_dep]] + g.a_depw[has_dep])
        ab_s = np.where(root, g.a_ts, ab_s)
        ab_e = np.full(na, -np.inf)
        if n_coll:
            last = np.full(n_coll, -np.inf)
            np.maximum.at(last, coll[in_coll], a_start[in_coll])
            ab_e[in_coll] = last[coll[in_coll]] + g.a_dur[in_coll]
        av = chain_scan(a_a, _interleave(ab_s, ab_e), a_start_flags)
        new_as, new_ae = av[0::2], av[1::2]
        moved = not (np.array_equal(new_hs, h_start) and np.array_equal(new_he, h_end)
                     and np.array_equal(new_as, a_start) and np.array_equal(new_ae, a_end))
        h_start, h_end, a_start, a_end = new_hs, new_he, new_as, new_ae
        if not moved:
            return Times(h_start, h_end, a_start, a_end, passes)
    raise GpuprofError(f"replay did not settle after {MAX_PASSES} passes (a cycle in the dependency graph?)")


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
