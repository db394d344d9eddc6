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


def test_a_step_time_too_large_for_a_float_is_a_one_line_error(tmp_path: Path) -> None:
    """The manifest's numbers go through one reader (runfolder.manifest_number): a 400-digit
    integer step time was an OverflowError traceback."""
    out = _with_wait(tmp_path, None)
    m = json.loads((out / "manifest.json").read_text())
    m["unprofiled_step_ms"] = 10 ** 400
    (out / "manifest.json").write_text(json.dumps(m))
    r = CliRunner().invoke(main, ["report", str(out), "--format", "json", "--no-cache"])
    assert r.exit_code != 0 and "'unprofiled_step_ms' must be a positive number" in r.output
    assert "Traceback" not in r.output and "OverflowError" not in r.output


DDP = Path(__file__).resolve().parents[1] / "sample_traces" / "h200" / "run_ddp2_slow"


def _ddp_with_waits(tmp: Path, per_rank: dict[int, float] | None, mean: float | None) -> Path:
    """The real 2-rank DDP run folder with SYNTHETIC DataLoader waits written into a copy of its
    manifest (it was recorded before the recorder timed them): ``per_rank`` into each rank's
    timing, ``mean`` as the run's figure."""
    out = tmp / f"ddp_{len(list(tmp.iterdir()))}"
    shutil.copytree(DDP, out)
    m = json.loads((out / "manifest.json").read_text())
    for r in m["ranks"]:  # (this older manifest has no per-rank timing record: one is added)
        timing = r.setdefault("unprofiled_timing", {})
        timing.pop("loader_wait_ms", None)
        if per_rank is not None and r.get("rank") in per_rank:
            timing["loader_wait_ms"] = per_rank[r["rank"]]
    m.pop("unprofiled_input_wait_ms", None)
    if mean is not None:
        m["unprofiled_input_wait_ms"] = mean
    (out / "manifest.json").write_text(json.dumps(m))
    return out


def test_one_ranks_waits_are_the_jobs(tmp_path: Path) -> None:
    """Ranks that step together wait at the next collective for the rank whose loader fell behind:
    its waits are the job's, not the mean over ranks (which spreads them over ranks that did not
    wait)."""
    u = json.loads((DDP / "manifest.json").read_text())["unprofiled_step_ms"]
    a = analyze(_ddp_with_waits(tmp_path, {0: 0.2, 1: 6.0}, 3.1), cache=False)
    w = a.input_waits
    assert w is not None and w.rank == 1 and w.wait_ms == pytest.approx(6.0)
    traced = {p.rank: p.loader_us_per_step / 1000.0 for p in a.parts}
    assert w.traced_ms == pytest.approx(traced[1])
    assert w.typical_ms == pytest.approx(max(u - (6.0 - traced[1]), w.floor_ms))
    f = {x.id: x for x in a.findings}[INPUT_WAIT_ID]
    assert "on rank 1" in f.title and f.evidence["rank"] == 1
    assert f.estimated_savings_ms == pytest.approx(u - w.typical_ms)
    assert a.summary["input_wait"]["rank"] == 1
    assert "waiting for the DataLoader on rank 1" in a.to_text(width=200).replace("\n", " ")
    # without each rank's own figure, the run's (a mean over ranks) is the job's, as for one rank
    m = analyze(_ddp_with_waits(tmp_path, None, 3.1), cache=False).input_waits
    assert m is not None and m.rank is None and m.wait_ms == pytest.approx(3.1)
    assert m.traced_ms == pytest.approx(sum(traced.values()) / 2)
    assert m.saving_ms < w.saving_ms
    # the user's own figure (--input-wait-ms) is the job's, whatever the ranks recorded
    given = analyze(_ddp_with_waits(tmp_path, {0: 0.2, 1: 6.0}, 3.1), step_ms=u, input_wait_ms=2.0,
                    cache=False).input_waits
    assert given is not None and given.rank is None and given.wait_ms == pytest.approx(2.0)


def test_each_ranks_waits_are_read_only_when_every_rank_has_its_own() -> None:
    from types import SimpleNamespace

    from gpuprof.steptime import recorded_waits_by_rank, waits_beyond

    ranks = [{"rank": 0, "unprofiled_timing": {"loader_wait_ms": 1.0}},
             {"rank": 1, "unprofiled_timing": {"loader_wait_ms": 5.0}}]
    assert recorded_waits_by_rank({"ranks": ranks}) == {0: 1.0, 1: 5.0}
    for bad in ({"rank": 0, "unprofiled_timing": {"loader_wait_ms": 2.0}},  # a rank twice
                {"rank": True, "unprofiled_timing": {"loader_wait_ms": 2.0}},  # no rank number
                {"rank": 2, "unprofiled_timing": {"loader_wait_ms": "2"}},  # no figure
                {"rank": 2, "unprofiled_timing": {"loader_wait_ms": float("nan")}}):
        assert recorded_waits_by_rank({"ranks": [*ranks, bad]}) == {}, bad
    parts = [SimpleNamespace(rank=0, loader_us_per_step=900.0), SimpleNamespace(rank=1, loader_us_per_step=100.0)]
    # rank 1 missed 4.9 ms, rank 0 0.1: rank 1's; ties go to the lower rank
    assert waits_beyond(parts, 3.0, {0: 1.0, 1: 5.0}) == (5.0, 0.1, 1)  # type: ignore[arg-type]
    assert waits_beyond(parts, 3.0, {0: 1.9, 1: 1.0}) == (1.9, 0.9, 0)  # type: ignore[arg-type]
    tied = [SimpleNamespace(rank=0, loader_us_per_step=500.0), SimpleNamespace(rank=1, loader_us_per_step=250.0)]
    assert waits_beyond(tied, 3.0, {0: 1.5, 1: 1.25}) == (1.5, 0.5, 0)  # type: ignore[arg-type]
    # ranks of the figures other than the trace's, or one rank: the job's figure against the mean
    assert waits_beyond(parts, 3.0, {0: 1.0, 5: 5.0}) == (3.0, 0.5, None)  # type: ignore[arg-type]
    assert waits_beyond(parts[:1], 3.0, {0: 1.0}) == (3.0, 0.9, None)  # type: ignore[arg-type]


def test_the_gpu_floor_is_replayed_once_per_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the results cache on, a second report of the same run folder reads the host-free
    replay it made the first time instead of replaying the trace again."""
    import gpuprof.replay.fixes as fixes

    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path / "cache"))
    run = _with_wait(tmp_path, 3.0)
    calls: list[int] = []
    real = fixes.host_free
    monkeypatch.setattr(fixes, "host_free", lambda g: calls.append(1) or real(g))
    first = analyze(run)
    made = len(calls)
    assert made >= 1 and first.input_waits is not None
    again = analyze(run)
    assert len(calls) == made  # nothing replayed without host time the second time
    assert again.input_waits == first.input_waits
    assert again.to_json() == first.to_json()
