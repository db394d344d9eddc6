"""Speed of the cross-rank replay: 8 ranks of ~100k kernels each (docs/replay.md).

The real 2-rank ``ddp_good`` trace is tiled in time (:func:`benchmarks.replay_speed.tile`, both
ranks by one period so each copy's collectives stay together) to ~100k kernels a rank; each
rank's graph is built once and copied to 8 ranks (a copy keeps its collectives, so they match
across all 8), and the joined job graph is replayed. Every event is a real event, moved.

    python -m benchmarks.replay_ranks_speed [--kernels 100000] [--ranks 8]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from benchmarks.replay_speed import tile
from gpuprof.jobs import load_trace_cached
from gpuprof.replay import Graph, run
from gpuprof.replay.job import join, rank_graph
from gpuprof.trace.model import RankTrace
from tests.conftest import SAMPLES


def tiled_job(kernels: int = 100_000) -> list[RankTrace]:
    """ddp_good's ranks, each tiled to at least ``kernels`` kernels, in step."""
    ts = [load_trace_cached(f, i, True) for i, f in enumerate(sorted((SAMPLES / "ddp_good").glob("*.json.gz")))]
    t0 = min(t.meta.t0_epoch_ns for t in ts) / 1000.0
    lo = min(float(t.runtime["ts"].min()) + t.meta.t0_epoch_ns / 1000.0 - t0 for t in ts)
    hi = max(max(float(f["end"].max()) for f in (t.kernels, t.memcpys, t.runtime, t.ops) if len(f))
             + t.meta.t0_epoch_ns / 1000.0 - t0 for t in ts)
    copies = -(-kernels // min(len(t.kernels) for t in ts))
    return [tile(t, copies, hi - lo + 100.0) for t in ts]


def eight_ranks(kernels: int = 100_000, ranks: int = 8) -> tuple[Graph, list[RankTrace]]:
    """The joined job graph of ``ranks`` ranks, copies of ddp_good's two tiled ranks, and those
    two traces (rank ``r`` is a copy of trace ``r % 2``)."""
    ts = tiled_job(kernels)
    base = [rank_graph(t) for t in ts]
    parts = [replace(base[r % len(base)], graph=replace(base[r % len(base)].graph, ranks=(r,))) for r in range(ranks)]
    return join(parts), ts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", type=int, default=100_000)
    p.add_argument("--ranks", type=int, default=8)
    a = p.parse_args()
    t0 = time.perf_counter()
    g, _ = eight_ranks(a.kernels, a.ranks)
    t1 = time.perf_counter()
    c1 = time.process_time()
    r = run(g)
    t2, c2 = time.perf_counter(), time.process_time()
    print(f"{len(g.ranks)} ranks, {g.n_acts:,} GPU activities ({int((g.a_kind == 0).sum()):,} kernels), "
          f"{g.n_host:,} host calls, {int((g.a_coll >= 0).sum()):,} coupled collective kernels: "
          f"tile + build 2 ranks + join {t1 - t0:.2f} s; replay {t2 - t1:.2f} s wall, {c2 - c1:.2f} s CPU "
          f"({r.times.passes} passes); rank step {min(r.rank_step_ms):.3f}-{max(r.rank_step_ms):.3f} ms")


if __name__ == "__main__":
    main()
