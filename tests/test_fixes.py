"""Findings priced by replay (gpuprof.replay.fixes), the combined projection and Analysis.what_if,
on real H200 sample traces."""

from __future__ import annotations

import json

import pytest

import gpuprof
from benchmarks.pairs import step_ms
from gpuprof.replay import build, calibrate, deflate, fixes, run
from gpuprof.ranks import load_trace_cached
from tests.conftest import SAMPLES

#: structurally different defects: syncs + launches + fusion; allocator off; a checkpoint stall
CASES = ("gpt_host_sync", "gpt_no_caching_allocator", "gpt_checkpoint_every3")


@pytest.fixture(scope="module", params=CASES)
def analysed(request: pytest.FixtureRequest) -> tuple[str, gpuprof.Analysis]:
    name = str(request.param)
    return name, gpuprof.analyze(SAMPLES / f"{name}.json.gz", step_ms=step_ms(name), cache=False)


def test_what_if_nothing_is_the_unmodified_replay(analysed: tuple[str, gpuprof.Analysis]) -> None:
    name, a = analysed
    g = build([load_trace_cached(SAMPLES / f"{name}.json.gz", 0, False)])
    base = run(deflate(g, calibrate(g, step_ms(name))))
    unchanged = base.period_ms
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
    for f in a.findings:
        e = f.evidence
        if e.get("estimate") == "replay":
            assert f.category in fixes.REPLAY_USED
            assert f.estimated_savings_ms == pytest.approx(e["replay_before_ms"] - e["replay_after_ms"], abs=2e-3)
        elif "replay_before_ms" in e:
            assert e["replay_not_used"]


def test_replayed_saving_is_in_the_evidence_and_says_why_not_used() -> None:
    a = gpuprof.analyze(SAMPLES / "gpt_empty_cache.json.gz", step_ms=step_ms("gpt_empty_cache"), cache=False)
    f = next(f for f in a.findings if f.category == "allocator_churn")
    ev = f.evidence
    assert ev["replay_before_ms"] > ev["replay_after_ms"] and ev.get("estimate") != "replay"
    assert "MI300X" in ev["replay_not_used"]


def test_projection_line_in_text_report() -> None:
    a = gpuprof.analyze(SAMPLES / "gpt_host_sync.json.gz", step_ms=step_ms("gpt_host_sync"), cache=False)
    s = a.summary
    text = a.to_text()
    assert f"{s['projected_from_ms']:.1f} → {s['projected_step_time_ms']:.1f} ms per step" in text


def test_two_fixes_projection() -> None:
    """Both defects at once (gpt.py --host-sync --optim forloop, recorded with its twins by
    sample_traces/programs/record_two_fix.sh): host_sync and optimizer_fusion applied together
    replay to within 15 % of the realised both-fixed step time."""
    trace = SAMPLES / "gpt_sync_forloop.json.gz"
    timings = SAMPLES / "timings" / "two_fix"
    if not trace.is_file() or not (timings / "gpt_bf16.json").is_file():
        pytest.skip("no two-defect recording yet: run sample_traces/programs/record_two_fix.sh on a GPU")
    real = {n: float(json.loads((timings / f"{n}.json").read_text())["step_ms"])
            for n in ("gpt_sync_forloop", "gpt_bf16")}
    a = gpuprof.analyze(trace, step_ms=real["gpt_sync_forloop"], cache=False)
    ids = [f.id for f in a.findings if f.category in ("host_sync", "optimizer_fusion")]
    assert len(ids) == 2
    assert a.what_if(ids)["step_time_ms"] == pytest.approx(real["gpt_bf16"], rel=0.15)
