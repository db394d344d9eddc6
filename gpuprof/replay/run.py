"""Running a dependency graph (:func:`gpuprof.replay.simulate.simulate`) and measuring its steps:
the step times a replay reports (:class:`Replayed`), the steady-state step a fix is priced on
(:func:`steady_ms`), and a graph before and after a set of transformations (:func:`what_if`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpuprof.replay.graph import Graph
from gpuprof.replay.simulate import Times, simulate, step_windows
from gpuprof.trace.model import RankTrace

Transform = Callable[[Graph], Graph]


@dataclass(frozen=True)
class Replayed:
    """A replay's outcome: per-rank mean step time (ms) and each step's time (ms), in
    ``graph.ranks`` order; ``step_time_ms`` is their mean over ranks, as in the summary."""

    graph: Graph
    times: Times
    rank_step_ms: tuple[float, ...]
    steps_ms: tuple[tuple[float, ...], ...]
    rank_period_ms: tuple[float, ...]

    @property
    def step_time_ms(self) -> float:
        """Mean step time by the trace model's step windows (what ``summary.step_time_ms`` is)."""
        ok = [x for x in self.rank_step_ms if np.isfinite(x)]
        return float(np.mean(ok)) if ok else float("nan")

    @property
    def period_ms(self) -> float:
        """Steady-state step time: the mean time between consecutive step ends (the step time
        itself with one step). What a fix is priced on: a step window's start moves with the
        host, so with a faster host the first window can open earlier and read longer, while
        the steps still finish no sooner; the period between ends has no such artefact."""
        ok = [x for x in self.rank_period_ms if np.isfinite(x)]
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
    per_rank, steps, period = [], [], []
    for i in range(len(g.ranks)):
        d = (end - start)[g.s_rank == i] / 1000.0
        ends = end[g.s_rank == i]
        ends = ends[np.isfinite(ends)]
        d = d[np.isfinite(d)]
        per_rank.append(float(d.mean()) if len(d) else float("nan"))
        steps.append(tuple(float(x) for x in d))
        period.append(float(np.diff(ends).mean()) / 1000.0 if len(ends) > 1 else per_rank[-1])
    return Replayed(g, t, tuple(per_rank), tuple(steps), tuple(period))


def host_only(g: Graph) -> Graph:
    """``g`` with every GPU activity taking no time, so no call waits for one (a sync, a full
    launch queue): what the host alone allows per step. Without the GPU-to-host edges it replays
    in one pass; the syncs' round trips it leaves out keep it a floor."""
    return replace(g, a_dur=np.zeros_like(g.a_dur), h_wait=np.full_like(g.h_wait, -1),
                   h_bp=np.full_like(g.h_bp, -1))


def steady_ms(g: Graph) -> float:
    """Steady-state step time (ms): the replayed period (:attr:`Replayed.period_ms`), and never
    less than the host's own time per step (the period of :func:`host_only`). A trace holds a few
    steps, and the host can enter them ahead of the GPU by work it launched before the window
    (gpt_fp32: the GPU is still busy with 77 ms of earlier steps when the host has launched all
    three profiled ones). A replay whose GPU work got faster spends that lead and reads the host as
    free; a loop of such steps cannot, since each step needs its host work done before its last
    launch. On the unchanged traces the period is the longer of the two (the host kept up)."""
    period = run(g).period_ms
    host = run(host_only(g)).period_ms
    return max(period, host) if np.isfinite(host) else period


@dataclass(frozen=True)
class WhatIf:
    """Steady-state step time (:attr:`Replayed.period_ms`) before and after a set of changes."""

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
    return WhatIf(run(g).period_ms, run(after).period_ms)
