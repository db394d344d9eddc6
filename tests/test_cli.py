"""The command line as a user meets it: help, reports, outputs, and one-line errors."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import SAMPLES

ENV = {**os.environ, "NO_COLOR": "1"}


def gpuprof(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuprof.cli", *args], capture_output=True, text=True, env=ENV,
                          cwd=cwd)


def test_help_and_version() -> None:
    r = gpuprof("--help")
    assert r.returncode == 0 and "report" in r.stdout and "calibrate" in r.stdout
    assert "Kineto" in gpuprof("report", "--help").stdout
    v = gpuprof("--version")
    assert v.returncode == 0 and "gpuprof, version" in v.stdout


def test_text_report() -> None:
    r = gpuprof("report", str(SAMPLES / "gpt_fp32.json.gz"), "--format", "text")
    assert r.returncode == 0, r.stderr
    assert "step time 50." in r.stdout and "MFU" in r.stdout and "cutlass_80_simt_sgemm" in r.stdout
    assert "\x1b[" not in r.stdout  # NO_COLOR and not a TTY


def test_json_report_to_file_never_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    r = gpuprof("report", str(SAMPLES / "decode_b1.json.gz"), "--format", "json", "-o", str(out))
    assert r.returncode == 0 and json.loads(out.read_text())["summary"]["steps"] == 8
    again = gpuprof("report", str(SAMPLES / "decode_b1.json.gz"), "--format", "json", "-o", str(out))
    assert again.returncode != 0 and "exists" in again.stderr and "Traceback" not in again.stderr
    forced = gpuprof("report", str(SAMPLES / "decode_b1.json.gz"), "--format", "json", "-o", str(out), "--force")
    assert forced.returncode == 0


def test_bad_inputs_give_one_line_and_nonzero_exit(tmp_path: Path) -> None:
    good = gzip.decompress((SAMPLES / "tiny_graph.json.gz").read_bytes())
    cases = {
        "truncated.json.gz": gzip.compress(good)[:2000],
        "truncated.json": good[: len(good) // 2],
        "notatrace.json": b'{"hello": "world"}',
        "empty.json": b"",
    }
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        r = gpuprof("report", str(p))
        assert r.returncode == 3, (name, r.stderr)
        assert r.stderr.count("\n") == 1 and str(p) in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = gpuprof("report", str(tmp_path / "missing.json"))
    assert r.returncode == 3 and "no such file" in r.stderr
    empty_dir = tmp_path / "d"
    empty_dir.mkdir()
    r = gpuprof("report", str(empty_dir))
    assert r.returncode == 3 and "no trace files" in r.stderr
    r = gpuprof("report", str(SAMPLES / "gpt_bf16.json.gz"), "--gpu", "Voodoo5")
    assert r.returncode == 4 and "unknown GPU" in r.stderr and "Traceback" not in r.stderr


def test_gpu_override_and_spec_file(tmp_path: Path) -> None:
    r = gpuprof("report", str(SAMPLES / "gpt_bf16.json.gz"), "--gpu", "A100-SXM4-80GB", "--format", "json")
    assert json.loads(r.stdout)["gpu"]["spec"]["bf16_tflops"] == 312
    spec = Path(__file__).resolve().parents[1] / "docs" / "measurements" / "h200_calibrated.json"
    r = gpuprof("report", str(SAMPLES / "gpt_bf16.json.gz"), "--gpu-spec", str(spec), "--format", "json")
    doc = json.loads(r.stdout)
    assert doc["gpu"]["spec"]["bf16_tflops"] == 731.5 and "spec file" in doc["gpu"]["spec"]["source"]


def test_run_folder_manifest(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rank0.json.gz").write_bytes((SAMPLES / "tiny_eager.json.gz").read_bytes())
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": 1, "traces": [
        {"rank": 0, "path": "traces/rank0.json.gz"}]}))
    r = gpuprof("report", str(tmp_path), "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["source"]["ranks"] == [0]


def test_terminal_output_neutralises_control_characters(tmp_path: Path) -> None:
    """SYNTHETIC trace whose kernel name carries an escape sequence."""
    from tests.conftest import TraceBuilder

    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    ext = b.op("aten::mm", 1, 5, [[64, 64], [64, 64]], ["float", "float"])
    b.launch("evil\x1b[2J\x1b]0;pwned\x07kernel", 2, 10, 5.0, ext)
    r = gpuprof("report", str(b.write(tmp_path / "t.json")), "--format", "text")
    assert r.returncode == 0 and "\x1b" not in r.stdout and "evil\\x1b[2J" in r.stdout


def test_html_is_the_default_and_never_overwrites(tmp_path: Path) -> None:
    for expected in ("gpuprof-report.html", "gpuprof-report-1.html"):
        r = gpuprof("report", str(SAMPLES / "gpt_fp32.json.gz"), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / expected).is_file() and f"wrote {expected}" in r.stderr
        assert "What to fix first" in r.stdout  # the terminal summary comes too


def test_a_log_folder_reports_its_trace_and_names_the_json_that_is_not_one(tmp_path: Path) -> None:
    """A tensorboard_trace_handler log dir: the trace beside small JSON files a run also writes
    (issue 25). The trace is reported, the others named as left out; a damaged trace is never
    left out; a folder of JSON files none of which is a trace is refused naming them."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "host.1234.pt.trace.json.gz").write_bytes((SAMPLES / "decode_b1.json.gz").read_bytes())
    (logs / "config.json").write_text('{"lr": 0.001, "batch": 8}')
    (logs / "metrics.json").write_text("[]")  # an empty event array is a (bare, torch 1.8) trace's shape
    r = gpuprof("report", str(logs), "--format", "json", "-o", str(tmp_path / "r.json"))
    assert r.returncode != 0 and "metrics.json" in r.stderr  # an empty event array is analysed, then refused
    (logs / "metrics.json").unlink()
    r = gpuprof("report", str(logs), "--format", "json", "-o", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["summary"]["steps"] == 8
    assert [w for w in doc["warnings"] if "left out 1 file" in w and "'config.json'" in w]
    (logs / "broken.json").write_text('{"traceEvents": [{"ph": "X"')  # a trace cut short: an error, not skipped
    r = gpuprof("report", str(logs), "--format", "text")
    assert r.returncode != 0 and "broken.json" in r.stderr and "Traceback" not in r.stderr
    only = tmp_path / "only"
    only.mkdir()
    (only / "a.json").write_text('{"a": 1}')
    r = gpuprof("report", str(only), "--format", "text")
    assert r.returncode != 0 and "no trace files" in r.stderr and "'a.json'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
