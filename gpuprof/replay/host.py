"""The unprofiled host in the replay: what a trace says about the host without the profiler.

Under the profiler the host runs slower than without it; before a fix is priced the host is taken
back to the unprofiled one (:func:`host_bounds`: the trace's own bookkeeping cost per recorded
event (:mod:`gpuprof.hostcost`), :func:`~gpuprof.replay.transforms.deflate`, then one host-speed
factor, :func:`host_speed`), searched on the replayed steady-state step. See docs/replay.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from gpuprof.replay.graph import Graph
from gpuprof.replay.run import run, steady_ms
from gpuprof.replay.transforms import deflate, shrink_host, shrink_tail


#: Within this share of the unprofiled step, a replay at the GPU's own floor is the measured step:
#: the replay's own tolerance on unchanged traces (docs/replay.md), so a host that holds the step
#: up by less is not measured by the step time.
HOST_SEEN = 0.03


def _top_cost(g: Graph) -> float:
    """A cost per recorded event that takes every host gap and call out (the host gone)."""
    busy = np.maximum(g.h_gap, 0.0) + g.h_dur
    return float((busy / np.maximum(g.h_events, 1)).max()) if len(busy) else 0.0


def _bisect(measure: Callable[[float], float], lo: float, hi: float, target_ms: float, rising: bool, tol: float,
            max_iter: int, narrow: Callable[[float, float], bool], early: bool = True) -> float:
    """The end of ``[lo, hi]`` nearest the edge of the values ``x`` whose replay ``measure(x)`` is
    no slower than ``target_ms``, by bisection: ``measure`` rises with ``x`` (``rising``: the largest
    such ``x``, ``lo``) or falls with it (the smallest, ``hi``). Stops once ``narrow(lo, hi)``, or
    (``early``) at a replay within ``tol`` of the target."""
    for _ in range(max_iter):
        if narrow(lo, hi):
            break
        mid = 0.5 * (lo + hi)
        got = measure(mid)
        if (got > target_ms) != rising:
            lo = mid
        else:
            hi = mid
        if got <= target_ms and early and got >= target_ms * (1 - tol):
            break
    return lo if rising else hi


def _smallest_cost(g: Graph, target_ms: float, measure: Callable[[Graph], float], top: float, start: float,
                   tol: float, max_iter: int, floor: bool = False) -> float:
    """The smallest cost per recorded host event whose replay (``measure``) is no slower than
    ``target_ms``, by bisection (the replayed step only falls as the cost grows), bracketed from
    ``start`` doubling as needed; ``top`` when none below it is. A replay within ``tol`` of the
    target ends the search, except where the target is the GPU's ``floor``: every cost above the
    smallest replays that too."""
    hi = min(top, start or top)
    lo = 0.0
    while hi < top and measure(deflate(g, hi)) > target_ms:
        lo, hi = hi, min(2 * hi, top)
    return _bisect(lambda c: measure(deflate(g, c)), lo, hi, target_ms, False, tol, max_iter,
                   lambda a, b: b - a <= 1e-3 * b, early=not floor)


def calibrate(g: Graph, unprofiled_step_ms: float, tol: float = 0.002, max_iter: int = 40) -> float:
    """The profiler's cost per recorded host event (µs): the smallest that makes the replayed
    steady-state step (:attr:`Replayed.period_ms`, what the unprofiled timing measures and what
    fixes are priced on) take the step time measured without the profiler (``unprofiled_step_ms``),
    found by bisection (the replayed step only falls as the cost grows); 0 when the traced replay
    is already no slower although the host holds it up.

    Only where the host held the real step up does the step time measure the host: when even a
    host of no cost replays within ``HOST_SEEN`` of ``unprofiled_step_ms`` (the GPU sets the step), every
    cost from the smallest up replays the measured step. This returns the largest cost per event
    in the trace there (the host taken out); one rank's fixes are priced between that and the
    host floor (:func:`host_bounds`); the cross-rank replay (``gpuprof.replay.job.job``) uses
    this figure."""
    top = _top_cost(g)
    floor = run(deflate(g, top)).period_ms
    if floor >= unprofiled_step_ms * (1 - HOST_SEEN):
        return top
    base = run(g).period_ms
    if not base > unprofiled_step_ms * (1 + tol):
        return 0.0
    # bracket from the mean cost per event (it takes the host out on average)
    busy = np.maximum(g.h_gap, 0.0) + g.h_dur
    mean = float(busy.sum() / max(float(g.h_events.sum()), 1.0))
    return _smallest_cost(g, unprofiled_step_ms, lambda x: run(x).period_ms, top, mean, tol, max_iter)


def host_speed(g: Graph, s: float) -> Graph:
    """``g`` with its host run ``1 / s`` × as fast: every gap (Python, the dispatcher) ``s`` × as
    long, and every call, with a waiting call's return after the GPU work it waited for, except the
    driver's own work in allocation and release calls (``Graph.h_driver``: the profiler adds its
    fixed cost per call there, taken out by :func:`deflate`, but does not slow the driver). A
    call's wait for the GPU is untouched."""
    if s == 1.0:
        return g
    every = np.ones(g.n_host, dtype=bool)
    h = shrink_host(g, every, s)
    h = replace(h, h_dur=np.where(g.h_driver, g.h_dur, h.h_dur))  # the driver's own work stays
    return shrink_tail(h, ~g.h_driver, s)


def largest_speed(g: Graph, target_ms: float, tol: float = 0.002, max_iter: int = 40) -> float:
    """The largest host-speed factor ``s`` in (0, 1] whose steady step (:func:`steady_ms` of
    :func:`host_speed`) is no slower than ``target_ms``, by bisection (the step only falls as
    ``s`` does); a replay within ``tol`` of the target ends the search."""
    return _bisect(lambda s: steady_ms(host_speed(g, s)), 0.0, 1.0, target_ms, True, tol, max_iter,
                   lambda a, b: b - a <= 1e-4)


@dataclass(frozen=True)
class HostBounds:
    """What a trace says about the unprofiled host: ``floor_us``, the profiler's cost per recorded
    event taken out first (its bookkeeping), and ``speed``, the factor on all host time left after
    it (1: none), together the slowest host the evidence allows (the identified host where the real
    step measures it); ``identified`` whether that is the host (else the fastest host the evidence
    allows is no host at all, and the unprofiled host lies between)."""

    floor_us: float
    identified: bool
    speed: float = 1.0

    def apply(self, g: Graph) -> Graph:
        """``g`` with this host: deflated by ``floor_us`` per event, then ``speed`` × as long."""
        return host_speed(deflate(g, self.floor_us) if self.floor_us > 0 else g, self.speed)


def host_bounds(g: Graph, unprofiled_step_ms: float | None, bracket_us: float, tol: float = 0.002,
                max_iter: int = 40) -> HostBounds:
    """The host floor of ``g`` (see :class:`HostBounds`), on the steady-state step
    (:func:`steady_ms`), from the trace's own evidence:

    * the unprofiled step holds the host up (a host of no cost replays faster than it by more than
      ``HOST_SEEN``): the host is identified as ``bracket_us`` per recorded event (the trace's own
      measure of the profiler's bookkeeping per event: ``gpuprof.hostcost.bracket_cost_us``) and one
      speed factor on all host time left, the largest that replays the real step. Measured region
      by region (sample_traces/regions, ``python -m benchmarks.host_regions``), the profiler slows
      the Python and dispatch work of a host-bound step about 2x whatever its events per ms (1.7-10
      µs per event between regions of one step), while a few large C++ calls barely slow: one cost
      per event had put the whole slowdown on event-dense work (backward replayed 44 % too fast in
      two_sync_forloop, the norm loop 65 % too slow). Where the bracket alone already replays
      faster than the real step, the smallest cost per event that replays it (no speed factor);
    * the GPU sets the unprofiled step: the host kept up with the GPU, so the cost is at least the
      smallest that replays no slower than the real step (the host pinned at the GPU's speed), and
      at least ``bracket_us``. The larger is the floor: the real host is at least that fast, maybe
      faster;
    * no unprofiled step: ``bracket_us`` is the only evidence, a floor as above."""
    if not unprofiled_step_ms:
        return HostBounds(bracket_us, False)
    top = _top_cost(g)
    free = steady_ms(deflate(g, top))
    busy = np.maximum(g.h_gap, 0.0) + g.h_dur
    mean = float(busy.sum() / max(float(g.h_events.sum()), 1.0))
    if free < unprofiled_step_ms * (1 - HOST_SEEN):
        if not steady_ms(g) > unprofiled_step_ms * (1 + tol):
            return HostBounds(0.0, True)
        base = deflate(g, bracket_us) if bracket_us > 0 else g
        if steady_ms(base) <= unprofiled_step_ms * (1 + tol):
            return HostBounds(_smallest_cost(g, unprofiled_step_ms, steady_ms, top, mean, tol, max_iter), True)
        return HostBounds(bracket_us, True, largest_speed(base, unprofiled_step_ms, tol, max_iter))
    # the host kept up where its replay is the real step within the replay's own error (HOST_SEEN,
    # as above; the host-free replay may itself read slower than the real step): a host that the GPU
    # hides but for a sliver (a sync's return each pass) moves the replay by a fraction of its own
    # time, so a tighter test bounds it by the replay's error instead of by the evidence
    target = max(unprofiled_step_ms * (1 + HOST_SEEN), free * (1 + tol))
    kept_up = (0.0 if steady_ms(g) <= target
               else _smallest_cost(g, target, steady_ms, top, mean, tol, max_iter, floor=True))
    return HostBounds(max(kept_up, bracket_us), False)
