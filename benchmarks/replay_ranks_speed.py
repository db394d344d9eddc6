"""Speed of the cross-rank replay: 8 ranks of ~100k kernels each (docs/replay.md).

The real 2-rank ``ddp_good`` trace's one-rank graphs are tiled in time (each copy after the last,
node indices shifted, every stream kept one chain) to ~100k kernels a rank and copied to 8 ranks,
each copy keeping its collectives so they match across all 8; the joined graph is replayed.

    python -m benchmarks.replay_ranks_speed
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from gpuprof.ranks import load_trace_cached
from gpuprof.replay import Graph, run
from gpuprof.replay.ranks import RankGraph, join, rank_graph
from tests.conftest import SAMPLES


def span_of(g: Graph) -> float:
    return float(max(g.h_end.max(), g.a_end.max()) - min(g.h_ts.min(), g.a_ts.min())) + 100.0


def tile(p: RankGraph, copies: int, rank: int, span: float) -> RankGraph:
    """``copies`` of one rank's graph, ``span`` µs apart in time, as rank ``rank``."""
    g = p.graph
    nh, na, ns = g.n_host, g.n_acts, len(g.s_rank)
    c_h, c_a, c_s = (np.repeat(np.arange(copies), n) for n in (nh, na, ns))

    def rep(x: np.ndarray) -> np.ndarray:
        return np.tile(x, copies)

    def idx(x: np.ndarray, n: int, c: np.ndarray) -> np.ndarray:
        t = rep(x)
        return np.where(t >= 0, t + c * n, t)

    a_ts, a_stream = rep(g.a_ts) + c_a * span, rep(g.a_stream)
    order = np.lexsort((a_ts, a_stream))  # each stream one chain again
    inv = np.empty(na * copies, dtype=np.int64)
    inv[order] = np.arange(na * copies)

    def acts(x: np.ndarray) -> np.ndarray:
        return np.where(x >= 0, inv[np.maximum(x, 0)], x)

    h_first = rep(g.h_first) & (c_h == 0)
    h_gap = np.where(rep(g.h_first) & (c_h > 0), 100.0, rep(g.h_gap))
    a_first_old = rep(g.a_first)[order]
    st = a_stream[order]
    a_first = np.r_[True, st[1:] != st[:-1]]
    t = Graph(
        ranks=(rank,), rank_offset_us=np.zeros(1), h_rank=rep(g.h_rank), h_row=rep(g.h_row), h_name=rep(g.h_name),
        h_ts=rep(g.h_ts) + c_h * span, h_end=rep(g.h_end) + c_h * span, h_first=h_first, h_gap=h_gap,
        h_dur=rep(g.h_dur), h_wait=acts(idx(g.h_wait, na, c_h)), h_tail=rep(g.h_tail), h_events=rep(g.h_events),
        h_step=np.where(rep(g.h_step) >= 0, rep(g.h_step) + c_h * ns, -1), h_bp=acts(idx(g.h_bp, na, c_h)),
        h_bpw=rep(g.h_bpw), a_rank=rep(g.a_rank)[order], a_kind=rep(g.a_kind)[order], a_row=rep(g.a_row)[order],
        a_stream=st, a_ts=a_ts[order], a_end=(rep(g.a_end) + c_a * span)[order], a_first=a_first,
        a_launch=idx(g.a_launch, nh, c_a)[order], a_lat=rep(g.a_lat)[order],
        a_sgap=np.where(a_first_old & ~a_first, 0.0, rep(g.a_sgap)[order]), a_dep=acts(idx(g.a_dep, na, c_a)[order]),
        a_depw=rep(g.a_depw)[order], a_dur=rep(g.a_dur)[order], a_coll=np.full(na * copies, -1, dtype=np.int64),
        a_step=np.where(rep(g.a_step) >= 0, rep(g.a_step) + c_a * ns, -1)[order],
        s_rank=rep(g.s_rank), s_cpu_start=rep(g.s_cpu_start) + c_s * span, s_anchor=idx(g.s_anchor, nh, c_s))
    cm = p.comm
    k = len(cm)
    comm = cm.iloc[np.tile(np.arange(k), copies)].reset_index(drop=True)
    cc = np.repeat(np.arange(copies), k)
    comm = comm.assign(a=inv[comm["a"].to_numpy() + cc * na], ts=comm["ts"].to_numpy() + cc * span,
                       end=comm["end"].to_numpy() + cc * span)
    return RankGraph(t, p.t0_epoch_ns, comm)


def eight_ranks(kernels: int = 100_000, ranks: int = 8) -> Graph:
    """The joined graph of ``ranks`` tiled copies of ddp_good's two ranks, ≥ ``kernels`` each."""
    files = sorted((SAMPLES / "ddp_good").glob("*.json.gz"))
    base = [rank_graph(load_trace_cached(f, i, True)) for i, f in enumerate(files)]
    copies = -(-kernels // min(int((b.graph.a_kind == 0).sum()) for b in base))
    span = max(span_of(b.graph) for b in base)  # one period for all: copies of a step stay together
    tiled = [tile(b, copies, 0, span) for b in base]
    parts = [replace(tiled[r % len(tiled)], graph=replace(tiled[r % len(tiled)].graph, ranks=(r,)))
             for r in range(ranks)]
    return join(parts)


if __name__ == "__main__":
    t0 = time.perf_counter()
    g = eight_ranks()
    t1 = time.perf_counter()
    r = run(g)
    t2 = time.perf_counter()
    print(f"{len(g.ranks)} ranks, {g.n_acts:,} GPU activities ({int((g.a_kind == 0).sum()):,} kernels), "
          f"{g.n_host:,} host calls, {int((g.a_coll >= 0).sum()):,} coupled collective kernels: "
          f"tile+join {t1 - t0:.2f} s, replay {t2 - t1:.2f} s ({r.times.passes} passes)")
