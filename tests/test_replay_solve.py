"""The replay's rounds in C (gpuprof/replay/native/_solve.c) give the numpy loop's floats, bit for bit,
and each fix's shared transformation inputs (:class:`gpuprof.replay.fixes.FixMemo`) change no
graph a fix gives."""

from __future__ import annotations

import sys
from dataclasses import fields

import numpy as np
import pytest

from gpuprof.replay import build, deflate, host_only
from gpuprof.replay import transforms as tf
from gpuprof.replay.fixes import host_free
from gpuprof.replay.graph import Graph
from gpuprof.trace.load import load_trace
from tests.conftest import SAMPLES

simulate = sys.modules["gpuprof.replay.simulate"]

needs_native = pytest.mark.skipif(not simulate.NATIVE, reason="gpuprof.replay.native._solve is not compiled")


def _changed(g: Graph) -> list[Graph]:
    """Graphs the unchanged times do not settle: the ones a fix is priced on (every host span
    changed, syncs dropped, kernels faster, the host taken out)."""
    every = np.ones(g.n_host, dtype=bool)
    waits = g.h_wait >= 0
    return [deflate(g, bracket_cost_us_of(g)), tf.shrink_host(g, every, 0.5), tf.drop_waits(g, waits),
            tf.scale_activities(g, np.ones(g.n_acts, dtype=bool), 0.4), host_free(g), host_only(g)]


def bracket_cost_us_of(g: Graph) -> float:
    busy = np.maximum(g.h_gap, 0.0) + g.h_dur
    return float(busy.sum() / max(float(g.h_events.sum()), 1.0))


def _same(a: object, b: object) -> None:
    for f in ("h_start", "h_end", "a_start", "a_end", "passes"):
        x, y = getattr(a, f), getattr(b, f)
        if isinstance(x, np.ndarray):
            assert x.tobytes() == y.tobytes(), f  # bit for bit, NaN and signed zeros included
        else:
            assert x == y, f


@needs_native
@pytest.mark.parametrize("name", ["gpt_host_sync", "gpt_bf16", "tiny_eager", "vision_pageable", "gpt_sync_forloop",
                                  "two_sync_forloop"])
def test_native_rounds_give_the_numpy_floats(name: str) -> None:
    path = next(p for p in (SAMPLES / f"{name}.json.gz", SAMPLES / f"{name}.json") if p.exists())
    g = build([load_trace(path)])
    solved = 0
    for x in _changed(g):
        a, b = simulate._in_order(x, native=False), simulate._in_order(x, native=True)
        assert (a is None) == (b is None)
        if a is not None:
            _same(a, b)
            solved += 1
    assert solved >= 4


@needs_native
def test_native_rounds_on_several_host_chains() -> None:
    """Two traces side by side on one clock (two host chains, not coupled), as ``build`` makes them."""
    a, b = (load_trace(SAMPLES / n) for n in ("gpt_host_sync.json.gz", "ddp_slow_rank/rank1.json.gz"))
    g = build([a, b])
    assert int(g.h_first.sum()) == 2
    for x in _changed(g):
        got, want = simulate._in_order(x, native=True), simulate._in_order(x, native=False)
        assert (got is None) == (want is None)
        if got is not None:
            _same(got, want)


@needs_native
def test_native_rounds_say_when_no_chain_can_go_on() -> None:
    path = SAMPLES / "gpt_host_sync.json.gz"
    g = build([load_trace(path)])
    # a call waits for the activity its own successor launches: a cycle, which neither solver solves
    first_wait = int(np.flatnonzero(g.h_wait >= 0)[0])
    later = np.flatnonzero(g.a_launch > first_wait)[0]
    bad = tf.drop_waits(g, np.zeros(g.n_host, dtype=bool))
    h_wait = bad.h_wait.copy()
    h_wait[first_wait] = later
    from dataclasses import replace
    bad = replace(bad, h_wait=h_wait)
    assert simulate._in_order(bad, native=False) is None
    assert simulate._in_order(bad, native=True) is None


@needs_native
@pytest.mark.parametrize("name", ["gpt_host_sync", "gpt_bf16", "tiny_eager", "vision_pageable", "two_sync_forloop"])
def test_native_traced_passes_give_the_numpy_floats(name: str) -> None:
    """The traced-times passes in C (``_solve.passes``, mode 0) give up where the numpy passes do (a
    changed graph) and give their floats and pass count bit for bit where they settle (the
    unchanged graph)."""
    path = next(p for p in (SAMPLES / f"{name}.json.gz", SAMPLES / f"{name}.json") if p.exists())
    g = build([load_trace(path)])
    settled = 0
    for x in [g, *_changed(g), host_only(host_free(g))]:
        for passes in (1, 4):
            a, b = simulate._as_traced(x, passes, native=False), simulate._as_traced(x, passes, native=True)
            assert (a is None) == (b is None)
            if a is not None:
                _same(a, b)
                settled += 1
    assert settled >= 2


@needs_native
@pytest.mark.parametrize("name", ["ddp_slow_rank", "ddp_manual_allreduce"])
def test_native_windowed_passes_give_the_numpy_floats(name: str) -> None:
    """The windowed passes in C (``_solve.passes``, mode 1) on a job whose collectives couple its
    ranks give the numpy passes' floats and pass count bit for bit, with small windows too (many
    stretches that continue their chain)."""
    from gpuprof.replay.job import build_job, overlap, rebalance

    g = build_job([load_trace(p) for p in sorted((SAMPLES / name).glob("rank*.json.gz"))])
    assert (g.a_coll >= 0).any()
    for x in [g, rebalance(g), overlap(g, g.a_coll >= 0), *_changed(g)]:
        for window in (simulate.WINDOW, 64):
            _same(simulate._by_passes(x, window, native=False), simulate._by_passes(x, window, native=True))


def test_fix_memo_changes_no_graph() -> None:
    """Each fix applied with its memo filled by an earlier call (on the other bound's graph, as a
    plan does) gives the graph applied afresh, array for array."""
    from gpuprof.analyzers import select
    from gpuprof.claims import claimed
    from gpuprof.parts import part_of
    from gpuprof.rank import RankView, result_of
    from gpuprof.replay.fixes import FixMemo, apply, plan
    from gpuprof.specs import resolve

    checked = set()
    for name in ("gpt_host_sync", "tiny_eager", "vision_pageable", "resnet50_bf16_nchw", "gpt_no_caching_allocator"):
        t = load_trace(SAMPLES / f"{name}.json.gz")
        spec = resolve(t.meta.device_properties)
        r = result_of(t, spec)
        part = part_of(r)
        view = RankView(r, spec)
        active, _ = select((part,), spec)
        claims = claimed([c for a in active if a.run is not None for c in a.run(view)], part.n_steps)
        p = plan(view, claims, None)
        assert p is not None
        other = p.free_graph if p.free_graph is not None else host_free(p.graph)
        for i, units in p.units.items():
            memo = FixMemo()
            apply(other, view, p.categories[i], units, p.regroups.get(i), memo)
            a = apply(p.graph, view, p.categories[i], units, p.regroups.get(i), memo)
            b = apply(p.graph, view, p.categories[i], units, p.regroups.get(i))
            for f in fields(Graph):
                x, y = getattr(a, f.name), getattr(b, f.name)
                if isinstance(x, np.ndarray):
                    assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), (name, i, f.name)
                else:
                    assert x == y, (name, i, f.name)
            checked.add(p.categories[i])
    assert {"compile", "host_sync", "elementwise_fusion", "launch_overhead"} <= checked, checked
