"""Hostile inputs that had been reported as if sound (issue #28, second round, items 14 and 15):
events recorded twice, correlation ids shared by launches, steps of no duration, one trace
named as many ranks. Each is now dropped, left unlinked or refused, and said, never counted
quietly (:mod:`gpuprof.trace.integrity`, ``gpuprof.trace.links``, ``gpuprof.runfolder``).

Every damaged trace is a REAL sample (``gpt_bf16``: 3 steps of 26.24 ms, 1,167 kernels) copied
and damaged in code here: its events duplicated, or shifted and appended, or its
``ProfilerStep`` spans' durations set to zero or below. The undamaged samples these rules could
mistake (graph replays share one correlation id across many kernels) must not fire.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gpuprof
from gpuprof.errors import TraceError
from gpuprof.trace.load import load_trace
from tests.conftest import SAMPLES

REAL = SAMPLES / "gpt_bf16.json.gz"
_GPU_AND_LAUNCHES = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver")


def _doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(gzip.decompress(REAL.read_bytes()))
    return doc


def _write(doc: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def real() -> dict[str, Any]:
    return gpuprof.analyze(REAL, cache=False).to_dict()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuprof.cli", *args], capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "NO_COLOR": "1"})


def _one_line(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 3, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr[-2000:]
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


# --- 14. every event twice -------------------------------------------------------------------

def test_every_event_twice_is_counted_once_and_said(tmp_path: Path, real: dict[str, Any]) -> None:
    """The real trace's events, then all of them again (a trace concatenated with itself): main
    counted every kernel twice (2,334 of them), silently. Now the report is the real one, plus
    one warning."""
    doc = _doc()
    doc["traceEvents"] = doc["traceEvents"] + copy.deepcopy(doc["traceEvents"])
    got = gpuprof.analyze(_write(doc, tmp_path / "twice.json"), cache=False).to_dict()
    said = [w for w in got["warnings"] if "repeat another exactly" in w]
    assert len(said) == 1 and said[0].startswith("11,060 of 22,120 events"), got["warnings"]
    for key in ("summary", "kernels", "findings", "ranking"):
        assert got[key] == real[key], key
    assert [w for w in got["warnings"] if w not in said] == real["warnings"]


# --- 14. correlation ids shared by launches --------------------------------------------------

def test_a_trace_whose_launches_share_correlation_ids_is_refused(tmp_path: Path) -> None:
    """Its launch calls and GPU work appended again one trace length later, ids unchanged (two
    recordings merged into one file): main linked kernels to the other copy's launches and
    reported a 105 ms step for 26 ms. Now: one line, exit 3."""
    doc = _doc()
    timed = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed)
    again = [dict(e, ts=e["ts"] + span) for e in doc["traceEvents"] if e.get("cat") in _GPU_AND_LAUNCHES]
    doc["traceEvents"] += again
    t = _write(doc, tmp_path / "merged.json")
    _one_line(_cli("report", str(t), "--format", "json", "--no-cache"), "merged.json",
              "GPU events share their correlation id", "cannot be matched")


def test_a_few_shared_correlation_ids_are_left_unlinked_and_said(tmp_path: Path, real: dict[str, Any]) -> None:
    """Three kernels recorded again 1 µs later with their correlation ids: each pair could be
    either launch's, so all six are linked to none (at most 1 % of GPU events; more is refused)."""
    doc = _doc()
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"][100:103]
    doc["traceEvents"] += [dict(e, ts=e["ts"] + 1) for e in kernels]
    t = _write(doc, tmp_path / "few.json")
    trace = load_trace(t)
    unlinked = trace.kernels[trace.kernels["correlation"].isin([e["args"]["correlation"] for e in kernels])]
    assert len(unlinked) == 6 and (unlinked["op"] == -1).all() and unlinked["launch_ts"].isna().all()
    got = gpuprof.analyze(t, cache=False).to_dict()
    said = [w for w in got["warnings"] if w.startswith("6 of 1,351 GPU events share their correlation id")]
    assert said, got["warnings"]
    assert got["summary"]["step_time_ms"] == pytest.approx(real["summary"]["step_time_ms"], rel=0.01)


# --- 14. steps of no duration ----------------------------------------------------------------

def _steps_lasting(dur: float, every: bool) -> dict[str, Any]:
    doc = _doc()
    spans = [e for e in doc["traceEvents"] if e.get("cat") == "user_annotation"
             and str(e.get("name", "")).startswith("ProfilerStep#")]
    for e in spans if every else spans[:1]:
        e["dur"] = dur
    return doc


@pytest.mark.parametrize("dur", [0, -5])
def test_a_profiler_step_of_no_duration_is_left_out_and_said(tmp_path: Path, real: dict[str, Any], dur: float) -> None:
    """The first ProfilerStep span made 0 µs (or -5: read as 0): main counted it as a step of
    0.00 ms, the mean falling from 26.24 to 17.68 ms, with no word. Now it is left out."""
    got = gpuprof.analyze(_write(_steps_lasting(dur, every=False), tmp_path / "t.json"), cache=False).to_dict()
    assert any(w.startswith("1 ProfilerStep span(s) of zero or negative duration (e.g. 'ProfilerStep#3')")
               and w.endswith("2 step(s) remain") for w in got["warnings"]), got["warnings"]
    assert got["summary"]["steps"] == real["summary"]["steps"] - 1
    assert got["summary"]["step_time_ms"] == pytest.approx(26.40, abs=0.01)  # steps 4 and 5 of the real trace


def test_profiler_steps_all_without_duration_give_way_to_optimizer_steps(tmp_path: Path) -> None:
    """Every ProfilerStep span of no duration: main reported "step time 0.00 ms" and no finding.
    Now the steps are the windows between optimizer steps, and both facts are said."""
    t = _write(_steps_lasting(0, every=True), tmp_path / "t.json")
    r = _cli("report", str(t), "--format", "text", "--no-cache")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "0.00 ms" not in r.stdout
    got = gpuprof.analyze(t, cache=False).to_dict()
    assert got["summary"]["steps_source"] == "optimizer" and got["summary"]["step_time_ms"] > 20
    assert any("3 ProfilerStep span(s) of zero or negative duration" in w for w in got["warnings"])
    assert got["findings"]


# --- 14. the undamaged samples these rules could mistake -------------------------------------

@pytest.mark.parametrize("name", ["gpt_bf16", "tiny_graph", "mlp_graph", "gpt_decode_b1_graph", "tiny_graph_capture",
                                  "ddp_good/rank0", "gpt_gpu_only"])
def test_real_traces_raise_none_of_these(name: str) -> None:
    """Graph replays: one correlation id for all of a graph's kernels, and graphs replayed before
    the profiler started: ids on kernels with no launch call in the trace. Neither is damage."""
    w = load_trace(SAMPLES / f"{name}.json.gz").meta.warnings
    assert not [x for x in w if "repeat another" in x or "correlation id" in x or "ProfilerStep span" in x], w


# --- 15. one trace named as many ranks -------------------------------------------------------

def test_a_manifest_listing_one_trace_many_times_is_refused(tmp_path: Path) -> None:
    """A real run folder whose manifest lists its one trace 200 times: main reported 200 ranks."""
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "run_gpt_bf16", run)
    doc = json.loads((run / "manifest.json").read_text())
    doc["traces"] = [dict(doc["traces"][0], rank=i) for i in range(200)]
    (run / "manifest.json").write_text(json.dumps(doc))
    _one_line(_cli("report", str(run), "--format", "json", "--no-cache"), "manifest.json",
              "lists one trace file twice, traces[0].path ('traces/rank0.json.gz') and traces[1].path")


@pytest.mark.parametrize("how", ["twice", "link", "hard_link", "folder_and_file"])
def test_one_trace_given_as_two_is_refused(tmp_path: Path, how: str) -> None:
    """The same file twice however spelled: on the command line, through a link or a hard link,
    or inside a folder given beside it."""
    t = tmp_path / "ranks" / "rank0.json.gz"
    t.parent.mkdir()
    shutil.copy(SAMPLES / "tiny_eager.json.gz", t)
    other = tmp_path / "other.json.gz"
    if how == "link":
        other.symlink_to(t)
    elif how == "hard_link":
        os.link(t, other)
    second = {"twice": t, "link": other, "hard_link": other, "folder_and_file": t.parent}[how]
    _one_line(_cli("report", str(t), str(second), "--format", "json", "--no-cache"),
              "is the same trace file as", str(t))
    with pytest.raises(TraceError, match="same trace file"):
        gpuprof.analyze([t, second])
