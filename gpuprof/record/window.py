"""The unprofiled window: which steps the recorder times, and when it has seen the steady state.

A program's first steps are not its steady state: compilation, cuDNN's autotuning and the
allocator's growth slow them; a DataLoader's prefetched queue speeds them (its workers filled it
while the program started, and it runs from it faster than they produce until it is drained). And
a real training loop's steps vary by 5-20 % from chunk to chunk (logging, the input pipeline, the
host), so a few steps that happen to agree are no measure of it. So the recorder skips
``--skip-steps`` steps and then, by default (the ``steady`` rule), times consecutive chunks of
steps and reports the mean over every chunk of the steady phase. The first chunk is
:data:`CHUNK_STEPS` steps (rounded up to whole loader cycles, below); every later one is as many steps as make at least :data:`CHUNK_MIN_S`
seconds at the first chunk's pace (and never fewer than :data:`CHUNK_STEPS`): a chunk of 10 steps of
a compiled 10 ms step is 0.1 s, over which the host's own jitter (a garbage collection, a logging
step, the launch queue) moves its mean by 20 %, where 10 steps of a 25 ms step move it by 5 %;
a chunk of fixed duration holds that jitter to one size whatever the step time. Where the program
reads a multi-process DataLoader (seen by the first boundary for the first chunk, by the end of
the first chunk for the others), every chunk is also a whole number of its cycles: the loader hands out batches from its ``num_workers`` workers in turn, so a loop its
workers do not keep up with waits every ``num_workers``-th step (a Lightning ResNet-18 with 4
workers on the H200: steps of 19, 22, 20 and 44 ms, over and over), and a 10-step chunk holds two
or three of those waits, its mean swinging 22 ↔ 30 ms from chunk to chunk, where 12-step chunks
hold three each. A cycle that would more than double a chunk is not followed (a loader of many
workers: the budget would run out first); over several live loaders (training and validation)
the cycle is the least common multiple of their worker counts where that stays within twice the
first chunk, else the largest loader's (the recorder cannot tell which loader the step reads):

- the steady phase starts after the DataLoader's queue has stopped draining (the fewest batches
  found ready in the program's multi-process DataLoader queues during a chunk fell below the
  previous chunk's, chunk after chunk from the first or after a leading plateau at the queue's
  cap: while a prefetched queue drains, every step runs at the GPU's pace; a dip after the level
  has held or risen is the steady state's own fluctuation, :func:`steady_start`) and after
  the warm-up transient, found by the marginal standard error rule (MSER: the truncation point
  ``d`` of the chunk means that minimises the squared deviations of the rest over
  ``(n - d)**2``, at most half of them; White, 1997), so neither a threshold nor the agreement of
  a few chunks decides it;
- timing stops once the steady phase holds at least :data:`MIN_CHUNKS` chunks and the standard
  error of its mean is within :data:`SEM_PCT` % of the mean (an unbiased figure whose own error
  is well inside the 5 % a user needs), or once a budget is spent (:data:`BUDGET_CHUNKS` chunks,
  i.e. 100 steps where chunks are 10 steps, or :data:`BUDGET_S` seconds, whichever first: the
  profiled steps must still come while a short program runs, and a loop whose chunks vary by 20 %
  is profiled at most half a minute late); then the steady phase's mean is taken and the record says the timing did not converge,
  with its spread and standard error.

After the profiler stops, the steady rule goes on timing (:meth:`Window.pooled`): chunks of the same
length, from :data:`AFTER_SKIP <gpuprof.record.hook.AFTER_SKIP>` steps after the stop (the trace's
export runs in them), until :data:`AFTER_BUDGET_CHUNKS` chunks or :data:`BUDGET_S` seconds are spent
or the program ends, whether or not the steps already hold their mean: a process's speed drifts
over its run by more than the 2 % a converged window holds (on the H200 on 2026-12-06 the
Accelerate program ran 34.6 ms a step over its converged window before the profiler and 38.9 over
its steps 60-500; FSDP2 36.6 and 34.1), so the more of the run the figure covers, the nearer it is
to what the program's own log reads. ``converged`` is whether the two windows together hold their
mean within :data:`SEM_PCT` %. The figure is the mean over both: the budget before the profiler
keeps a short program's profiled steps early, the steps after it let a loop whose chunks spread
by 30 % (a DataLoader its workers do not keep up with, a job that speeds up and slows down over a
hundred steps) be timed for as long as it runs, and a program whose speed moves after its first
steps (its own clock over steps 60-260 read 42.4 ms a step where steps 7-56 read 37.3) is timed
over both. They are pooled only where the profiler left nothing
behind: CUPTI torn down at its stop (``TEARDOWN_CUPTI=1``, which the launcher sets; a program
whose steps stayed slower with it at 0 would bias the figure), on the same clock.

With ``--timed-steps N`` the window is instead the N steps after the skipped ones (``fixed``, one
chunk), as before: for short programs and tests.

Chunk ends are marked without synchronising anything: a CUDA event on the stepping optimizer's
stream at each chunk boundary (so the figure is the GPU timeline's step time, the host runs ahead
by as many steps as the launch queue holds), queried without blocking at each later step; the
decision is taken once the GPU has passed the chunks it is about, a few steps after the host.
Programs that do not use CUDA are timed on the host clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CHUNK_STEPS = 10  # the first chunk (before whole loader cycles), and the fewest steps of any chunk
CHUNK_MIN_S = 0.2  # later chunks last at least this long at the first chunk's pace
MIN_CHUNKS = 4
SEM_PCT = 2.0
BUDGET_CHUNKS = 10
BUDGET_S = 30.0
AFTER_BUDGET_CHUNKS = 30  # chunks timed after the profiler at most (the record lists each)
PLATEAU_DRAIN = 2  # chunks of falling level that make a drain after a leading plateau (steady_start)


def whole_cycles(steps: int, workers: int | None) -> int:
    """``steps`` rounded up to a whole number of cycles of a DataLoader with ``workers`` worker
    processes (module doc), unless that would more than double it (then ``steps``)."""
    if not workers or workers < 2:
        return steps
    whole = -(-steps // workers) * workers
    return whole if whole <= 2 * steps else steps


def chunk_steps(first_chunk_ms: float, workers: int | None = None) -> int:
    """Steps per chunk after the first, from the first chunk's step time and the DataLoader's
    worker count (module doc)."""
    if not first_chunk_ms > 0:
        return whole_cycles(CHUNK_STEPS, workers)
    return whole_cycles(max(CHUNK_STEPS, math.ceil(CHUNK_MIN_S * 1000.0 / first_chunk_ms - 1e-9)), workers)


@dataclass
class Chunk:
    """Consecutive timed steps ``first_step..last_step`` (1-based step counts, both included)."""

    first_step: int
    last_step: int
    host_ms: float  # per step, on the host clock between the two boundaries
    ready_min: int | None  # fewest DataLoader batches found ready at a step of the chunk (None: no such loader)
    gpu_ms: float | None = None  # per step, on the GPU timeline, once the GPU has passed the chunk's end
    #: per step, host time the stepping thread spent inside DataLoader ``__next__`` calls (None: not measured)
    loader_wait_ms: float | None = None

    @property
    def steps(self) -> int:
        return self.last_step - self.first_step + 1


def agreement(ms: list[float]) -> float:
    """(largest - smallest) / mean of chunk step times, in %."""
    mean = sum(ms) / len(ms)
    return 100.0 * (max(ms) - min(ms)) / mean if mean > 0 else math.inf


def _stats(ms: list[float]) -> tuple[float, float]:
    """(mean, standard error of the mean) of chunk step times (0 for one chunk)."""
    mean = sum(ms) / len(ms)
    if len(ms) < 2:
        return mean, 0.0
    sd = math.sqrt(sum((m - mean) ** 2 for m in ms) / (len(ms) - 1))
    return mean, sd / math.sqrt(len(ms))


def mser(ms: list[float]) -> int:
    """The warm-up truncation point of the chunk means ``ms`` by the marginal standard error rule:
    the ``d`` (at most half of them) that minimises the squared deviations of ``ms[d:]`` from
    their mean over ``(len(ms) - d)**2``; ties go to the smallest ``d``."""
    best, best_d = math.inf, 0
    for d in range(0, len(ms) // 2 + 1):
        rest = ms[d:]
        mean = sum(rest) / len(rest)
        stat = sum((m - mean) ** 2 for m in rest) / len(rest) ** 2
        if best == math.inf or stat < best - 1e-12 * max(best, 1.0):
            best, best_d = stat, d
    return best_d


def _falls(a: int | None, b: int | None) -> bool:
    return a is not None and b is not None and b < a


def _drain(chunks: list[Chunk], n: int) -> tuple[int, bool]:
    """(one past the last chunk of the DataLoader drain among the first ``n`` chunks, 0 for none;
    whether a fall after a leading plateau has begun in the last chunk and is too short yet to
    tell from a dip): see :func:`steady_start`."""
    level = [c.ready_min for c in chunks[:n]]
    plateau = 0  # the last chunk of the leading plateau
    while plateau + 1 < n and level[0] is not None and level[plateau + 1] == level[0]:
        plateau += 1
    end = plateau + 1  # one past the last chunk of the fall
    while end < n and _falls(level[end - 1], level[end]):
        end += 1
    fall = end - plateau - 1
    if not plateau:
        return (end if fall else 0), False
    if any(x is not None and level[0] is not None and x >= level[0] for x in level[end:]):
        return 0, False  # the queue filled back to the plateau's level: its workers keep up, no drain
    if fall >= PLATEAU_DRAIN:
        return end, False
    return 0, bool(fall) and end == n


def steady_start(chunks: list[Chunk], ms: list[float]) -> int:
    """Where the steady phase begins among the first ``len(ms)`` chunks (module doc): after the
    DataLoader's prefetched queue has drained, then past the warm-up transient of what follows
    (:func:`mser`); past the last chunk (no figure) while the queue is still draining there.

    The drain is a run of chunks over which the queue's lowest level falls chunk after chunk,
    from the first chunk or after a leading plateau (a queue held at one level, its cap, while the
    first steps were slow, then draining: ``[8, 8, 6, 3, 0, ...]``). After a plateau it must fall
    for :data:`PLATEAU_DRAIN` chunks in a row, since a queue its workers keep full dips by a
    batch now and then, and the level must not come back up to the plateau's later (workers that
    refill the queue keep up: ``[2, 2, 1, 0, 1, 2, ...]`` is fluctuation). Once the level holds or
    rises after the fall (or without one), a later dip is the steady state's own fluctuation
    (workers that keep up leave the level moving by a batch or two from chunk to chunk), not a
    drain. Not seen: a fall before the plateau (``[9, 8, 8, 6, ...]``), a first chunk without a
    level.
    """
    n = len(ms)
    start = _drain(chunks, n)[0]  # still draining in the last chunk: n, no figure
    return start + mser(ms[start:]) if n - start > 1 else start


def steady(chunks: list[Chunk], ms: list[float], k: int = MIN_CHUNKS, pct: float = SEM_PCT) -> bool:
    """Whether the chunks timed so far (their step times ``ms``) hold the steady state well enough
    (module doc): at least ``k`` steady chunks whose mean's standard error is within ``pct`` %,
    and no fall of the queue after a plateau begun in the last chunk (a drain may be starting:
    the next chunk tells)."""
    if _drain(chunks, len(ms))[1]:
        return False
    return _holds(ms[steady_start(chunks, ms):], k, pct)


class Window:
    """The timing of the unprofiled steps of one process, boundary by boundary.

    ``fixed`` is the number of steps of a fixed window (``--timed-steps N``), None for the steady
    rule. ``event()`` makes and records a CUDA event at a boundary (None: host clock only).
    """

    def __init__(self, first_boundary: int, fixed: int | None, clock: Callable[[], float] = time.perf_counter,
                 every: int | None = None) -> None:
        self.first = first_boundary
        self.fixed = fixed
        self.every = every  # every chunk this many steps, fixed: the timing after the profiler (module doc)
        self.clock = clock
        self.marks: list[tuple[int, float, Any]] = []  # (step, host time, CUDA event or None)
        self.waited: list[float | None] = []  # at each mark: the stepping thread's DataLoader time so far (s)
        self.chunks: list[Chunk] = []
        self.ready: int | None = None  # running minimum of the loader's ready batches in the open chunk
        self.closed = False  # no more boundaries (decided, budget spent or the program's profiler began)
        self.decided = False
        self.converged: bool | None = None
        self.why: str | None = None
        self.cuda = False
        self.failed: str | None = None
        self.chunk_steps = every or CHUNK_STEPS  # steps per chunk after the first (set at the first chunk's end)
        self.first_chunk_steps = every or CHUNK_STEPS  # set at the first boundary (whole loader cycles)
        self.workers: int | None = None  # the DataLoader's worker processes, as last seen before the first chunk's end

    # --- boundaries ------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        """Whether ``step``'s end is a chunk boundary."""
        if self.closed or step < self.first:
            return False
        if self.fixed is not None:
            return step in (self.first, self.first + self.fixed) and (self.fixed > 0 or not self.marks)
        if not self.marks:
            return step == self.first
        last = self.marks[-1][0]
        return step - last >= (self.first_chunk_steps if len(self.marks) == 1 else self.chunk_steps)

    def sample(self, ready: int | None, workers: int | None = None) -> None:
        """The loader's ready batches at one step of the open chunk, and its worker processes
        (read until the first chunk ends: the chunks' lengths are fixed then)."""
        if ready is not None:
            self.ready = ready if self.ready is None else min(self.ready, ready)
        if workers and len(self.marks) < 2:
            self.workers = workers

    def mark(self, step: int, event: Any, waited_s: float | None = None) -> None:
        """A chunk boundary at the end of ``step``; ``waited_s``: the seconds the stepping thread
        has spent inside DataLoader ``__next__`` calls so far (None: no DataLoader iterated)."""
        now = self.clock()
        if self.marks:
            s0, t0, _ = self.marks[-1]
            w0 = self.waited[-1]
            wait = None if waited_s is None else (waited_s - (w0 or 0.0)) * 1000.0 / (step - s0)
            self.chunks.append(Chunk(s0 + 1, step, (now - t0) * 1000.0 / (step - s0), self.ready,
                                     loader_wait_ms=wait))
        self.marks.append((step, now, event))
        self.waited.append(waited_s)
        self.ready = None
        if self.every is not None:
            if len(self.chunks) >= AFTER_BUDGET_CHUNKS or now - self.marks[0][1] >= BUDGET_S:
                self.closed = True
                self.why = (f"the budget of {AFTER_BUDGET_CHUNKS} chunks after the profiler was spent"
                            if len(self.chunks) >= AFTER_BUDGET_CHUNKS else
                            f"the budget of {BUDGET_S:g} s of timing after the profiler was spent")
            return
        if len(self.marks) == 1 and self.fixed is None:
            self.first_chunk_steps = whole_cycles(CHUNK_STEPS, self.workers)
        if len(self.chunks) == 1 and self.fixed is None:
            self.chunk_steps = chunk_steps(self.chunks[0].host_ms, self.workers)
        if self.fixed is not None and (self.fixed == 0 or len(self.marks) == 2):
            self.closed = self.decided = True  # the profiler starts now; the GPU's figure is read later
        elif self.fixed is None and (len(self.chunks) >= BUDGET_CHUNKS or now - self.marks[0][1] >= BUDGET_S):
            self.closed = True
            self.why = (f"the budget of {BUDGET_CHUNKS} chunks ({step - self.first} timed steps) was spent"
                        if len(self.chunks) >= BUDGET_CHUNKS else f"the budget of {BUDGET_S:g} s of timing was spent")

    # --- reading the GPU's times -----------------------------------------------------------
    def resolve(self, block: bool = False) -> None:
        """Read the GPU time of every chunk whose end event has completed (``block``: wait for all)."""
        if not self.cuda or self.failed:
            return
        try:
            for i, chunk in enumerate(self.chunks):
                if chunk.gpu_ms is not None:
                    continue
                start, end = self.marks[i][2], self.marks[i + 1][2]
                if not end.query():
                    if not block:
                        return
                    end.synchronize()
                chunk.gpu_ms = float(start.elapsed_time(end)) / chunk.steps
        except Exception as e:  # a lost context at exit, a broken event: the host figure stays
            self.failed = f"CUDA events failed ({e.__class__.__name__}: {e})"

    def times(self) -> list[float]:
        """The step time of each chunk known so far, in order (GPU timeline when timed with events)."""
        if not self.cuda or self.failed:
            return [c.host_ms for c in self.chunks]
        out = []
        for c in self.chunks:
            if c.gpu_ms is None:
                break
            out.append(c.gpu_ms)
        return out

    def decide(self) -> bool:
        """Under the steady rule, whether timing is over (converged, or the budget spent and read);
        called at each step. Fixed windows decide at their second boundary."""
        if self.decided:
            return True
        self.resolve(block=self.closed)  # once the budget is spent, one wait for the GPU
        ms = self.times()
        if steady(self.chunks, ms):
            self.converged = self.decided = self.closed = True
        elif self.closed:
            self.converged, self.decided = False, True
        return self.decided

    def stop(self, why: str) -> None:
        """No more chunks (the program's profiler began, or the program ends)."""
        if not self.decided:
            self.closed, self.decided, self.converged = True, True, False
            self.why = self.why or why

    # --- the result ------------------------------------------------------------------------
    def pooled(self, after: Window | None = None) -> tuple[list[Chunk], list[float]]:
        """The chunks the figure is taken from and their step times: the steady phase
        (:func:`steady_start`; a fixed window's or a continuation's every chunk), then every chunk
        ``after`` (the timing after the profiler, module doc) has read so far."""
        ms = self.times()
        if self.fixed is not None or self.every is not None:
            win, wms = self.chunks[:len(ms)], ms
        else:
            start = steady_start(self.chunks, ms)
            win, wms = self.chunks[start:len(ms)], ms[start:]
        if after is not None:
            ams = after.times()
            win, wms = win + after.chunks[:len(ams)], wms + ams
        return win, wms

    def result(self, block: bool = False, after: Window | None = None) -> tuple[float | None, dict[str, Any]]:
        """The mean step time over the window and how it was measured (for the rank's record);
        ``after``: the timing after the profiler, pooled with the steady phase (module doc)."""
        self.resolve(block)
        if after is not None:
            after.resolve(block)
            if not after.times():
                after = None
        ms = self.times()
        win, wms = self.pooled(after)
        info: dict[str, Any] = {"rule": "fixed" if self.fixed is not None else "steady",
                                "steps": sum(c.steps for c in win)}
        if self.fixed is None and self.every is None:
            info.update(chunk_steps=self.chunk_steps, first_chunk_steps=self.first_chunk_steps, chunk_min_s=CHUNK_MIN_S,
                        min_chunks=MIN_CHUNKS, sem_pct=SEM_PCT, converged=self.converged)
            if self.workers:
                info["loader_workers"] = self.workers  # the cycle seen (a worker count, or the lcm of several)
                info["loader_cycles_followed"] = (self.first_chunk_steps % self.workers == 0
                                                  and self.chunk_steps % self.workers == 0)
            why = self.why
            if after is not None:
                before, before_ms = self.pooled()
                info["converged"] = _holds(wms)
                why = after.why or why
                info["before_profiling"] = {"converged": self.converged, "steps": sum(c.steps for c in before),
                                            **({"step_ms": round(_mean(before, before_ms), 4)} if before else {})}
            if info["converged"] is False and why:
                info["not_converged_why"] = why
        info["chunks"] = [_record(c, m) for c, m in zip(self.chunks, ms)]
        if after is not None:
            info["chunks"] += [_record(c, m, after_profiling=True) for c, m in zip(after.chunks, after.times())]
        if not win:
            return None, info
        steps = sum(c.steps for c in win)
        mean = _mean(win, wms)
        info["window"] = {"first_step": win[0].first_step, "last_step": win[-1].last_step}
        if after is not None:  # the steps between (profiled, exported) are in neither
            cut = len(win) - len(after.times())
            info["windows"] = [[part[0].first_step, part[-1].last_step] for part in (win[:cut], win[cut:]) if part]
        info["host_step_ms"] = sum(c.host_ms * c.steps for c in win) / steps
        waits = [c.loader_wait_ms for c in win]
        if all(w is not None for w in waits):
            # what the window's steps spent waiting for their batches, on the host clock: the
            # profiled steps may have caught none of a loader's intermittent waits (gpuprof.steptime)
            info["loader_wait_ms"] = sum(w * c.steps for w, c in zip(waits, win) if w is not None) / steps
        if len(wms) > 1:
            sd = math.sqrt(sum((m - mean) ** 2 for m in wms) / (len(wms) - 1))
            info.update(spread_pct=round(agreement(wms), 3), stddev_ms=round(sd, 4),
                        sem_ms=round(sd / math.sqrt(len(wms)), 4))
        return mean, info


def _record(c: Chunk, ms: float, **extra: Any) -> dict[str, Any]:
    """One chunk as the rank's record lists it (``ms``: its step time), ``extra`` keys after its clocks."""
    return {"steps": [c.first_step, c.last_step], "ms": round(ms, 4), "host_ms": round(c.host_ms, 4), **extra,
            **({"loader_ready_min": c.ready_min} if c.ready_min is not None else {}),
            **({"loader_wait_ms": round(c.loader_wait_ms, 4)} if c.loader_wait_ms is not None else {})}


def _mean(chunks: list[Chunk], ms: list[float]) -> float:
    """The mean step time over ``chunks`` (their step times ``ms``), weighted by their steps."""
    return sum(m * c.steps for m, c in zip(ms, chunks)) / sum(c.steps for c in chunks)


def _holds(ms: list[float], k: int = MIN_CHUNKS, pct: float = SEM_PCT) -> bool:
    """Whether at least ``k`` chunk step times ``ms`` hold their mean within ``pct`` % (its standard error)."""
    if len(ms) < k:
        return False
    mean, sem = _stats(ms)
    return mean > 0 and 100.0 * sem <= pct * mean
