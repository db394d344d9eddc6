"""The host model of the replay (gpuprof.replay.host_bounds, host_speed) against the host measured
without the profiler region by region (sample_traces/regions: forward, backward, the syncs, the
optimizer of real H200 processes, unprofiled and profiled in the same process), and its unit
behaviour on a synthetic trace built here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks import host_regions
from gpuprof.hostcost import bracket_cost_us
from gpuprof.replay import build, calibrate, deflate, host_bounds, host_speed, run, steady_ms
from gpuprof.jobs import load_trace_cached
from gpuprof.replay.transforms import shrink_host, shrink_tail
from gpuprof.trace.load import load_trace
from tests.conftest import SAMPLES, TraceBuilder


@pytest.fixture(scope="module")
def rows() -> list[dict[str, object]]:
    if not host_regions.kept():
        pytest.skip("sample_traces/regions has no kept traces")
    return host_regions.evaluate()


def test_region_mapping_reads_the_profiled_regions(rows: list[dict[str, object]]) -> None:
    """The traced replay's regions are the profiled regions the program measured (the check on the
    mapping of regions onto host calls that the model comparison divides out)."""
    e = np.abs(host_regions.errors(rows, "traced"))  # type: ignore[arg-type]
    assert len(e) >= 15 and float(np.median(e)) < 0.05


def test_host_model_shrinks_each_region_as_measured(rows: list[dict[str, object]]) -> None:
    """Calibrated to the same unprofiled step, the host model takes the profiler out of each region
    of a host-bound step in about the measured proportion: no region off by more than a third,
    and closer on average than one cost per recorded event, which put the whole slowdown on
    event-dense work (two_sync_forloop: backward 44 % too fast, the norm loop 65 % too slow)."""
    model = np.abs(host_regions.errors(rows, "model"))  # type: ignore[arg-type]
    per_event = np.abs(host_regions.errors(rows, "per_event"))  # type: ignore[arg-type]
    assert len(model) == len(per_event) >= 15
    assert model.mean() < 0.75 * per_event.mean(), (model.mean(), per_event.mean())
    assert model.max() <= 0.35, model.max()
    for r in rows:  # every model replays the host-bound unprofiled step it was calibrated to
        if r["model"] != "traced" and host_regions.host_bound(str(r["stem"])):
            assert r["step_ms"] == pytest.approx(r["real_step_ms"], rel=0.01)


def test_host_speed_scales_host_spans_not_waits(tmp_path: Path) -> None:
    """Synthetic trace (built here): a host speed factor scales every gap, call and waiting call's
    return, and leaves the GPU and which calls wait alone."""
    b = TraceBuilder()
    t, gpu_free = 10.0, 0.0
    for i in range(10):
        start = max(t + 5.0, gpu_free + 1.0)
        b.launch(f"k{i}", t, start, 40.0, None)
        gpu_free = start + 40.0
        t += 3.0 + 8.0
    end = max(t + 4.0, gpu_free + 2.0)  # a sync that waits for the last kernel, 2 µs past its end
    b._x("cuda_runtime", "cudaStreamSynchronize", t, end - t, 10, 1, {"correlation": 90_000})
    b.annotation("ProfilerStep#1", 0.0, end + 10.0)
    g = build([load_trace(b.write(tmp_path / "synthetic_host_speed.json"))])
    assert (g.h_wait >= 0).any() and (g.h_tail > 0).any()
    h = host_speed(g, 0.5)
    assert np.allclose(h.h_gap, np.where(g.h_gap > 0, 0.5 * g.h_gap, g.h_gap))
    assert np.allclose(h.h_dur, 0.5 * g.h_dur) and np.allclose(h.h_tail, np.where(g.h_tail > 0, 0.5 * g.h_tail, g.h_tail))
    assert np.array_equal(h.a_dur, g.a_dur) and np.array_equal(h.h_wait, g.h_wait)
    assert host_speed(g, 1.0) is g


def test_host_speed_leaves_the_drivers_allocation_work_alone(tmp_path: Path) -> None:
    """Synthetic trace (built here): a step that frees and allocates device memory between its
    launches (what ``empty_cache()`` every step leaves). The speed factor slows the gaps and the
    launches, but a ``cudaMalloc``'s or ``cudaFree``'s own time (the driver's mapping and
    unmapping, and a free's return after its device sync) stays as traced: the profiler does not
    slow the driver (docs/replay.md, "Allocation calls and the speed factor")."""
    b = TraceBuilder()
    t, gpu_free = 10.0, 0.0
    for i in range(6):
        start = max(t + 5.0, gpu_free + 1.0)
        b.launch(f"k{i}", t, start, 40.0, None)
        gpu_free = start + 40.0
        t += 3.0 + 4.0
        b._x("cuda_runtime", "cudaMalloc", t, 150.0, 10, 1, {"correlation": 80_000 + i})
        t += 150.0 + 4.0
    end = max(t + 300.0, gpu_free + 200.0)  # a cudaFree past the last kernel
    b._x("cuda_runtime", "cudaFree", t, end - t, 10, 1, {"correlation": 90_000})
    b.annotation("ProfilerStep#1", 0.0, end + 10.0)
    g = build([load_trace(b.write(tmp_path / "synthetic_alloc_speed.json"))])
    names = np.asarray(g.h_name, dtype=str)
    driver = np.isin(names, ["cudaMalloc", "cudaFree"])
    assert np.array_equal(g.h_driver, driver) and driver.sum() == 7 and (~driver).sum() == 6
    h = host_speed(g, 0.5)
    assert np.allclose(h.h_dur[driver], g.h_dur[driver]) and np.allclose(h.h_dur[~driver], 0.5 * g.h_dur[~driver])
    assert np.allclose(h.h_gap, np.where(g.h_gap > 0, 0.5 * g.h_gap, g.h_gap))
    assert np.allclose(h.h_tail[driver], g.h_tail[driver])
    # the faster host shortens the step, by less than a host sped up whole would
    whole = shrink_tail(shrink_host(g, np.ones(g.n_host, dtype=bool), 0.5), np.ones(g.n_host, dtype=bool), 0.5)
    assert steady_ms(whole) < steady_ms(h) < steady_ms(g)


def test_bracket_that_overshoots_falls_back_to_one_cost_per_event() -> None:
    """Where the bracket estimate alone would replay faster than the real step (here: ten times
    the trace's own), the host is the smallest cost per event that replays it, with no speed
    factor: the model never makes the host faster than the evidence asks."""
    t = load_trace_cached(SAMPLES / "gpt_bf16.json.gz", 0, True)
    g = build([t])
    from benchmarks.pairs import step_ms

    real = step_ms("gpt_bf16")
    hb = host_bounds(g, real, 10 * bracket_cost_us(t))
    assert hb.identified and hb.speed == 1.0
    assert hb.floor_us == pytest.approx(calibrate(g, real), rel=0.02)
    assert steady_ms(hb.apply(g)) == pytest.approx(real, rel=0.01)


@pytest.mark.parametrize("name", ["gpt_fp32", "resnet50_fp32_nchw"])
def test_unidentified_host_keeps_its_floor(name: str) -> None:
    """GPU-bound with the real step, and bare: no speed is identified; the floor is per event as
    before (docs/replay.md, "The host floor")."""
    from benchmarks.pairs import step_ms

    t = load_trace_cached(SAMPLES / f"{name}.json.gz", 0, True)
    g, br = build([t]), bracket_cost_us(t)
    for real in (step_ms(name), None):
        hb = host_bounds(g, real, br)
        assert not hb.identified and hb.speed == 1.0 and hb.floor_us >= br
        assert run(hb.apply(g)).period_ms == pytest.approx(run(deflate(g, hb.floor_us)).period_ms)


@pytest.mark.parametrize("name,owner", [("gpt_python_inline", "input_pipeline"), ("vision_pageable", "pageable_memcpy")])
def test_host_sync_replay_leaves_other_fixes_work_alone(name: str, owner: str) -> None:
    """host_sync's replay (its estimate now) removes the fetch, not the work around it: real H200
    traces whose one sync per step is a batch's blocking ``.to()``. Before, the replayed fix took
    the 20 ms of tokenising before it (gpt_python_inline: host_sync first at 20.7 ms) and the
    77 MB host-to-device copy itself (vision_pageable: 10.4 ms, above pageable_memcpy). Since
    issue #24 the sync inside a pageable batch's own ``.to()`` is the copy's (pinned memory with
    ``non_blocking=True`` removes it): host_sync no longer claims it at all."""
    import gpuprof
    from benchmarks.pairs import step_ms

    a = gpuprof.analyze(SAMPLES / f"{name}.json.gz", step_ms=step_ms(name), cache=False)
    sync = next((f for f in a.findings if f.category == "host_sync"), None)
    other = next(f for f in a.findings if f.category == owner)
    assert a.findings[0].category == owner
    if sync is not None:
        assert sync.evidence.get("estimate") == "replay"
        assert sync.estimated_savings_ms < 0.25 * other.estimated_savings_ms
