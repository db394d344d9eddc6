"""``gpuprof annotate``: the trace with gpuprof's results added still reads as the same trace
(gpuprof's loader: same kernels, same findings; HTA 0.5.0 where its test venv exists), the added
spans sit exactly on the kernels and gaps they name, and files are never replaced unasked."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gpuprof
from gpuprof.views import claims
from tests.conftest import SAMPLES

ENV = {**os.environ, "NO_COLOR": "1"}
ROOT = Path(__file__).parents[1]
#: HTA lives in its own venv (it pins its own pandas/numpy): .scratch/hta-venv, made with
#: `python3 -m venv .scratch/hta-venv && .scratch/hta-venv/bin/pip install holistictraceanalysis==0.5.0`.
HTA_PYTHON = Path(os.environ.get("GPUPROF_HTA_PYTHON", ROOT / ".scratch" / "hta-venv" / "bin" / "python"))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuprof.cli", *args], capture_output=True, text=True, env=ENV)


def events(path: Path) -> list[dict]:  # type: ignore[type-arg]
    ev: list[dict] = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]  # type: ignore[type-arg]
    return ev


@pytest.fixture(scope="module")
def annotated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("ann")
    got = {}
    for name in ("gpt_fp32", "gpt_python_inline"):  # a GPU-bound precision case, a host-bound launch case
        dst = out / f"{name}.ann.json.gz"
        r = cli("annotate", str(SAMPLES / f"{name}.json.gz"), "-o", str(dst), "--no-cache")
        assert r.returncode == 0, r.stderr
        got[name] = dst
    return got


@pytest.mark.parametrize("name", ["gpt_fp32", "gpt_python_inline"])
def test_loads_back_as_the_same_trace(annotated: dict[str, Path], name: str) -> None:
    a = gpuprof.analyze(SAMPLES / f"{name}.json.gz", cache=False)
    b = gpuprof.analyze(annotated[name], cache=False)
    assert len(a.kernels) == len(b.kernels) and len(a.ops) == len(b.ops) and len(a.memcpys) == len(b.memcpys)
    assert np.allclose(a.kernels["ts"], b.kernels["ts"]) and a.summary["step_time_ms"] == b.summary["step_time_ms"]
    assert [(f.id, f.estimated_savings_ms) for f in a.findings] == [(f.id, f.estimated_savings_ms) for f in b.findings]
    original = events(SAMPLES / f"{name}.json.gz")
    added = events(annotated[name])
    assert added[: len(original)] == original  # every original event kept, unchanged and in order


@pytest.mark.parametrize("name", ["gpt_fp32", "gpt_python_inline"])
def test_spans_sit_on_what_they_name(annotated: dict[str, Path], name: str) -> None:
    a = gpuprof.analyze(SAMPLES / f"{name}.json.gz", cache=False)
    ev = events(annotated[name])
    ours = [e for e in ev if e.get("cat") == "gpuprof"]
    pid = ours[0]["pid"]
    assert pid not in {e.get("pid") for e in ev if e.get("cat") != "gpuprof" and e.get("ph") != "M"}
    names = {e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("pid") == pid and "name" in e["args"]}
    assert "gpuprof" in names
    kernels = {(round(e["ts"], 3), round(e["dur"], 3)) for e in ev if e.get("cat") == "kernel"}
    cls = [e for e in ours if e["tid"] < 1000]
    assert len(cls) == len(a.kernels) and all((e["ts"], e["dur"]) in kernels for e in cls)
    assert {e["name"] for e in cls} <= {"compute", "memory", "latency", "unknown", "communication", "outside steps"}
    # kernels before the first step or after the last are not analysed: said so, never "unknown"
    outside = [e for e in cls if e["name"] == "outside steps"]
    assert len(outside) == int((a.kernels["step"] < 0).sum()) and all("bound" not in e["args"] for e in outside)
    # each finding's spans: named by id and saving, and their counted µs are its saving
    steps = len(a.steps)
    for f in a.findings:
        mine = [e for e in ours if e["tid"] >= 1000 and e["args"]["finding"] == f.id]
        assert mine and all(e["name"].startswith(f.id) and "ms/step" in e["name"] for e in mine)
        counted = sum(e["args"]["counted_us"] for e in mine) / steps / 1000.0
        assert counted == pytest.approx(f.estimated_savings_ms, rel=1e-3, abs=1e-3)
        claimed_kernels = [e for e in mine if e["args"]["item"] == "kernel"]
        assert all((e["ts"], e["dur"]) in kernels for e in claimed_kernels)
    # spans on one track never overlap (Perfetto nests spans by thread)
    by_tid: dict[int, list[tuple[float, float]]] = {}
    for e in ours:
        by_tid.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_tid.values():
        spans.sort()
        assert all(b[0] >= a_[1] - 1e-3 for a_, b in zip(spans, spans[1:]))


def test_claims_add_up_to_each_finding() -> None:
    a = gpuprof.analyze(SAMPLES / "gpt_host_sync.json.gz", cache=False)
    c = claims(a, a.ranks)
    assert len(a.findings) and set(c["finding"]) == {f.id for f in a.findings if f.estimated_savings_ms > 0}
    for f in a.findings:
        got = c.loc[c["finding"] == f.id, "saved_us"].sum() / len(a.steps) / 1000.0
        assert got == pytest.approx(f.estimated_savings_ms, rel=1e-3, abs=1e-3)
    gaps = c[c["kind"] == "gap"]
    assert len(gaps) and (gaps["end"] > gaps["ts"]).all()


def test_several_ranks_write_one_trace_each(tmp_path: Path) -> None:
    out = tmp_path / "ann"
    r = cli("annotate", str(SAMPLES / "ddp_slow_rank"), "-o", str(out), "--no-cache")
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        b = gpuprof.analyze(out / f"rank{rank}.json.gz", cache=False)
        assert b.parts[0].rank == rank
        assert any(e.get("cat") == "gpuprof" for e in events(out / f"rank{rank}.json.gz"))


def test_never_replaces_unasked_and_never_the_input(tmp_path: Path) -> None:
    src = tmp_path / "t.json.gz"
    src.write_bytes((SAMPLES / "decode_b1.json.gz").read_bytes())
    before = src.read_bytes()
    for extra in ((), ("--force",)):
        r = cli("annotate", str(src), "-o", str(src), *extra)
        assert r.returncode == 2 and "input" in r.stderr and "Traceback" not in r.stderr
    assert src.read_bytes() == before
    out = tmp_path / "o.json.gz"
    assert cli("annotate", str(src), "-o", str(out)).returncode == 0
    first = out.read_bytes()
    again = cli("annotate", str(src), "-o", str(out))
    assert again.returncode == 2 and "exists" in again.stderr and out.read_bytes() == first
    assert cli("annotate", str(src), "-o", str(out), "--force").returncode == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left behind
    plain = tmp_path / "o.json"  # without .gz: plain JSON
    assert cli("report", str(src), "--format", "json", "-o", str(tmp_path / "r.json"),
               "--annotated", str(plain)).returncode == 0
    assert any(e.get("cat") == "gpuprof" for e in json.loads(plain.read_text())["traceEvents"])


@pytest.mark.skipif(not HTA_PYTHON.exists(), reason=f"no HTA venv at {HTA_PYTHON} (see HTA_PYTHON's comment)")
def test_hta_reads_the_annotated_trace(annotated: dict[str, Path], tmp_path: Path) -> None:
    """HTA 0.5.0 parses the original and the annotated trace into the same kernels."""
    script = """
import sys, shutil, pathlib
from hta.trace_analysis import TraceAnalysis
out = []
for src in sys.argv[1:]:
    d = pathlib.Path(src + ".d"); d.mkdir()
    shutil.copy(src, d / "rank0.json.gz")
    t = TraceAnalysis(trace_dir=str(d))
    df = t.t.get_trace(0)
    k = df[df["stream"] > 0]
    out.append((len(k), round(float(k["dur"].sum()), 1)))
    t.get_temporal_breakdown(visualize=False)
print(out)
assert out[0] == out[1], out
"""
    orig = tmp_path / "orig.json.gz"
    orig.write_bytes((SAMPLES / "gpt_fp32.json.gz").read_bytes())
    ann = tmp_path / "ann.json.gz"
    ann.write_bytes(annotated["gpt_fp32"].read_bytes())
    r = subprocess.run([str(HTA_PYTHON), "-c", script, str(orig), str(ann)], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
