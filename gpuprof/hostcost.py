"""The profiler's cost on the host: what torch.profiler adds to every CPU op and runtime call it
records, so that host time measured under it can be taken back to the program's own.

Kernel durations in a trace are what they would be without the profiler; host time is not: with
``record_shapes`` every recorded host event costs the profiler's bookkeeping, and a host-bound step
runs 1.5-2.5x as long under it (docs/verification.md, docs/replay.md). The cost per event is known
in one of two ways, and every consumer (the idle gaps' deflation in :class:`gpuprof.rank.RankView`,
the slow rank's waits in ``analyzers.distributed``, the replay's host floor in
:func:`gpuprof.replay.host_bounds`) reads it from here:

* measured (:func:`event_cost_us`): ``(traced step - unprofiled step) / host events per step``,
  where the unprofiled step time is known (``--step-ms``, or measured by ``gpuprof record``);
* the trace's own (:func:`bracket_cost_us`): the host time a wrapper op spends around its one
  child, a floor of the real cost, for bare traces.

The replay refines these on the dependency graph (:func:`gpuprof.replay.calibrate` and
:func:`gpuprof.replay.host_bounds` search the cost, and one host-speed factor, that replays the
unprofiled step); that search needs the graph and lives with it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from gpuprof.timeline import StepSummary
from gpuprof.trace.model import RankTrace


class TracedRank(Protocol):
    """What the cost needs of a rank: its trace, its step summary and its unprofiled step time."""

    @property
    def trace(self) -> RankTrace: ...

    @property
    def summary(self) -> StepSummary: ...

    @property
    def unprofiled_step_ms(self) -> float | None: ...


def unprofiled_step_ms(r: TracedRank) -> float | None:
    """The rank's step time measured without the profiler, when the run or the user gave it."""
    v = r.unprofiled_step_ms
    return float(v) if v else None


def event_cost_us(r: TracedRank) -> tuple[float, float]:
    """(the profiler's cost per recorded host event in µs, host events per step). The cost is
    ``(traced step − real step) / host events per step``, 0 when the real step time is unknown."""
    t = r.trace
    n_steps = max(len(t.steps), 1)
    events = int((t.ops["step"] >= 0).sum() + (t.runtime["step"] >= 0).sum())
    per_step = events / n_steps
    step_us = float(r.summary.steps["time_us"].mean()) if len(r.summary.steps) else 0.0
    unprofiled = r.unprofiled_step_ms
    cost = max(0.0, step_us - unprofiled * 1000.0) / per_step if unprofiled and per_step else 0.0
    return cost, per_step



def bracket_cost_us(t: RankTrace) -> float:
    """The profiler's cost per recorded host event, estimated from the trace alone: the median
    host time an op with exactly one child op spends around that child (from its own start to the
    child's, and from the child's end to its own). Such a wrapper (``aten::linear`` around
    ``aten::addmm``, ``aten::conv2d`` around ``aten::convolution``) does one dispatch there, well
    under a microsecond without the profiler; what the trace shows is the profiler's bookkeeping
    for one event. It is a floor: the profiler also slows the host work it does not bracket, so
    deflating by it takes out less than the profiler added (docs/replay.md, "the bracket
    estimate", compares it with the cost measured from step times). 0 when the trace has no such
    ops (GPU-only traces: no deflation)."""
    ops = t.ops
    if not len(ops) or "parent" not in ops.columns:
        return 0.0
    parent = ops["parent"].to_numpy().astype(np.int64)
    child = np.flatnonzero((parent >= 0) & (ops["step"].to_numpy() >= 0))
    if not len(child):
        return 0.0
    n_children = np.bincount(parent[child], minlength=len(ops))
    only = child[n_children[parent[child]] == 1]
    if not len(only):
        return 0.0
    ts, en = ops["ts"].to_numpy(dtype=float), ops["end"].to_numpy(dtype=float)
    p = parent[only]
    around = (ts[only] - ts[p]) + (en[p] - en[only])
    return float(np.median(np.maximum(around, 0.0)))



def profiler_cost_us(r: TracedRank) -> tuple[float, bool]:
    """(the profiler's cost per recorded host event in µs, whether it was measured): from the
    traced vs. the unprofiled step time when that is known (:func:`event_cost_us`),
    else :func:`bracket_cost_us` from the trace's own events."""
    if unprofiled_step_ms(r) is not None:
        return event_cost_us(r)[0], True
    return bracket_cost_us(r.trace), False
