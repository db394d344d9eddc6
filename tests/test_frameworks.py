"""Programs as users run them (issue #25): Lightning, HF Trainer, Accelerate, a torch.compile'd
model and FSDP2, each recorded by ``gpuprof record`` on an H200 beside its own CUDA-event clock
(``sample_traces/h200/frameworks``: real run folders, made by
``sample_traces/programs/frameworks/record_frameworks.sh``; nothing edited).

- The recorder's unprofiled step time is the program's own steady-state clock over the same steps
  of the same run, within 5 %: the window rule measures what the program does.
- No finding counts a training closure's forward and backward as optimizer work (Lightning runs
  both inside ``optimizer.step(closure)``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gpuprof
from tests.conftest import SAMPLES

FRAMEWORKS = SAMPLES / "frameworks"
PROGRAMS = ["lightning_resnet", "hf_trainer_gpt2", "accelerate_loop", "fsdp2", "compiled"]


def _own_clock_over(name: str, first: int, last: int) -> float:
    """The program's own clock over optimizer steps first..last of the recorded run (its intervals
    ending at those steps, none the profiler touched)."""
    own = json.loads((FRAMEWORKS / f"own_{name}_rec.json").read_text())
    start = own.get("per_step_from", own["steps"][0] + 1)  # per_step_ms[i] is step start + i
    per = [x for i, (x, prof) in enumerate(zip(own["per_step_ms"], own["profiled"]))
           if first <= start + i <= last and not prof]
    return sum(per) / len(per) if per else float("nan")


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_recorded_step_time_is_the_programs_own(name: str) -> None:
    m = json.loads((FRAMEWORKS / f"run_{name}" / "manifest.json").read_text())
    timing = m["ranks"][0]["unprofiled_timing"]
    w = timing["window"]
    own = _own_clock_over(name, w["first_step"], w["last_step"])
    if own != own:  # the program's own clock starts after the recorder's window (compiled: step 60)
        pytest.skip(f"{name}: the own clock starts at step 60, after the recorder's window {w}")
    assert m["unprofiled_step_ms"] == pytest.approx(own, rel=0.05), (m["unprofiled_step_ms"], own, w)
    assert timing["method"] == "cuda_events" and timing["rule"] == "steady"
    assert m["ranks"][0]["steps_seen"] == json.loads((FRAMEWORKS / f"own_{name}_rec.json").read_text())["optimizer_steps"]


@pytest.mark.parametrize("name", PROGRAMS)
def test_framework_runs_report(name: str) -> None:
    a = gpuprof.analyze(FRAMEWORKS / f"run_{name}", cache=False)
    assert a.findings and a.summary["unprofiled_step_time_ms"] > 0
    for f in a.findings:
        assert f.category != "optimizer_fusion" or f.evidence.get("kernels_per_step", 0) < 50, f.title


def test_a_lightning_closure_is_not_optimizer_work() -> None:
    """Lightning's automatic optimisation runs forward and backward inside ``SGD.step(closure)``:
    461 kernels per step sat in the ``Optimizer.step#SGD.step`` span, and the optimizer finding had
    claimed them all (91.6 % of the step, "one set per parameter (1 parameters)"). The
    optimizer's own work there is the foreach update after the closure returns."""
    from gpuprof.idle import optimizer_spans
    from gpuprof.trace.load import load_trace

    t = load_trace(FRAMEWORKS / "run_lightning_resnet" / "traces" / "rank0.json.gz")
    a = t.annotations
    whole = a[~a["on_gpu"] & a["name"].astype(str).str.startswith("Optimizer.step#")]
    own = optimizer_spans(t)
    assert len(own) == len(whole) >= 2
    k = t.kernels
    in_whole = sum(int(((k["launch_ts"] >= s) & (k["launch_ts"] < e)).sum()) for s, e in zip(whole["ts"], whole["end"]))
    in_own = sum(int(((k["launch_ts"] >= s) & (k["launch_ts"] < e)).sum()) for s, e in zip(own["ts"], own["end"]))
    assert in_whole > 400 * len(whole) and 0 < in_own < 20 * len(own)
    report = gpuprof.analyze(FRAMEWORKS / "run_lightning_resnet", cache=False)
    assert all(f.category != "optimizer_fusion" for f in report.findings[:3]), [f.title for f in report.findings]


def test_a_plain_optimizer_span_is_the_optimizers_own() -> None:
    """torch.optim's own step (no closure): its span is its work, whole."""
    from gpuprof.idle import optimizer_spans
    from gpuprof.trace.load import load_trace

    t = load_trace(SAMPLES / "gpt_adamw_forloop.json.gz")
    a = t.annotations
    whole = a[~a["on_gpu"] & a["name"].astype(str).str.startswith("Optimizer.step#")].sort_values("ts")
    own = optimizer_spans(t)
    assert list(own["ts"]) == list(whole["ts"]) and list(own["end"]) == list(whole["end"])


def test_the_samples_say_what_they_are() -> None:
    readme = (Path(__file__).resolve().parents[1] / "sample_traces" / "README.md").read_text()
    for name in PROGRAMS:
        assert f"frameworks/run_{name}" in readme, name


def test_the_lightning_loop_is_told_its_loader_first() -> None:
    """The Lightning program's 4 workers fall behind: one step in four waits for a batch, which the
    two profiled steps did not catch. The recorder's DataLoader clock saw it (its manifest), so the
    first finding is the loader (more workers realised 4.9 ms on this loop, channels-last nothing:
    docs/accuracy.md rounds 4-5). The other programs' 2-worker loaders keep up: no such finding."""
    from gpuprof.steptime import INPUT_WAIT_ID

    for name in PROGRAMS:
        m = json.loads((FRAMEWORKS / f"run_{name}" / "manifest.json").read_text())
        a = gpuprof.analyze(FRAMEWORKS / f"run_{name}", cache=False)
        ids = [f.id for f in a.findings]
        if name == "lightning_resnet":
            assert m["unprofiled_input_wait_ms"] > 0.2 * m["unprofiled_step_ms"]
            assert ids[0] == INPUT_WAIT_ID, [f.title for f in a.findings]
            assert a.input_waits is not None and a.input_waits.typical_ms < m["unprofiled_step_ms"]
        else:
            assert INPUT_WAIT_ID not in ids, name


H100_2026_12_05 = Path(__file__).resolve().parents[1] / "docs" / "measurements" / "frameworks_2026-12-05_h100"


@pytest.mark.parametrize("name,settled", [("lightning_resnet", False), ("hf_trainer_gpt2", False),
                                          ("accelerate_loop", True), ("fsdp2", False), ("compiled", False)])
def test_a_timing_that_did_not_settle_is_said(name: str, settled: bool) -> None:
    """The manifests of the five programs recorded on a lent H100 on 2026-12-05 (real, kept
    without their traces): four timings ran out of budget with chunks 17-36 % apart. The report
    must say so, with the figures, where it prices on them; the converged one says nothing."""
    from gpuprof import steptime

    m = json.loads((H100_2026_12_05 / f"manifest_{name}.json").read_text())
    t = m["ranks"][0]["unprofiled_timing"]
    assert t["converged"] is settled
    said = steptime.unsettled(m)
    if settled:
        assert said == ()
        return
    (line,) = said
    pct = 100.0 * t["sem_ms"] / m["ranks"][0]["unprofiled_step_ms"]
    assert f"({m['unprofiled_step_ms']:.2f} ms)" in line and "did not settle" in line
    assert f"{pct:.1f} %" in line and f"spread {t['spread_pct']:.0f} %" in line and "\n" not in line


def test_the_least_settled_rank_is_named() -> None:
    """Synthetic manifest (built here): two ranks, one converged; the other is named."""
    from gpuprof import steptime

    def rank(n: int, converged: bool, sem: float) -> dict[str, object]:
        return {"rank": n, "unprofiled_step_ms": 20.0,
                "unprofiled_timing": {"converged": converged, "sem_ms": sem, "spread_pct": 30.0, "steps": 100,
                                      "sem_pct": 2.0, "not_converged_why": "the budget of 30 s of timing was spent"}}

    m = {"unprofiled_step_ms": 20.0, "ranks": [rank(0, True, 0.1), rank(1, False, 0.8)]}
    (line,) = steptime.unsettled(m)
    assert "on rank 1 (20.00 ms)" in line and "4.0 %" in line and "30 s of timing" in line
    assert steptime.unsettled({"unprofiled_step_ms": 20.0, "ranks": [rank(0, True, 0.1)]}) == ()
    assert steptime.unsettled({"ranks": "not a list"}) == ()


def test_the_report_says_its_step_time_did_not_settle(tmp_path: Path) -> None:
    """A copy of the real HF Trainer run folder whose manifest is edited here to say its timing
    did not converge (a synthetic input): the report's warnings say it; with --step-ms, which the
    analysis then prices on, they do not."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(FRAMEWORKS / "run_hf_trainer_gpt2", run)
    m = json.loads((run / "manifest.json").read_text())
    m["ranks"][0]["unprofiled_timing"].update(converged=False, not_converged_why="the budget of 10 chunks was spent")
    (run / "manifest.json").write_text(json.dumps(m))
    warned = [w for w in gpuprof.analyze(run, cache=False).to_dict()["warnings"] if "did not settle" in w]
    assert len(warned) == 1 and f"({m['unprofiled_step_ms']:.2f} ms)" in warned[0]
    given = gpuprof.analyze(run, cache=False, step_ms=m["unprofiled_step_ms"]).to_dict()["warnings"]
    assert not [w for w in given if "did not settle" in w]
