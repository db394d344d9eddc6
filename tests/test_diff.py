"""`gpuprof diff`: the before/after view after applying a recommendation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import gpuprof
from benchmarks.pairs import step_ms
from gpuprof.compare import compare
from tests.conftest import SAMPLES
from tests.test_html import hostile_trace


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuprof.cli", "diff", *args], capture_output=True, text=True, cwd=cwd)


def test_fp32_to_bf16() -> None:
    before = gpuprof.analyze(SAMPLES / "gpt_fp32.json.gz", step_ms=50.36).to_dict()
    after = gpuprof.analyze(SAMPLES / "gpt_bf16.json.gz", step_ms=8.90).to_dict()
    d = compare(before, after)
    assert d["unprofiled_step_time_ms"]["change"] == pytest.approx(8.90 - 50.36)
    assert d["breakdown_ms"]["compute"]["change"] < -40
    # within ±20 % of what bf16 realised (the one-session timings: 50.35 -> 12.83 ms)
    realised = step_ms("gpt_fp32") - step_ms("gpt_bf16")
    assert d["findings_saving_ms"]["precision"]["before"] == pytest.approx(realised, rel=0.2)
    assert d["findings_saving_ms"]["precision"]["after"] == 0
    assert d["mfu_unprofiled_pct"]["after"] == pytest.approx(23.4, abs=0.2)  # docs/verification.md hand count
    top = d["kernels_ms_per_step"][0]
    assert "simt_sgemm" in top["name"] and top["after"] == 0.0 and top["change"] < -5


def test_cli_text_json_html(tmp_path: Path) -> None:
    a, b = str(SAMPLES / "gpt_vocab50257.json.gz"), str(SAMPLES / "gpt_bf16.json.gz")
    t = run(a, b)
    assert t.returncode == 0 and "shape_alignment" in t.stdout and "cutlass_75_tensorop" in t.stdout
    j = run(a, b, "--format", "json")
    assert json.loads(j.stdout)["schema_version"] == 1
    h = run(a, b, "--format", "html", cwd=tmp_path)
    assert h.returncode == 0 and (tmp_path / "gpuprof-diff.html").is_file()
    bad = run(a, str(tmp_path / "missing.json"))
    assert bad.returncode == 3 and "no such file" in bad.stderr and "Traceback" not in bad.stderr


def test_diff_html_escapes_names(tmp_path: Path) -> None:
    from gpuprof.reports.diff import render_diff_html

    hostile = gpuprof.analyze(hostile_trace(tmp_path)).to_dict()
    page = render_diff_html(compare(hostile, gpuprof.analyze(SAMPLES / "tiny_graph.json.gz").to_dict()))
    assert "<script>document.title" not in page and "&lt;/script&gt;&lt;script&gt;" in page


def test_diff_says_a_side_is_host_bound_under_the_profiler() -> None:
    """gpt_fp32 → gpt_bf16 as bare traces: bf16's traced 26.24 ms is its profiled host's (8.90 ms
    without the profiler): the diff says so, and sets the projection (50.4 → 10.5 ms; 9.9 before the
    precision fix priced autocast's casts on the host, 2026-12-03) beside it."""
    d = compare(gpuprof.analyze(SAMPLES / "gpt_fp32.json.gz").to_dict(),
                gpuprof.analyze(SAMPLES / "gpt_bf16.json.gz").to_dict())
    assert d["before"]["host_bound"] is None and d["after"]["host_bound"]["idle_pct"] > 50
    assert d["step"]["basis"] == "traced"
    from gpuprof.reports.diff import render_diff_text

    text = render_diff_text(d)
    assert "after is host-bound under the profiler" in text and "--step-ms-after" in text
    assert "projected (replayed) to take its step from 50.4 to 10.5 ms" in text
    # given the unprofiled step times, neither side is host-bound by its trace and they lead
    d = compare(gpuprof.analyze(SAMPLES / "gpt_fp32.json.gz", step_ms=step_ms("gpt_fp32")).to_dict(),
                gpuprof.analyze(SAMPLES / "gpt_bf16.json.gz", step_ms=step_ms("gpt_bf16")).to_dict())
    assert d["after"]["host_bound"] is None and d["step"]["basis"] == "without the profiler"
    assert d["step"]["after"] == pytest.approx(step_ms("gpt_bf16"))
    assert "step time (used)" in render_diff_text(d)


def test_diff_of_run_folders_uses_their_unprofiled_step_times() -> None:
    folder = SAMPLES / "run_gpt_bf16"
    r = run(str(folder), str(folder), "--format", "json")
    d = json.loads(r.stdout)
    assert r.returncode == 0 and d["step"]["basis"] == "without the profiler"
    assert d["step"]["before"] == d["before"]["unprofiled_step_time_ms"] < d["step_time_ms"]["before"]
