"""What-if replay: rebuild a job's dependency graph from its traces and replay it.

:func:`build` makes the graph of a trace, or of several ranks of one job
(:func:`gpuprof.replay.graph.build`, :func:`gpuprof.replay.job.build_job`); :func:`replay`
replays it (:mod:`gpuprof.replay.run`) and returns the step times; ``what_if(graph, transforms)``
replays a graph before and after a list of transformations (:mod:`gpuprof.replay.transforms`),
which is how a fix is priced (:mod:`gpuprof.replay.fixes`, :mod:`gpuprof.pricing`). The
unprofiled host is modelled in :mod:`gpuprof.replay.host`. See docs/replay.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuprof.replay import graph as _graph
from gpuprof.replay.graph import Graph
from gpuprof.replay.host import HOST_SEEN, HostBounds, calibrate, host_bounds, host_speed, largest_speed
from gpuprof.replay.job import build_job
from gpuprof.replay.run import Replayed, Transform, WhatIf, host_only, run, steady_ms, traces_of, what_if
from gpuprof.replay.simulate import Times, simulate
from gpuprof.replay.transforms import deflate
from gpuprof.trace.model import RankTrace


def build(traces: Sequence[RankTrace]) -> Graph:
    """The dependency graph of one job from its ranks' traces: one trace's alone
    (:func:`gpuprof.replay.graph.build`), several ranks' each built alone and joined, collectives
    matched across ranks (:func:`gpuprof.replay.job.build_job`)."""
    return build_job(traces) if len(traces) > 1 else _graph.build(traces)


def replay(x: Any, transforms: Sequence[Transform] = (), event_cost_us: float = 0.0) -> Replayed:
    """Replay a trace (or a job's ranks: a RankResult, an analysis, a sequence of them) as
    recorded, or after ``transforms``. With ``event_cost_us`` the profiler's cost per recorded
    host event is first taken out."""
    g = build(traces_of(x))
    if event_cost_us > 0:
        g = deflate(g, event_cost_us)
    for f in transforms:
        g = f(g)
    return run(g)


__all__ = ["HOST_SEEN", "Graph", "HostBounds", "Replayed", "Times", "Transform", "WhatIf", "build", "calibrate",
           "deflate", "host_bounds", "host_only", "host_speed", "largest_speed", "replay", "run", "simulate",
           "steady_ms", "traces_of", "what_if"]
