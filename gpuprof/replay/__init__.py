"""What-if replay: rebuild a job's dependency graph from its traces and replay it (issue #13).

``replay(x)`` builds the graph of a trace (or a rank result, an Analysis, or several ranks of one
job: :func:`gpuprof.replay.graph.build`), replays it (:func:`gpuprof.replay.simulate.simulate`)
and returns the step times. ``what_if(graph, transforms)`` replays a graph before and after a
list of transformations (:mod:`gpuprof.replay.transforms`), which is how a fix is priced.
Under the profiler the host runs slower than without it; :func:`deflate` removes the profiler's
cost per recorded host event (``gpuprof.ranks.event_cost_us``) before a fix is priced.
See docs/replay.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from gpuprof.replay.graph import Graph, build
from gpuprof.replay.simulate import Times, simulate, step_windows
from gpuprof.replay.transforms import deflate
from gpuprof.trace.model import RankTrace

if TYPE_CHECKING:
    from gpuprof.api import Analysis
    from gpuprof.ranks import RankResult

Transform = Callable[[Graph], Graph]
Source = Union["Analysis", "RankResult", RankTrace, Sequence[Union["RankResult", RankTrace]]]


@dataclass(frozen=True)
class Replayed:
    """A replay's outcome: per-rank mean step time (ms) and each step's time (ms), in
    ``graph.ranks`` order; ``step_time_ms`` is their mean over ranks, as in the summary."""

    graph: Graph
    times: Times
    rank_step_ms: tuple[float, ...]
    steps_ms: tuple[tuple[float, ...], ...]

    @property
    def step_time_ms(self) -> float:
        ok = [x for x in self.rank_step_ms if np.isfinite(x)]
        return float(np.mean(ok)) if ok else float("nan")


def traces_of(x: Any) -> list[RankTrace]:
    """The rank traces of an Analysis, a RankResult, a RankTrace or a sequence of them."""
    if isinstance(x, RankTrace):
        return [x]
    if hasattr(x, "ranks") and hasattr(x, "parts"):  # an Analysis
        return [r.trace for r in x.ranks]
    if hasattr(x, "trace") and isinstance(x.trace, RankTrace):  # a RankResult
        return [x.trace]
    return [t for item in x for t in traces_of(item)]


def run(g: Graph) -> Replayed:
    """Replay ``g`` and measure its steps."""
    t = simulate(g)
    start, end = step_windows(g, t)
    per_rank, steps = [], []
    for i in range(len(g.ranks)):
        d = (end - start)[g.s_rank == i] / 1000.0
        d = d[np.isfinite(d)]
        per_rank.append(float(d.mean()) if len(d) else float("nan"))
        steps.append(tuple(float(x) for x in d))
    return Replayed(g, t, tuple(per_rank), tuple(steps))


def replay(x: Source, transforms: Sequence[Transform] = (), event_cost_us: float = 0.0) -> Replayed:
    """Replay a trace (or a job's ranks) as recorded, or after ``transforms``. With
    ``event_cost_us`` the profiler's cost per recorded host event is first taken out."""
    g = build(traces_of(x))
    if event_cost_us > 0:
        g = deflate(g, event_cost_us)
    for f in transforms:
        g = f(g)
    return run(g)


@dataclass(frozen=True)
class WhatIf:
    before_ms: float
    after_ms: float

    @property
    def saving_ms(self) -> float:
        return self.before_ms - self.after_ms


def what_if(g: Graph, transforms: Sequence[Transform]) -> WhatIf:
    """Step time of ``g`` replayed as it is and after all ``transforms`` applied together (the
    hook a finding's fix plugs into: its saving is ``before − after``)."""
    after = g
    for f in transforms:
        after = f(after)
    return WhatIf(run(g).step_time_ms, run(after).step_time_ms)


__all__ = ["Graph", "Replayed", "Times", "Transform", "WhatIf", "build", "deflate", "replay", "run", "simulate",
           "traces_of", "what_if"]
