"""A replay that cannot be built is a note on the report, never the end of it (issue 27).

SYNTHETIC traces built in the test (conftest.TraceBuilder)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import gpuprof
from gpuprof.errors import GpuprofWarning
from tests.conftest import TraceBuilder, simple_training_trace


def test_synchronising_calls_without_gpu_activities_replay(tmp_path: Path) -> None:
    """SYNTHETIC: host calls that synchronise, and no kernel or copy at all (HTA's CUPTI-counter
    benchmark trace is such a one): the replay's waits index no activity (it raised IndexError)."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("aten::conv2d", 10, 100)
    for i in range(3):
        b._x("cuda_runtime", "cudaDeviceSynchronize", 200 + 100 * i, 50, 10, 1, {"correlation": 500 + i})
    a = gpuprof.analyze(b.write(tmp_path / "nogpu.json"), cache=False)
    assert a.summary["replay_step_time_ms"] is None
    assert not [w for w in a.to_dict()["warnings"] if w.startswith("no replay")]  # nothing to replay: no note
    assert a.to_html() and a.to_text(width=80)


def test_a_replay_that_fails_is_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SYNTHETIC: the graph builder failing (a bug) leaves the report whole: no replayed step, no
    projection, one note in the report and one warning naming the error."""
    from gpuprof.replay import graph

    def broken(traces: object) -> None:
        raise IndexError("index 0 is out of bounds for axis 0 with size 0")

    monkeypatch.setattr(graph, "_build", broken)
    path = simple_training_trace(TraceBuilder()).write(tmp_path / "t.json")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        a = gpuprof.analyze(path, cache=False)
    said = [str(w.message) for w in seen if issubclass(w.category, GpuprofWarning)]
    assert any("no replay" in w and "IndexError" in w and "index 0 is out of bounds" in w for w in said), said
    doc = a.to_dict()
    assert doc["summary"]["replay_step_time_ms"] is None and not doc["summary"].get("projected_step_time_ms")
    assert [w for w in doc["warnings"] if w.startswith("no replay:")]
    assert "no replay:" in a.to_html() and "no replay:" in a.to_text(width=80)
