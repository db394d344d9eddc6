"""Findings priced by replay (gpuprof.replay.fixes), the combined projection and Analysis.what_if,
on real H200 sample traces."""

from __future__ import annotations

import numpy as np
import pytest

import gpuprof
from benchmarks.pairs import step_ms, step_noise_ms
from gpuprof.hostcost import bracket_cost_us
from gpuprof import pricing
from gpuprof.replay import build, fixes, host_bounds, run, steady_ms
from gpuprof.jobs import load_trace_cached
from tests.conftest import SAMPLES

#: structurally different defects: syncs + launches + fusion; allocator off; a checkpoint stall
CASES = ("gpt_host_sync", "gpt_no_caching_allocator", "gpt_checkpoint_every3")


@pytest.fixture(scope="module", params=CASES)
def analysed(request: pytest.FixtureRequest) -> tuple[str, gpuprof.Analysis]:
    name = str(request.param)
    return name, gpuprof.analyze(SAMPLES / f"{name}.json.gz", step_ms=step_ms(name), cache=False)


def test_what_if_nothing_is_the_unmodified_replay(analysed: tuple[str, gpuprof.Analysis]) -> None:
    name, a = analysed
    t = load_trace_cached(SAMPLES / f"{name}.json.gz", 0, False)
    g = build([t])
    hb = host_bounds(g, step_ms(name), bracket_cost_us(t))
    assert hb.identified  # host-bound defects: the real step measures the host
    base = run(hb.apply(g))
    unchanged = steady_ms(hb.apply(g))
    w = a.what_if([])
    assert w["step_time_ms"] == pytest.approx(unchanged, rel=1e-9)
    assert w["before_ms"] == pytest.approx(unchanged, rel=1e-9)
    assert w["applied"] == []
    # by class: the classes and idle fill the replayed step windows, and the GPU busy time is the
    # traced one (the host was deflated, the kernels were not)
    by = w["by_class_ms"]
    assert sum(by.values()) == pytest.approx(base.step_time_ms, rel=1e-6)
    assert sum(v for k, v in by.items() if k != "idle") == pytest.approx(a.summary["gpu_kernel_time_ms"], rel=0.02)


def test_what_if_of_the_projected_fixes_is_the_projection(analysed: tuple[str, gpuprof.Analysis]) -> None:
    _, a = analysed
    s = a.summary
    ids = s["projected_findings"]
    assert ids, "a defect trace has high/medium-confidence fixes to project"
    assert all(f.confidence in ("high", "medium") for f in a.findings if f.id in ids)
    w = a.what_if(ids)
    assert w["step_time_ms"] == pytest.approx(s["projected_step_time_ms"], rel=1e-9)
    assert s["projected_step_time_ms"] < s["projected_from_ms"]
    assert a.what_if(["GP-NO-SUCH-001"])["not_applied"] == ["GP-NO-SUCH-001"]


def test_each_finding_carries_its_replay(analysed: tuple[str, gpuprof.Analysis]) -> None:
    _, a = analysed
    top = a.findings[0]
    ev = top.evidence
    assert ev["replay_before_ms"] >= ev["replay_after_ms"]
    step = a.summary["unprofiled_step_time_ms"] or a.summary["step_time_ms"]
    for f in a.findings:
        e = f.evidence
        if e.get("estimate") == "replay":
            assert f.category in pricing.REPLAY_USED
            saved = e["replay_before_ms"] - e["replay_after_ms"]
            saved *= step / e["replay_before_ms"]
            if "replay_saving_bounds_ms" in e:  # the host is not identified: the middle of its bounds
                lo, hi = sorted(e["replay_saving_bounds_ms"].values())
                assert lo - 2e-3 <= f.estimated_savings_ms <= hi + 2e-3
                saved = 0.5 * (lo + hi)
            assert f.estimated_savings_ms == pytest.approx(saved, abs=2e-3)
        elif "replay_before_ms" in e:
            assert e["replay_not_used"]
        if f.category in pricing.REPLAY_USED and f.estimated_savings_ms > 0:
            assert e.get("estimate") == "replay" or e["replay_not_used"] == pricing.NO_GRAPH_WHY


PUBLIC = SAMPLES.parents[1] / ".." / "shared" / "traces" / "public" / "tracelens"


@pytest.mark.parametrize("trace,category,share", [
    # TraceLens: "DDP resnet18 without CUDA memory pool has hipFree/hipMalloc dominated gaps"
    ("mi300__ddp_resnet18_no_pool__train_resnet18.json.gz", "allocator_churn", 0.85),
    # one 463 ms blocking hipMemcpyWithStream with the GPU idle, in a 474 ms decode step
    ("inference__sglang_decode__sglang_Qwen3-8B_decode.json.gz", "host_stall", 0.95),
])
def test_host_fixes_replay_the_stalls_of_real_rocm_traces(trace: str, category: str, share: float) -> None:
    """The stalling call's own span goes (a blocking copy, a hipFree after its device sync), not
    only the gaps around it: on these public MI300X traces the replayed fix removes the time the
    trace shows the host held there."""
    path = PUBLIC / trace
    if not path.is_file():
        pytest.skip(f"public trace not here: {path}")
    a = gpuprof.analyze(path, cache=False)
    f = next(f for f in a.findings if f.category == category)
    ev = f.evidence
    # bare traces: a host-side fix keeps its deflated gaps as the estimate and says why; the replay
    # of the fix stays in the evidence and must remove the same share
    from gpuprof.pricing import BARE_HOST_WHY

    assert ev.get("estimate") == "replay" or ev.get("replay_not_used") == BARE_HOST_WHY, ev
    assert (ev["replay_before_ms"] - ev["replay_after_ms"]) >= share * ev["replay_before_ms"]
    assert f.estimated_savings_pct >= 100 * share


def test_projection_line_in_text_report() -> None:
    a = gpuprof.analyze(SAMPLES / "gpt_host_sync.json.gz", step_ms=step_ms("gpt_host_sync"), cache=False)
    s = a.summary
    text = a.to_text()
    assert f"{s['projected_from_ms']:.1f} → {s['projected_step_time_ms']:.1f} ms per step" in text


#: Two defects at once (host syncs + a per-parameter AdamW) and their three twins, each defect fixed
#: as the finding recommends, recorded in one device session each and timed interleaved
#: (sample_traces/programs/record_interleaved.sh): (bad, host_sync fixed, optimizer fused, both).
#: gpt.py: 76 per-parameter norm ``.item()`` per step, fixed by keeping the norms on the GPU;
#: the HF Llama (hf.py): loss and grad-norm ``.item()`` (two syncs per step), kept on the GPU.
TWO_DEFECTS = {
    "gpt": ("two_sync_forloop", "two_gpunorm_forloop", "two_sync_fused", "two_gpunorm_fused"),
    "llama": ("llama_sync_forloop", "llama_gpumetrics_forloop", "llama_sync_fused", "llama_gpumetrics_fused"),
}


@pytest.fixture(scope="module", params=sorted(TWO_DEFECTS))
def two_defects(request: pytest.FixtureRequest) -> tuple[gpuprof.Analysis, tuple[str, str, str, str]]:
    names = TWO_DEFECTS[request.param]
    return gpuprof.analyze(SAMPLES / f"{names[0]}.json.gz", step_ms=step_ms(names[0]), cache=False), names


def _ids(a: gpuprof.Analysis, *cats: str) -> list[str]:
    ids = [f.id for f in a.findings if f.category in cats]
    assert len(ids) == len(cats), [f.category for f in a.findings]
    return ids


def _noise(*names: str) -> float:
    """How well the members' own unprofiled step times are known (ms: benchmarks.pairs.step_noise_ms)."""
    return sum(step_noise_ms(n) for n in names)


@pytest.mark.parametrize("category,twin", [("host_sync", 1), ("optimizer_fusion", 2)])
def test_each_of_two_fixes_projects_its_twin(two_defects: tuple[gpuprof.Analysis, tuple[str, ...]], category: str,
                                             twin: int) -> None:
    """Each defect fixed alone replays to within 15 % of the twin that has only that fix, widened
    by the two programs' timing noise (host-bound: their processes spread 20-40 %)."""
    a, names = two_defects
    got = a.what_if(_ids(a, category))["step_time_ms"]
    assert abs(got - step_ms(names[twin])) <= 0.15 * step_ms(names[twin]) + _noise(names[0], names[twin]), got


def test_two_fixes_projection_within_the_noise(two_defects: tuple[gpuprof.Analysis, tuple[str, ...]]) -> None:
    """Both defects at once: host_sync and optimizer_fusion applied together replay to within 15 %
    of the both-fixed twin's step time, widened by the two programs' timing noise."""
    a, names = two_defects
    got = a.what_if(_ids(a, "host_sync", "optimizer_fusion"))["step_time_ms"]
    assert abs(got - step_ms(names[3])) <= 0.15 * step_ms(names[3]) + _noise(names[0], names[3]), got


def test_two_fixes_projection() -> None:
    """Both defects at once: host_sync and optimizer_fusion applied together replay to within 15 %
    of the realised both-fixed step time (two_gpunorm_fused, same session): issue #13's target, on
    gpt.py, the set timed in six processes per program (s.e. 0.5-1.0 ms). The Llama set (four
    processes, s.e. 1.3-2.8 ms) is held within 15 % plus its noise above. (The first recording of
    the gpt.py set, timed in two processes only, replayed to +30 %: its bad program read 25.3 ms in
    one process and 31.7 in the other; docs/replay.md, "Two fixes at once".)"""
    a = gpuprof.analyze(SAMPLES / "two_sync_forloop.json.gz", step_ms=step_ms("two_sync_forloop"), cache=False)
    ids = _ids(a, "host_sync", "optimizer_fusion")
    assert a.what_if(ids)["step_time_ms"] == pytest.approx(step_ms("two_gpunorm_fused"), rel=0.15)


def test_two_fixes_projection_bare() -> None:
    """The same projection from the trace alone (no unprofiled step time: every fix priced between
    the host floor and no host) is within 15 % of the both-fixed twin too."""
    a = gpuprof.analyze(SAMPLES / "two_sync_forloop.json.gz", cache=False)
    got = a.what_if(_ids(a, "host_sync", "optimizer_fusion"))["step_time_ms"]
    assert got == pytest.approx(step_ms("two_gpunorm_fused"), rel=0.15)


@pytest.mark.parametrize("trace", ["resnet50_bf16_nchw.json.gz", "frameworks/run_lightning_resnet/traces/rank0.json.gz"])
def test_a_layout_transform_takes_only_its_ops_own_host_work(trace: str) -> None:
    """cuDNN's NCHW<->NHWC transposes go in channels-last, the convolution that launched them does
    not: the host work before a transpose that is its op's first call (the module's Python, the
    dispatch, cuDNN's setup) stays before the convolution's next call; only the launch itself and
    the work between two calls of one op go (real traces: timm ResNet-50 and Lightning ResNet-18)."""
    from gpuprof.analyzers import memory_format
    from gpuprof.rank import RankView, result_of
    from gpuprof.replay.transforms import activities_of, launches_of
    from gpuprof.specs import resolve

    t = load_trace_cached(SAMPLES / trace, 0, cache=False)
    spec = resolve(t.meta.device_properties)
    v = RankView(result_of(t, spec), spec)
    (cand,) = [c for c in memory_format.run(v) if c.category == "memory_format"]
    rows = [int(u[2]) for u, saved in cand.units.items() if u[0] == "k"
            and saved >= float(t.kernels.loc[int(u[2]), "dur"])]
    g = build([t])
    gone = activities_of(g, v.rank, "kernel", rows)
    calls = launches_of(g, gone)
    kept = fixes._kept_gaps(g, v, gone)
    with_gap = calls & ~kept
    assert not (kept & ~calls).any()
    assert calls.sum() == len(rows) and 0 < kept.sum() < calls.sum()
    ext = t.runtime["external_id"].to_numpy()[g.h_row]
    k = np.flatnonzero(kept)
    assert (ext[k - 1] != ext[k]).all()  # each keeps the gap before its op's first call ...
    went = np.flatnonzero(with_gap)
    assert (ext[went - 1] == ext[went]).mean() > 0.9  # ... and the others sit between two calls of one op
    # the work before the ops is most of the host time before the transposes' launches
    assert g.h_gap[kept].sum() > g.h_gap[with_gap].sum() > 0
    # and the analyzer leaves the idle gap before such a transpose unclaimed: its op's dispatch stays
    gone_k = t.kernels.loc[rows]
    leads = memory_format._leads(v, gone_k)
    assert 0 < len(leads) < len(rows)
    op = t.kernels["op"].to_numpy()
    for r in leads[:20]:
        mine = np.flatnonzero(op == op[r])
        assert not np.isin(mine, rows).all()  # the op keeps a kernel (its convolution)
        assert t.kernels["launch_ts"].to_numpy()[r] == t.kernels["launch_ts"].to_numpy()[mine].min()
