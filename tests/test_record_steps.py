"""The unprofiled window measures the steady state, and one step is one optimizer step (#25).

- The steady rule (gpuprof/record/window.py) on SYNTHETIC chunk times: warm-up, a draining
  prefetch queue, a loop its workers keep up with, a loop that never settles.
- End to end on CPU torch (host clock): a program whose DataLoader workers fill a deep queue
  while its first step is slow, then produce slower than it consumes, so its first ~40 steps run
  from the queue at 40 ms and its steady state is 50 ms. The old fixed window (10 steps after 5)
  read the fast phase; the recorder must land within 5 % of the program's own clock.
- Step counting with wrappers: a Lightning-like wrapper whose step is hooked too (as after a
  ``load_state_dict`` on it, which patches its class), an Accelerate-like wrapper with gradient
  accumulation, and ``gpuprof.step()`` called beside ``optimizer.step()``: each training step is
  counted once. The real frameworks are checked in test_record_frameworks.py.
"""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuprof.record.window import (AFTER_BUDGET_CHUNKS, BUDGET_CHUNKS, CHUNK_MIN_S, CHUNK_STEPS, MIN_CHUNKS, Window,
                                   chunk_steps, mser, whole_cycles)
from tests.test_record import FAST, manifest, record, write


def run_window(ms: list[float], ready: list[int | None] | None = None, start: int = 6,
               workers: int | None = None) -> tuple[Window, int]:
    """Feed a Window per-step times (host clock, a fake one) until it decides; the deciding step
    (-1: ``ms`` ran out first)."""
    now = [0.0]
    w = Window(start, None, clock=lambda: now[0])
    for i, dt in enumerate(ms):
        step = start + i
        now[0] += dt / 1000.0
        w.sample(ready[i] if ready else None, workers)
        if w.due(step):
            w.mark(step, None)
        if w.decide():
            return w, step
    w.stop("the program ended")
    return w, -1


def test_warm_up_chunks_are_left_out() -> None:
    ms = [30.0] * 10 + [22.0] * 10 + [20.0] * 200
    w, at = run_window(ms)
    got, info = w.result()
    assert info["converged"] is True and got == pytest.approx(20.0)
    assert info["window"]["first_step"] > 6 + 20 and at == info["window"]["last_step"]
    assert info["steps"] >= MIN_CHUNKS * CHUNK_STEPS and info["spread_pct"] == 0.0
    assert [c["ms"] for c in info["chunks"]][:2] == [pytest.approx(30.0, rel=0.1), pytest.approx(22.0, rel=0.1)]


def test_the_steady_figure_is_the_mean_of_a_noisy_loop_not_a_quiet_patch() -> None:
    """SYNTHETIC chunks of a real loop's kind (a framework's step varies 5-20 % from chunk to
    chunk): three chunks that happen to agree late in the run are no measure of it; the figure is
    the mean of the steady phase, whose standard error is within the rule's bound or the budget
    ends it."""
    import random

    rng = random.Random(7)
    chunk = [20.0 + rng.choice([-3.0, -1.0, 0.0, 1.0, 3.0]) for _ in range(40)]
    chunk[14:17] = [16.5, 16.6, 16.7]  # a quiet, fast patch
    ms = [c for c in chunk for _ in range(CHUNK_STEPS)]
    w, _ = run_window(ms)
    got, info = w.result()
    timed = [c["ms"] for c in info["chunks"]]
    assert got == pytest.approx(sum(timed) / len(timed), rel=0.02)  # the loop's mean
    assert got > 18.5 and info["steps"] >= MIN_CHUNKS * CHUNK_STEPS  # not the quiet patch's 16.6
    assert info["sem_ms"] <= 0.01 * got or info["converged"] is False


def test_mser_finds_the_transient() -> None:
    assert mser([30.0, 22.0, 20.0, 20.0, 20.0, 20.0]) == 2
    assert mser([20.0, 21.0, 19.0, 20.0, 21.0, 19.0]) == 0  # noise is no transient
    assert mser([40.0, 40.0, 50.0, 50.0, 50.0, 50.0, 50.0, 50.0]) == 2


def test_a_draining_prefetch_queue_is_not_the_steady_state() -> None:
    """40 fast steps from a queue of 8 batches falling to 0, then 50 ms steps: the fast chunks
    agree perfectly, but the queue's level falls, so only the later chunks count."""
    ms = [40.0] * 40 + [50.0] * 200
    ready = [max(8 - i // 5, 0) for i in range(40)] + [0] * 200
    w, _ = run_window(ms, ready)
    got, info = w.result()
    assert info["converged"] is True and got == pytest.approx(50.0, rel=0.01)
    assert info["window"]["first_step"] >= 6 + 40
    assert [c["loader_ready_min"] for c in info["chunks"]][:4] == [6, 4, 2, 0]
    w, _ = run_window(ms)  # without the loader's level a drain looks steady while it lasts: the
    assert w.result()[0] == pytest.approx(40.0, rel=0.02)  # fast phase is taken (why the level is read)


def test_a_dip_of_the_queue_after_it_held_is_no_drain() -> None:
    """The chunks (GPU ms per step, the queue's lowest level) of two real runs on the H200
    (2026-12-03, Lightning with 4 workers, Accelerate with 2): the level rose or held from the
    first chunk, then dipped by one in the last chunk. Reading that dip as a drain put the steady
    phase after the last chunk, and the record had no figure at all."""
    from gpuprof.record.window import Chunk, steady, steady_start

    runs = {"lightning": ([16.47, 19.86, 22.71, 21.86, 21.49, 22.41, 23.96, 22.67, 23.35, 24.43],
                          [0, 1, 2, 2, 2, 1, 2, 2, 2, 1]),
            "accelerate": ([32.19, 35.25, 35.32, 34.37, 34.70, 32.92, 31.61, 31.61, 31.61, 31.64],
                           [2, 3, 2, 3, 3, 3, 3, 3, 3, 2])}
    for name, (ms, ready) in runs.items():
        chunks = [Chunk(10 * i + 7, 10 * i + 16, m, r) for i, (m, r) in enumerate(zip(ms, ready))]
        start = steady_start(chunks, ms)
        assert start <= len(ms) - MIN_CHUNKS, (name, start)
        assert steady(chunks, ms), name
    drained = [Chunk(10 * i + 7, 10 * i + 16, 40.0, r) for i, r in enumerate([6, 4, 2, 0, 0, 1, 0, 0])]
    assert steady_start(drained, [40.0] * 8) == 4  # a real drain still counts: 6, 4, 2, 0, then it held
    falling = [Chunk(10 * i + 7, 10 * i + 16, 40.0, 8 - i) for i in range(5)]
    assert steady_start(falling, [40.0] * 5) == 5  # draining to the end: no steady phase, no figure


def test_a_queue_at_its_cap_then_draining_is_a_drain() -> None:
    """Synthetic chunk levels: a queue held at its cap while the first steps were slow, then
    draining, is a drain (the chunks up to its end do not count); a full queue that dips by one
    batch once, or never falls, is steady from the start."""
    from gpuprof.record.window import Chunk, steady_start

    def start(levels: list[int | None]) -> int:
        ms = [40.0] * len(levels)
        return steady_start([Chunk(10 * i + 7, 10 * i + 16, 40.0, r) for i, r in enumerate(levels)], ms)

    assert start([8, 8, 6, 3, 0, 0, 1, 0, 0, 0]) == 5
    assert start([8, 8, 8, 4, 1, 1, 1, 1]) == 5
    assert start([8, 8, 7, 8, 8, 8, 8, 8]) == 0  # one dip from a full queue: fluctuation
    assert start([8] * 8) == 0
    assert start([8, 8, 6, 3, 1]) == 5  # still draining in the last chunk: no figure
    assert start([None, None, 3, 2, 1, 1]) == 0  # no level read at first: no drain seen
    assert start([2, 2, 1, 0, 1, 2, 1, 2, 2, 1]) == 0  # refilled to the plateau's level: fluctuation
    assert start([6, 6, 5, 4, 6, 6, 5, 6, 6, 6]) == 0


def test_a_fall_after_a_plateau_in_the_last_chunk_waits_for_the_next() -> None:
    """Synthetic: flat step times after a plateau whose level falls in the last chunk only: not
    steady yet (a drain may be starting); one chunk later a second fall makes it a drain (no
    figure while it lasts), a rise back makes it fluctuation (steady)."""
    from gpuprof.record.window import Chunk, steady

    def ok(levels: list[int]) -> bool:
        return steady([Chunk(10 * i + 7, 10 * i + 16, 40.0, r) for i, r in enumerate(levels)], [40.0] * len(levels))

    assert ok([8, 8, 8, 8, 8])
    assert not ok([8, 8, 8, 8, 7])
    assert not ok([8, 8, 8, 8, 7, 5])
    assert ok([8, 8, 8, 8, 7, 8])


def test_a_loop_its_workers_keep_up_with_converges() -> None:
    """GPU-bound: the queue stays near full, its level fluctuating by the number of workers."""
    ms = [20.0] * 300
    ready = [8 - (i % 4) for i in range(300)]
    w, at = run_window(ms, ready)
    assert w.result()[1]["converged"] is True and at <= 6 + (MIN_CHUNKS + 1) * CHUNK_STEPS


def test_a_loop_that_never_settles_stops_at_the_budget() -> None:
    ms = [20.0 if (i // 10) % 2 else 30.0 for i in range(400)]
    w, at = run_window(ms)
    got, info = w.result()
    budget = BUDGET_CHUNKS * CHUNK_STEPS  # 20-30 ms steps: every chunk is the first's 10 steps
    assert info["converged"] is False and f"{BUDGET_CHUNKS} chunks ({budget} timed steps)" in info["not_converged_why"]
    assert at == 6 + budget and info["steps"] >= budget // 2
    assert info["spread_pct"] > 25 and info["stddev_ms"] > 0 and info["sem_ms"] > 0
    assert got == pytest.approx(25.0, rel=0.05)  # the loop's mean, not either level


def test_fast_steps_are_timed_in_chunks_of_fixed_duration() -> None:
    """SYNTHETIC: a 5 ms step whose host jitters (one 15 ms step in 7, a garbage collection or a
    logging step): 10-step chunks would hold one or two of them and spread by ~20 %; chunks of
    CHUNK_MIN_S hold the same share of them, so the window converges on the loop's mean."""
    ms = [15.0 if i % 7 == 3 else 5.0 for i in range(3000)]
    w, at = run_window(ms)
    got, info = w.result()
    k = chunk_steps(info["chunks"][0]["host_ms"])
    assert info["chunk_steps"] == k == math.ceil(CHUNK_MIN_S * 1000 / info["chunks"][0]["host_ms"]) > CHUNK_STEPS
    assert [c["steps"][1] - c["steps"][0] + 1 for c in info["chunks"]] == [CHUNK_STEPS] + [k] * (len(info["chunks"]) - 1)
    assert info["converged"] is True and got == pytest.approx(sum(ms[:700]) / 700, rel=0.03)
    assert chunk_steps(25.0) == CHUNK_STEPS and chunk_steps(0.0) == CHUNK_STEPS  # slow steps keep 10-step chunks


# The Lightning program's own CUDA-event clock, ms per step, steps 6-105 (REAL: the H200, 2026-12-03
# 15:05 UTC, sample_traces/programs/frameworks/lightning_resnet.py, 4 DataLoader workers, recorded
# unprofiled under the old 10-step chunks, which did not converge on it): a wait every 4th step.
LIGHTNING_4_WORKERS_MS = [
    16.5, 14.1, 18.5, 14.2, 14.2, 25.7, 23.8, 18.1, 15.1, 73.7, 23.5, 14.2, 19.7, 43.1, 23.8, 13.1, 14.0,
    43.1, 21.8, 15.6, 16.0, 52.4, 14.4, 14.6, 19.7, 65.2, 14.6, 12.8, 20.2, 62.7, 23.5, 19.4, 19.5, 24.7,
    12.8, 20.3, 12.8, 75.2, 14.5, 12.8, 12.8, 62.2, 17.8, 12.9, 15.3, 60.6, 16.0, 12.8, 13.4, 58.7, 20.9,
    12.8, 18.9, 59.6, 15.6, 12.8, 15.0, 40.8, 18.9, 21.1, 13.9, 45.0, 16.4, 24.7, 21.7, 26.2, 21.0, 13.3,
    21.3, 28.5, 29.2, 17.1, 22.9, 30.5, 24.6, 22.9, 22.6, 22.6, 21.6, 34.7, 27.7, 24.8, 14.8, 36.6, 23.8,
    20.2, 13.8, 35.6, 19.9, 22.8, 23.9, 52.2, 22.0, 23.4, 15.0, 47.7, 30.9, 18.7, 15.2, 39.7]


def test_chunks_hold_whole_cycles_of_the_dataloaders_workers() -> None:
    """A loop its 4 workers do not keep up with waits every 4th step: 10-step chunks hold two or
    three waits and swing from chunk to chunk (the real clock above: 22.4, 30.0, 22.5, 29.1 ms;
    not converged by step 105, nine chunks), 12-step chunks hold three each and converge on the same steps'
    mean. Synthetic: an exact 4-step cycle never converges in 10-step chunks, at once in 12."""
    assert [whole_cycles(10, k) for k in (None, 1, 3, 4, 8, 16, 20, 21, 32)] == [10, 10, 12, 12, 16, 16, 20, 10, 10]
    assert chunk_steps(25.0, 4) == 12 and chunk_steps(5.0, 4) == 40 and chunk_steps(7.0, 3) == 30
    ms = LIGHTNING_4_WORKERS_MS
    w, at = run_window(ms)
    assert at == -1 and w.result()[1]["converged"] is False
    w, at = run_window(ms, workers=4)
    got, info = w.result()
    assert info["converged"] is True and at < 6 + len(ms) - 1 and info["loader_workers"] == 4
    assert info["first_chunk_steps"] == info["chunk_steps"] == 12
    assert all((c["steps"][1] - c["steps"][0] + 1) % 4 == 0 for c in info["chunks"])
    first, last = info["window"]["first_step"], info["window"]["last_step"]
    assert got == pytest.approx(sum(ms[first - 6:last - 5]) / (last - first + 1), rel=1e-3)

    cycle = [14.0, 15.0, 14.0, 60.0] * 60  # the real loop's shape, exactly periodic: mean 25.75 ms
    w, at = run_window(cycle)
    assert w.result()[1]["converged"] is False and w.result()[1]["spread_pct"] > 15  # 23.5, 28.0, 23.5, ...
    w, at = run_window(cycle, workers=4)
    got, info = w.result()
    assert info["converged"] is True and info["spread_pct"] == 0.0 and got == pytest.approx(25.75)
    assert at == 6 + 12 * MIN_CHUNKS


def run_both(ms: list[float], prof: int = 4, skip_after: int = 2) -> tuple[Window, Window | None]:
    """:func:`run_window`, then ``prof`` profiled steps, then the steady rule's timing after the
    profiler (as gpuprof.record.hook drives it) over the rest of ``ms``: (before, after)."""
    start = 6
    w, at = run_window(ms, start=start)
    if at < 0:
        return w, None
    stopped, now = at + prof, [0.0]  # (the after window reads only differences of its own clock)
    a = Window(stopped + skip_after + 1, None, clock=lambda: now[0], every=w.chunk_steps)
    for step in range(stopped + 1, start + len(ms)):
        now[0] += ms[step - start] / 1000.0
        if a.due(step):
            a.mark(step, None)
    a.stop("the program ended")
    return w, a


def test_a_loop_too_noisy_for_the_budget_is_timed_on_after_the_profiler() -> None:
    """Synthetic: chunk means that swing 18 <-> 25 ms (a loader-bound loop's, the shape of the
    Lightning ResNet-18's on the H200: 30 % spread, 3.4 % standard error after the 10-chunk
    budget) do not converge before the profiler; the timing goes on after it, in chunks of the
    same length until its budget is spent, and the two together converge, their figure the mean of both."""
    swing = [18.0] * 10 + [22.0] * 10 + [25.0] * 10 + [21.0] * 10  # 40-step period, mean 21.5
    ms = swing * 20
    w, a = run_both(ms)
    assert a is not None and w.converged is False and len(w.chunks) == BUDGET_CHUNKS
    got, info = w.result(after=a)
    assert info["converged"] is True and "not_converged_why" not in info
    (b0, b1), (a0, a1) = info["windows"]
    assert info["before_profiling"]["converged"] is False and info["before_profiling"]["steps"] == b1 - b0 + 1
    end = w.chunks[-1].last_step  # then 4 profiled steps, 2 exporting, one boundary step, then timed again
    assert (b0, b1) == (info["window"]["first_step"], end) and a0 == end + 4 + 2 + 2 and a1 == info["window"]["last_step"]
    assert all(c["steps"][1] - c["steps"][0] + 1 == w.chunk_steps for c in info["chunks"] if c.get("after_profiling"))
    # timed to its budget, not only until both held their mean: the run's drift counts too
    assert len(a.chunks) == AFTER_BUDGET_CHUNKS and a1 - a0 + 1 == AFTER_BUDGET_CHUNKS * w.chunk_steps
    # the figure is the plain mean of the steps in the two windows
    steps = [ms[s - 6] for lo, hi in info["windows"] for s in range(lo, hi + 1)]
    assert got == pytest.approx(sum(steps) / len(steps)) and got == pytest.approx(21.5, rel=0.02)
    assert info["steps"] == len(steps) and a.closed and a.why.startswith(f"the budget of {AFTER_BUDGET_CHUNKS} chunks")


def test_a_program_whose_speed_moves_is_timed_before_and_after_the_profiler() -> None:
    """Synthetic: a loop at 37 ms that settles at 42 ms after its first sixty steps (the
    Accelerate program's own clock on the H200: 37.3 over steps 7-56, 42.4 over 60-260) converges
    before the profiler on the fast steps; the steps after it pull the figure toward the rest of
    the run, and the record keeps the figure before."""
    ms = [37.0] * 60 + [42.0] * 400
    w, a = run_both(ms)
    assert a is not None and w.converged is True
    before, _ = w.result()
    got, info = w.result(after=a)
    assert before == pytest.approx(37.0) and info["before_profiling"]["step_ms"] == pytest.approx(37.0)
    assert got > 39.0 and info["steps"] > info["before_profiling"]["steps"]
    # a program that ends first keeps what was timed, and says the rule's end was not reached
    w, a = run_both(ms[:80])
    got, info = w.result(after=a)
    assert info["converged"] is False and info["not_converged_why"] == "the program ended"
    assert 37.0 < got < 42.0 and len(info["windows"]) == 2


def test_the_steps_after_the_profiler_count_only_where_it_left_nothing_behind(tmp_path: Path) -> None:
    """gpuprof.record.hook.Recorder.pools: the steady rule, the same clock, CUPTI torn down at the
    profiler's stop (or no CUDA). Synthetic windows."""
    from gpuprof.record.hook import Recorder

    r = Recorder(tmp_path, (5, -1, 1, 1, 2, 1), False, False)
    assert not r.pools()  # nothing timed after
    r.after = Window(20, None, every=10)
    assert r.pools()  # host clock: no CUPTI to leave behind
    r.window.cuda = r.after.cuda = True
    for value, pools in (("1", True), ("0", False), (None, False)):
        r.teardown_cupti = value
        assert r.pools() is pools, value
    r.teardown_cupti = "1"
    r.after.failed = "CUDA events failed"
    assert not r.pools()
    fixed = Recorder(tmp_path, (5, 3, 1, 1, 2, 1), False, False)
    fixed.after, fixed.teardown_cupti = Window(20, 20), "1"
    assert not fixed.pools()  # --timed-steps N: the window is those steps, the check apart


def test_a_fixed_window_is_the_n_steps_after_the_skipped_ones() -> None:
    now = [0.0]
    w = Window(3, 4, clock=lambda: now[0])
    marks = []
    for step in range(1, 12):
        now[0] += 0.01
        if w.due(step):
            w.mark(step, None)
            marks.append(step)
    assert marks == [3, 7] and w.decide()
    got, info = w.result()
    assert got == pytest.approx(10.0) and info["rule"] == "fixed" and info["window"] == {"first_step": 4,
                                                                                         "last_step": 7}


# --- end to end: the prefetched queue of a real DataLoader ---------------------------------------

PREFETCH = """
import json, sys, time, torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):  # each batch takes a worker 100 ms: 2 workers give one every 50 ms
    def __len__(self):
        return 10_000
    def __getitem__(self, i):
        time.sleep(0.1)
        return torch.randn(8)

if __name__ == "__main__":
    out, steps = sys.argv[1], int(sys.argv[2])
    dl = DataLoader(Slow(), batch_size=None, num_workers=2, prefetch_factor=4, multiprocessing_context="fork")
    m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)
    ends, waits = [], []
    it = iter(dl)
    for i in range(10_000):
        t0 = time.perf_counter()
        x = next(it)
        waits.append(time.perf_counter() - t0)
        if i == 0:
            time.sleep(1.0)  # a slow first step (start-up): the workers fill the queue (8 batches)
        m(x).sum().backward(); opt.step(); opt.zero_grad()
        time.sleep(0.04)  # the step's own work: 40 ms, faster than the workers produce
        ends.append(time.perf_counter())
        if i + 1 == steps:
            break
    own = (ends[-1] - ends[109]) * 1000 / (len(ends) - 110)  # steps 111-150: long after the queue drained
    wait = sum(waits[110:len(ends)]) * 1000 / (len(ends) - 110)  # the loop's own wait for batches there
    json.dump({"step_ms": own, "wait_ms": wait, "first_steps_ms": (ends[15] - ends[5]) * 100}, open(out, "w"))
"""


def test_the_window_waits_for_the_prefetched_queue_to_drain(tmp_path: Path) -> None:
    prog = write(tmp_path, "prefetch.py", PREFETCH)
    r = record(tmp_path, "run", sys.executable, str(prog), str(tmp_path / "own.json"), "150", opts=[])
    assert r.returncode == 0, r.stderr[-3000:]
    own = json.loads((tmp_path / "own.json").read_text())
    m = manifest(tmp_path, "run")
    timing = m["ranks"][0]["unprofiled_timing"]
    got = m["unprofiled_step_ms"]
    # the case: the steps the old fixed window timed (6-15) ran from the queue, 10-20 % fast
    assert own["first_steps_ms"] < 0.95 * own["step_ms"], own
    # (on a loaded CPU the host clock's chunks can spread past the rule's 1 % standard error
    # before the program ends: converged or not, the figure is the steady phase's mean)
    assert timing["rule"] == "steady" and timing["converged"] in (True, False), timing
    assert abs(got - own["step_ms"]) <= 0.05 * own["step_ms"], (got, own, timing)
    assert timing["window"]["first_step"] > 15 and "loader_ready_min" in timing["chunks"][0]
    assert timing["loader_workers"] == 2 and timing["first_chunk_steps"] % 2 == timing["chunk_steps"] % 2 == 0
    assert m["profiler"]["timing_rule"] == "steady" and m["traces"]
    # the loop waits ~10 ms a step for its batches once the queue is dry (workers: one per 50 ms,
    # the step's own work 40 ms): the window says so, each chunk and in all (#24, gpuprof.steptime)
    assert own["wait_ms"] > 5.0, own
    assert abs(timing["loader_wait_ms"] - own["wait_ms"]) <= 0.3 * own["wait_ms"], (timing, own)
    assert m["unprofiled_input_wait_ms"] == pytest.approx(timing["loader_wait_ms"])
    assert all("loader_wait_ms" in c for c in timing["chunks"])


def test_a_loop_without_a_dataloader_records_no_input_wait(tmp_path: Path) -> None:
    prog = write(tmp_path, "plain.py", """
import sys, torch
m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.01)
for i in range(40):
    m(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
""")
    r = record(tmp_path, "run", sys.executable, str(prog), opts=["--timed-steps", "10"])
    assert r.returncode == 0, r.stderr[-3000:]
    m = manifest(tmp_path, "run")
    assert m["unprofiled_step_ms"] and "unprofiled_input_wait_ms" not in m
    assert "loader_wait_ms" not in m["ranks"][0]["unprofiled_timing"]


# --- step counting -----------------------------------------------------------------------------

COUNT = """
import json, sys, torch
import gpuprof

class LightningLike:
    \"\"\"As Lightning's LightningOptimizer: its class subclasses the optimizer's, it shares its
    __dict__, and its step(closure) calls the inner optimizer's step with the closure, which
    runs forward and backward inside it.\"\"\"
    def __init__(self, opt):
        self.__dict__ = {k: v for k, v in opt.__dict__.items() if k not in ("step", "__del__")}
        self._optimizer = opt
        self.__class__ = type("Lightning" + opt.__class__.__name__, (self.__class__, opt.__class__), {})
    def step(self, closure=None):
        return self._optimizer.step(closure)

class AcceleratedLike(torch.optim.Optimizer):
    \"\"\"As Accelerate's AcceleratedOptimizer, made a hooked optimizer itself: its step steps the
    inner one only at gradient-accumulation boundaries.\"\"\"
    def __init__(self, opt, every):
        super().__init__([torch.zeros(1, requires_grad=True)], {})
        self.optimizer, self.every, self.calls = opt, every, 0
    def step(self, closure=None):
        self.calls += 1
        if self.calls % self.every == 0:
            self.optimizer.step(closure)

mode, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
m = torch.nn.Linear(32, 4)
inner = torch.optim.SGD(m.parameters(), lr=0.01)
loss = lambda: m(torch.randn(8, 32)).sum()
updates = 0
if mode == "lightning":
    opt = LightningLike(inner)
    opt.load_state_dict(opt.state_dict())  # as a resumed run does: this hooks the wrapper's step too
    for i in range(steps):
        def closure():
            opt.zero_grad(); l = loss(); l.backward(); return l
        opt.step(closure); updates += 1
elif mode == "accumulate":
    opt = AcceleratedLike(inner, 2)
    for i in range(2 * steps):  # two micro-batches per optimizer step; step() called after each
        loss().backward(); opt.step()
        if (i + 1) % 2 == 0:
            inner.zero_grad(); updates += 1
elif mode == "manual":
    for i in range(steps):
        loss().backward(); inner.step(); inner.zero_grad(); gpuprof.step(); updates += 1
json.dump({"updates": updates}, open(out, "w"))
"""


def profiler_steps(trace: Path) -> list[str]:
    with gzip.open(trace) as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return sorted({e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})


@pytest.mark.parametrize("mode", ["lightning", "accumulate", "manual"])
def test_one_step_per_optimizer_step(tmp_path: Path, mode: str) -> None:
    prog = write(tmp_path, "count.py", COUNT)
    r = record(tmp_path, "run", sys.executable, str(prog), mode, "20", str(tmp_path / "own.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    updates = json.loads((tmp_path / "own.json").read_text())["updates"]
    m = manifest(tmp_path, "run")
    (rank,) = m["ranks"]
    assert updates == 20 and rank["steps_seen"] == updates, rank
    assert rank["profiled_steps"] == 4 and rank["profiler_started_at_step"] == 7  # FAST: skip 2, timed 3
    assert profiler_steps(tmp_path / "run" / rank["trace"]) == ["ProfilerStep#2", "ProfilerStep#3"]  # 1,1,2
    if mode == "manual":
        assert rank["step_source"] == "gpuprof.step()"
    else:
        assert rank["optimizer"] == "SGD" and rank["optimizer_wrappers"] == [
            "LightningSGD" if mode == "lightning" else "AcceleratedLike"]


def test_timed_steps_takes_steady_or_a_number(tmp_path: Path) -> None:
    r = record(tmp_path, "run", sys.executable, "-c", "pass", opts=["--timed-steps", "often"])
    assert r.returncode == 2 and "expected 'steady' or a number of steps" in r.stderr
    assert FAST[2:4] == ["--timed-steps", "3"]


def test_the_loader_cycle_over_several_loaders() -> None:
    """Fake iterators (only the fields the recorder reads): one loader's worker count, the lcm of
    several while it stays within twice the first chunk, else the largest count; shut-down
    iterators and unreadable ones are left out."""
    import weakref

    from gpuprof.record.hook import Recorder

    class It:
        def __init__(self, n: int, shutdown: bool = False) -> None:
            self._num_workers, self._shutdown = n, shutdown

    def cycle(*its: It) -> int | None:
        r = object.__new__(Recorder)
        r.loaders = weakref.WeakSet(its)
        return r._loader_workers()

    assert cycle() is None and cycle(It(1)) is None
    assert cycle(It(4)) == 4 and cycle(It(4), It(2)) == 4 and cycle(It(4), It(6)) == 12
    assert cycle(It(8), It(6)) == 8  # lcm 24 > 2 * CHUNK_STEPS: the largest loader's
    assert cycle(It(4), It(6, shutdown=True)) == 4

    class Broken:
        @property
        def _shutdown(self) -> bool:
            raise RuntimeError("torch changed")

    assert cycle(It(4), Broken()) is None  # type: ignore[arg-type]
