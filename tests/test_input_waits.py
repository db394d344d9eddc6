"""DataLoader waits the profiled steps missed are priced apart (#24 round 5, #25): the analysis
prices every other fix on the step the profiled steps stand for (gpuprof.steptime.InputWaits).

The run folder is the real Lightning recording of sample_traces/h200/frameworks (its manifest
carries the recorder's own ``unprofiled_input_wait_ms``, 9.2 ms a step); the tests copy it and
write a SYNTHETIC wait into the copy's manifest, so the figures the rule starts from are set
(``_with_wait``). The recorder's own clock is checked end to end in test_record_steps.py; the
recording as it is in test_frameworks.py; real pairs in docs/accuracy.md.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuprof.api import analyze
from gpuprof.cli import main
from gpuprof.idle import loader_us_per_step
from gpuprof.steptime import INPUT_WAIT_ID

RUN = Path(__file__).resolve().parents[1] / "sample_traces" / "h200" / "frameworks" / "run_lightning_resnet"


def _with_wait(tmp: Path, wait_ms: float | None) -> Path:
    out = tmp / f"run_{wait_ms}"
    shutil.copytree(RUN, out, dirs_exist_ok=True)
    m = json.loads((out / "manifest.json").read_text())
    m.pop("unprofiled_input_wait_ms", None)
    m["ranks"][0]["unprofiled_timing"].pop("loader_wait_ms", None)
    if wait_ms is not None:  # SYNTHETIC: a wait set by hand (the recording's own is in its manifest)
        m["unprofiled_input_wait_ms"] = wait_ms
        m["ranks"][0]["unprofiled_timing"]["loader_wait_ms"] = wait_ms
    (out / "manifest.json").write_text(json.dumps(m))
    return out


def test_the_traced_loader_time_is_the_dataloader_spans_per_step() -> None:
    a = analyze(RUN, cache=False)
    t = a.ranks[0].trace
    an = t.annotations
    spans = an[an["name"].astype(str).str.startswith("enumerate(DataLoader)")]
    s = t.steps
    inside = [(ts, e) for ts, e in zip(spans["ts"], spans["end"])
              if any(a0 <= ts and e <= b0 for a0, b0 in zip(s["cpu_start"], s["cpu_end"]))]
    # one __next__ span in each profiled step, well under a millisecond (the batches were ready)
    assert len(inside) == len(s) == 2 and all(e - ts < 1000 for ts, e in inside)
    assert loader_us_per_step(t) == pytest.approx(sum(e - ts for ts, e in inside) / len(s))
    assert a.parts[0].loader_us_per_step == pytest.approx(loader_us_per_step(t))


def test_waits_the_trace_missed_are_their_own_finding(tmp_path: Path) -> None:
    u = json.loads((RUN / "manifest.json").read_text())["unprofiled_step_ms"]
    a = analyze(_with_wait(tmp_path, 3.0), cache=False)
    w = a.input_waits
    assert w is not None and w.unprofiled_ms == pytest.approx(u)
    traced = a.parts[0].loader_us_per_step / 1000.0
    assert w.traced_ms == pytest.approx(traced)
    assert w.typical_ms == pytest.approx(max(u - (3.0 - traced), w.floor_ms))
    assert w.floor_ms < w.typical_ms  # this loop is host-bound: the waits come off whole
    f = {x.id: x for x in a.findings}
    assert f[INPUT_WAIT_ID].estimated_savings_ms == pytest.approx(u - w.typical_ms)
    assert f[INPUT_WAIT_ID].estimated_savings_pct == pytest.approx(100 * (u - w.typical_ms) / u)
    # every other fix is priced on the step without the waits, its share of the program's real step
    b = analyze(RUN, step_ms=w.typical_ms, cache=False)
    others = {x.id: x for x in b.findings}
    for i, x in others.items():
        assert f[i].estimated_savings_ms == pytest.approx(x.estimated_savings_ms), i
        assert f[i].estimated_savings_pct == pytest.approx(100 * x.estimated_savings_ms / u), i
    assert set(f) == {*others, INPUT_WAIT_ID}
    s = a.summary
    assert s["unprofiled_step_time_ms"] == pytest.approx(u)
    assert s["input_wait"]["typical_step_time_ms"] == pytest.approx(w.typical_ms)
    # the projection starts from the program's step and applies the waits' fix with the others
    assert s["projected_from_ms"] == pytest.approx(b.summary["projected_from_ms"] + w.saving_ms)
    assert INPUT_WAIT_ID in s["projected_findings"]
    assert s["projected_step_time_ms"] == pytest.approx(b.summary["projected_step_time_ms"])
    wi = a.what_if([INPUT_WAIT_ID])
    assert wi["before_ms"] - wi["step_time_ms"] == pytest.approx(w.saving_ms)
    # the loader first: until it keeps up it gives a batch every unprofiled step, so another fix alone
    # leaves the step as it is, and each other finding says it is priced after the loader's
    assert a.findings[0].id == INPUT_WAIT_ID
    other = next(x for x in a.findings if x.id != INPUT_WAIT_ID and x.estimated_savings_ms > 0)
    assert other.evidence["priced_after"] == INPUT_WAIT_ID
    alone = a.what_if([other.id])
    assert alone["step_time_ms"] == pytest.approx(u) and alone["before_ms"] == pytest.approx(u, rel=1e-3)
    both = a.what_if([other.id, INPUT_WAIT_ID])
    assert both["step_time_ms"] == pytest.approx(b.what_if([other.id])["step_time_ms"])


def test_waits_beyond_the_gpus_floor_save_only_down_to_it(tmp_path: Path) -> None:
    u = json.loads((RUN / "manifest.json").read_text())["unprofiled_step_ms"]
    a = analyze(_with_wait(tmp_path, 0.95 * u), cache=False)
    w = a.input_waits
    assert w is not None and w.typical_ms == pytest.approx(w.floor_ms)
    saving = {x.id: x.estimated_savings_ms for x in a.findings}[INPUT_WAIT_ID]
    assert saving == pytest.approx(w.unprofiled_ms - w.floor_ms) and saving < 0.95 * u
    # more waiting than the step lasts is no figure of these steps
    assert analyze(_with_wait(tmp_path, 1.5 * u), cache=False).input_waits is None


def test_no_more_waiting_than_the_trace_shows_changes_nothing(tmp_path: Path) -> None:
    base = json.loads(analyze(_with_wait(tmp_path, None), cache=False).to_json())
    for wait in (0.0, 0.2):  # none, and more than the trace's by less than the step's own noise
        same = analyze(_with_wait(tmp_path, wait), cache=False)
        traced = same.parts[0].loader_us_per_step / 1000.0
        sem = json.loads((RUN / "manifest.json").read_text())["ranks"][0]["unprofiled_timing"]["sem_ms"]
        assert wait - traced < sem
        assert same.input_waits is None
        assert json.loads(same.to_json())["findings"] == base["findings"]
    # a step time the user gives was not measured over the recorder's steps: no waits then
    given = analyze(_with_wait(tmp_path, 3.0), step_ms=17.0, cache=False)
    assert given.input_waits is None and INPUT_WAIT_ID not in {x.id for x in given.findings}


def test_every_output_says_it(tmp_path: Path) -> None:
    run = _with_wait(tmp_path, 3.0)
    for fmt in ("text", "json", "html"):
        out = tmp_path / f"r.{fmt}"
        r = CliRunner().invoke(main, ["report", str(run), "--format", fmt, "-o", str(out), "--no-cache"])
        assert r.exit_code == 0, r.output
        text = out.read_text()
        assert "DataLoader" in text, fmt
        # "DataLoader" alone is in the base report too (GP-INPUT-002): the waits' own words
        assert "waiting for the DataLoader" in text or "waits for its DataLoader" in text, fmt
    doc = json.loads((tmp_path / "r.json").read_text())
    assert INPUT_WAIT_ID in [f["id"] for f in doc["findings"]]
    assert doc["summary"]["input_wait"]["loader_wait_ms_per_step"] == 3.0


def test_the_user_can_give_the_waits_with_the_step_time(tmp_path: Path) -> None:
    """A plain trace file with the step time and the DataLoader waits from the user's own logs
    (--step-ms, --input-wait-ms) is priced as a run folder that carries both."""
    u = json.loads((RUN / "manifest.json").read_text())["unprofiled_step_ms"]
    folder = analyze(_with_wait(tmp_path, 3.0), cache=False)
    plain = analyze(RUN / "traces" / "rank0.json.gz", step_ms=u, input_wait_ms=3.0, cache=False)
    nvml = {"nvml", "memory_capacity", "gpu_throttling"}  # the folder's NVML samples add these
    assert [(f.id, round(f.estimated_savings_ms, 6)) for f in plain.findings] == \
        [(f.id, round(f.estimated_savings_ms, 6)) for f in folder.findings if f.category not in nvml]
    r = CliRunner().invoke(main, ["report", str(RUN), "--format", "json", "--input-wait-ms", "-1", "--no-cache"])
    assert r.exit_code != 0 and "--input-wait-ms must be a finite number" in r.output and "Traceback" not in r.output


def test_hostile_manifest_values_neither_crash_nor_mislead(tmp_path: Path) -> None:
    """Run folders are user data: a wait that is no number is no wait; odd fields around a real
    wait do not reach the finding's words (no "its True workers", no "over x steps")."""
    for i, bad in enumerate(["x", True, float("nan"), -1.0, 10 ** 400, [3.0]]):
        out = _with_wait(tmp_path / f"b{i}", None)
        m = json.loads((out / "manifest.json").read_text())
        m["unprofiled_input_wait_ms"] = bad
        (out / "manifest.json").write_text(json.dumps(m))
        assert analyze(out, cache=False).input_waits is None, bad
    out = _with_wait(tmp_path / "odd", 8.0)
    m = json.loads((out / "manifest.json").read_text())
    t = m["ranks"][0]["unprofiled_timing"]
    t.update(loader_workers=True, steps="x", chunks=5, sem_ms=10 ** 400)
    (out / "manifest.json").write_text(json.dumps(m))
    a = analyze(out, cache=False)
    f = a.findings[0]
    assert f.id == INPUT_WAIT_ID and "its True" not in f.recommendation and "over x" not in f.title
    assert f.evidence["chunks"] == [] and f.evidence["loader_workers"] is None


def test_waits_without_a_step_time_are_refused(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["report", str(RUN / "traces" / "rank0.json.gz"), "--format", "json",
                                  "--input-wait-ms", "3", "--no-cache"])
    assert r.exit_code != 0 and "--input-wait-ms needs the step time" in r.output and "Traceback" not in r.output
    # given with the step time, the finding does not describe a window the user did not time
    a = analyze(RUN, step_ms=23.0, input_wait_ms=5.0, cache=False)
    f = next(x for x in a.findings if x.id == INPUT_WAIT_ID)
    assert "steps timed" not in f.title and f.evidence["chunks"] == []
