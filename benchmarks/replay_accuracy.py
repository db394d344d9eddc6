"""The what-if replay against real before/after pairs (docs/replay.md).

For each pair: build the bad trace's graph, take out the profiler's host cost (so the unchanged
replay takes the bad program's unprofiled step time: one rank the way the analysis does it,
``host_bounds``; a job by one cost per event, as the cross-rank replay does), apply the fix as a
transformation, and compare the replayed saving with the realised one (bad − good unprofiled
step times, sample_traces/h200/timings/). The fixes are described from the bad trace alone
(which ops, which copies, which rank); nothing is read from the good twin.

    python -m benchmarks.replay_accuracy
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.pairs import step_ms, trace_path
from gpuprof.jobs import load_trace_cached
from gpuprof.hostcost import bracket_cost_us
from gpuprof.replay import Graph, build, calibrate, deflate, host_bounds, run, what_if
from gpuprof.replay import transforms as tf
from gpuprof.specs import resolve
from gpuprof.trace.model import RankTrace


def _op_spans(t: RankTrace, names: tuple[str, ...]) -> list[tuple[float, float, int]]:
    o = t.ops[t.ops["name"].astype(str).isin(names)]
    return list(zip(o["ts"].astype(float), o["end"].astype(float), o["tid"].astype(int)))


def host_sync_drop(ts: list[RankTrace], g: Graph) -> Graph:
    """Keep the values on the GPU: the ``.item()`` calls no longer wait (nor copy to the host)."""
    t = ts[0]
    calls = tf.calls_within(g, t.meta.rank, t.runtime["tid"].to_numpy(), _op_spans(t, ("aten::item",)))
    g = tf.drop_waits(g, calls)
    return tf.remove_activities(g, tf.activities_launched_by(g, calls), with_launch=True)


def host_sync_remove(ts: list[RankTrace], g: Graph) -> Graph:
    """What the twin did: the per-parameter ``grad.norm().item()`` line is gone, norms included."""
    t = ts[0]
    calls = tf.calls_within(g, t.meta.rank, t.runtime["tid"].to_numpy(),
                            _op_spans(t, ("aten::item", "aten::norm", "aten::linalg_vector_norm")))
    g = tf.drop_waits(g, calls)
    return tf.remove_activities(g, tf.activities_launched_by(g, calls), with_launch=True) if calls.any() else g


def cuda_graph(ts: list[RankTrace], g: Graph) -> Graph:
    """Capture the step in one CUDA graph: no host cost per launch, no Python between launches.
    Copies and synchronising calls stay outside the graph, as a captured step needs."""
    in_step = np.zeros(g.n_host, dtype=bool)
    for i, t in enumerate(ts):
        on = np.flatnonzero(g.h_rank == i)
        in_step[on] = t.runtime["step"].to_numpy()[g.h_row[on]] >= 0
    keep = np.isin(g.h_name, list(tf_copy_or_sync()))
    return tf.set_host_cost(g, in_step & ~keep, 0.0)


def tf_copy_or_sync() -> set[str]:
    from gpuprof.trace.names import REPLAY_COPY_CALLS, REPLAY_SYNC_CALLS

    return set(REPLAY_COPY_CALLS) | set(REPLAY_SYNC_CALLS)


def pinned_copies(ts: list[RankTrace], g: Graph) -> Graph:
    """Pinned memory and ``non_blocking=True``: each pageable host copy at the pinned rate (copies
    of ≥ 1 MB from pinned memory in this trace, else the GPU's PCIe datasheet rate), and its
    launch call no longer waits for it."""
    t = ts[0]
    m = t.memcpys
    pageable = ((m["src"] == "Pageable") | (m["dst"] == "Pageable")).to_numpy()
    pinned = ((m["src"] == "Pinned") | (m["dst"] == "Pinned")).to_numpy() & (m["bytes"].to_numpy() >= 1e6)
    if pinned.any():
        rate = float(m["bytes"].to_numpy()[pinned].sum() / (m["dur"].to_numpy()[pinned].sum() * 1e-6))
    else:
        spec = resolve(t.meta.device_properties)
        rate = (spec.pcie_gbps if spec else 0.0) * 1e9
    sel = tf.activities_of(g, t.meta.rank, "memcpy", np.flatnonzero(pageable))
    rows = g.a_row[sel]
    g = tf.set_durations(g, sel, m["bytes"].to_numpy()[rows] / rate * 1e6 if rate > 0 else g.a_dur[sel])
    return tf.drop_waits(g, tf.launches_of(g, sel))


def rebalance(ts: list[RankTrace], g: Graph) -> Graph:
    """Cut the slow rank's extra host time to the median rank's (gpuprof.replay.job.rebalance:
    its gaps longer than any of the median rank's become that rank's typical gap, then any excess
    of its host time per step goes)."""
    from gpuprof.replay.job import rebalance as cut

    return cut(g)


def overlap(ts: list[RankTrace], g: Graph) -> Graph:
    """DDP's bucketed all-reduce: the collectives run behind compute, the largest of each step kept,
    and the ops that issued them from Python cost nothing (gpuprof.replay.job.cross_fix)."""
    from gpuprof.replay.job import cross_fix, rank_graph

    return cross_fix("exposed_communication", g, [rank_graph(t) for t in ts])


CASES: list[tuple[str, str, str, str, Callable[[list[RankTrace], Graph], Graph]]] = [
    ("host_sync", "drop the .item() waits", "gpt_host_sync", "gpt_bf16", host_sync_drop),
    ("host_sync", "remove the norm().item() line", "gpt_host_sync", "gpt_bf16", host_sync_remove),
    ("launch_overhead", "one CUDA graph per step", "tiny_eager", "tiny_graph", cuda_graph),
    ("pageable_memcpy", "pinned, non_blocking copies", "vision_pageable", "vision_pinned", pinned_copies),
    ("rank_imbalance", "slow rank's extra host time cut to the median rank's", "ddp_slow_rank", "ddp_good", rebalance),
    ("exposed_communication", "collectives behind compute, issued from C++", "ddp_manual_allreduce", "ddp_good",
     overlap),
]


def _traces(name: str) -> list[RankTrace]:
    p = trace_path(name)
    files = sorted(p.glob("*.json.gz")) if p.is_dir() else [p]
    return [load_trace_cached(Path(f), i, True) for i, f in enumerate(files)]


def evaluate() -> list[dict[str, object]]:
    rows = []
    for cat, fix, bad, good, fn in CASES:
        ts = _traces(bad)
        g = build(ts)
        traced = run(g).step_time_ms
        if len(ts) == 1:  # the host the analysis prices one rank's fixes on (fixes.plan: host_bounds)
            hb = host_bounds(g, step_ms(bad), bracket_cost_us(ts[0]))
            c, base = hb.floor_us, hb.apply(g)
        else:  # the cross-rank replay's host (ranks.job): one cost per event for the job
            c = calibrate(g, step_ms(bad))
            base = deflate(g, c)
        w = what_if(base, [lambda x: fn(ts, x)])
        before, after = w.before_ms, w.after_ms
        bare = what_if(g, [lambda x: fn(ts, x)])
        realised = step_ms(bad) - step_ms(good)
        rows.append({"category": cat, "fix": fix, "bad": bad, "good": good, "traced_ms": traced,
                     "event_cost_us": c, "replay_before_ms": before, "replay_after_ms": after,
                     "estimated_ms": before - after, "realised_ms": realised,
                     "error_pct": 100 * (before - after - realised) / realised,
                     "bare_estimated_ms": bare.saving_ms,
                     "bare_estimated_pct": 100 * bare.saving_ms / bare.before_ms,
                     "realised_pct": 100 * realised / step_ms(bad)})
    return rows


def table(rows: list[dict[str, object]]) -> str:
    out = ["| category | fix | bad → good | replayed step before → after (ms) | estimated | realised | error | bare trace: estimated % of step vs realised % |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['category']} | {r['fix']} | {r['bad']} → {r['good']} | {r['replay_before_ms']:.2f} → "
                   f"{r['replay_after_ms']:.2f} | {r['estimated_ms']:.2f} | {r['realised_ms']:.2f} | "
                   f"{r['error_pct']:+.0f}% | {r['bare_estimated_pct']:.0f}% vs {r['realised_pct']:.0f}% |")
    return "\n".join(out)


if __name__ == "__main__":
    print(table(evaluate()))
