"""Hostile and broken input (issue #15): run folders that point outside themselves, control
characters meant for the terminal, secrets in recorded command lines, killed recorders, failing
writes, superlinear shapes and malformed fields.

Every trace, manifest and NVML file here is SYNTHETIC (built in the test, said so where made)
or a real sample trace copied into a temporary folder and then damaged in code; the samples
themselves are never edited. Timing targets live in benchmarks/superlinear.py, not here.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import gpuprof
from gpuprof.errors import GpuprofError
from tests.conftest import SAMPLES, TraceBuilder

ENV = {**os.environ, "NO_COLOR": "1"}
RUN = SAMPLES / "run_gpt_bf16"  # a real run folder written by `gpuprof record` on an H200


def cli(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuprof.cli", *args], capture_output=True, text=True, env=ENV, **kw)


def one_line_error(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr[-2000:]
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


def small_trace(tmp: Path, name: str = "t.json") -> Path:
    """SYNTHETIC: two profiler steps of one matmul kernel each."""
    b = TraceBuilder()
    for s in range(2):
        b.annotation(f"ProfilerStep#{s}", 100 * s, 90)
        ext = b.op("aten::mm", 100 * s + 1, 5, [[64, 64], [64, 64]], ["float", "float"])
        b.launch("gemm_kernel", 100 * s + 2, 100 * s + 10, 5.0, ext)
    return b.write(tmp / name)


def copy_run(tmp: Path, manifest: bool = True) -> Path:
    """The real run folder, copied so that the test can damage its manifest."""
    run = tmp / "run"
    shutil.copytree(RUN, run)
    if not manifest:
        (run / "manifest.json").unlink()
    return run


def set_manifest(run: Path, edit: Any) -> None:
    doc = json.loads((run / "manifest.json").read_text())
    out = edit(doc)
    (run / "manifest.json").write_text(json.dumps(doc if out is None else out))


# --- 1. manifest paths stay inside the run folder --------------------------------------------

@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_manifest_traces_outside_the_run_folder_are_refused(tmp_path: Path, where: str) -> None:
    run = copy_run(tmp_path)
    outside = tmp_path / "outside.json.gz"
    shutil.copy(run / "traces" / "rank0.json.gz", outside)  # a valid trace: only its place is wrong
    if where == "symlink":
        (run / "traces" / "rank0.json.gz").unlink()
        (run / "traces" / "rank0.json.gz").symlink_to(outside)
        target = "traces/rank0.json.gz"
    else:
        target = "../outside.json.gz" if where == "parent" else str(outside)
    set_manifest(run, lambda d: d["traces"][0].update(path=target))
    r = cli("report", str(run), "--format", "json", "--no-cache")
    one_line_error(r, 3, "manifest.json", "traces[0].path", "outside the run folder")


def test_manifest_nvml_outside_the_run_folder_is_refused(tmp_path: Path) -> None:
    run = copy_run(tmp_path)
    shutil.move(run / "nvml.csv", tmp_path / "nvml.csv")
    set_manifest(run, lambda d: d["nvml"].update(path="../nvml.csv"))
    with pytest.raises(GpuprofError, match=r"nvml\.path.*outside the run folder"):
        gpuprof.analyze(run, cache=False)


def test_etc_passwd_is_never_read(tmp_path: Path) -> None:
    run = copy_run(tmp_path)
    set_manifest(run, lambda d: d["traces"][0].update(path="../../../../../../../../etc/passwd"))
    r = cli("report", str(run), "--format", "json", "--no-cache")
    one_line_error(r, 3, "outside the run folder")
    assert "root:" not in r.stderr


# --- 2. control characters never reach the terminal raw --------------------------------------

def test_error_messages_escape_control_characters(tmp_path: Path) -> None:
    evil = tmp_path / "x\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\r.json"  # OSC 52 clipboard write, clear screen, CR
    evil.write_bytes(b"not json")
    r = cli("report", str(evil))
    one_line_error(r, 3, "\\x1b]52;c;", "\\x07", "\\x1b[2J", "\\x0d")
    assert not any(c in r.stderr for c in "\x1b\x07\r")


def test_text_report_escapes_names_and_warnings(tmp_path: Path) -> None:
    """SYNTHETIC trace: a kernel and a step whose names carry escape sequences."""
    from gpuprof.reports.text import printable

    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    ext = b.op("aten::mm", 1, 5, [[64, 64], [64, 64]], ["float", "float"])
    b.launch("k\x9b31m\x1b]52;c;eA==\x07\u202eevil", 2, 10, 5.0, ext)
    r = cli("report", str(b.write(tmp_path / "t.json")), "--format", "text", "--no-cache")
    assert r.returncode == 0, r.stderr
    assert not any(c in r.stdout for c in "\x1b\x07\x9b\u202e") and "k\\x9b31m\\x1b]52" in r.stdout
    assert printable("a\nb\tc\u2028\ud800") == "a\\x0ab\\x09c\\u2028\\ud800"


# --- 3. secrets are redacted -------------------------------------------------------------------

SECRETS = ["hf_abcdefghijklmnopqrstuvwxyz0123456789", "sk-proj-ABCDEFGHIJKLMNOPQRSTUV0123",
           "AKIAIOSFODNN7EXAMPLE", "hunter2", "wandb-key-value-123", "tok3n-plain"]
COMMAND = ["env", f"WANDB_API_KEY={SECRETS[4]}", "python", "train.py", "--hf-token", SECRETS[0],
           f"--api-key={SECRETS[1]}", "--aws", SECRETS[2], "--db", f"postgres://bob:{SECRETS[3]}@db:5432/x",
           "--password", SECRETS[5], "--lr", "3e-4", "--max-tokens", "2048"]


def test_redaction_rules() -> None:
    from gpuprof.redact import redact, redact_argv

    out, n = redact_argv(COMMAND)
    assert n == 6 and not any(s in " ".join(out) for s in SECRETS)
    assert out[out.index("--lr") + 1] == "3e-4" and out[out.index("--max-tokens") + 1] == "2048"
    assert "postgres://bob:<redacted>@db:5432/x" in out
    doc, n = redact({"env": {"OPENAI_API_KEY": "x1", "PATH": "/usr/bin", "GITHUB_TOKEN": "y2"},
                     "command": "python t.py --auth-token abc --key-dim 64", "traces": [{"path": "traces/r0.json"}]})
    assert n == 3 and doc["env"]["PATH"] == "/usr/bin" and doc["command"].endswith("--auth-token <redacted> --key-dim 64")
    assert doc["traces"] == [{"path": "traces/r0.json"}]


def test_record_writes_a_redacted_manifest(tmp_path: Path) -> None:
    from gpuprof.record.manifest import build, write_json_atomic

    doc = build(tmp_path, {"command": COMMAND, "failures": [f"rank 0: HTTP 401 for token {SECRETS[0]}"]}, [])
    write_json_atomic(tmp_path / "manifest.json", doc)
    text = (tmp_path / "manifest.json").read_text()
    assert not any(s in text for s in SECRETS) and json.loads(text)["redacted"] == 7


def test_reports_redact_manifests_recorded_before(tmp_path: Path) -> None:
    run = copy_run(tmp_path)
    set_manifest(run, lambda d: d.update(command=COMMAND))  # as a recorder without redaction wrote it
    outs = {}
    for fmt in ("json", "text", "html"):
        out = tmp_path / f"r.{fmt}"
        r = cli("report", str(run), "--format", fmt, "-o", str(out), "--no-cache")
        assert r.returncode == 0, r.stderr
        outs[fmt] = out.read_text()
    for fmt, text in outs.items():
        assert not any(s in text for s in SECRETS), fmt
        assert "shown as &lt;redacted&gt;" in text if fmt == "html" else "shown as <redacted>" in text, fmt
    assert "--hf-token &lt;redacted&gt;" in outs["html"]


# --- 4. a run folder without a manifest (killed recorder) --------------------------------------

def test_run_folder_without_manifest_is_analysed(tmp_path: Path) -> None:
    run = copy_run(tmp_path, manifest=False)
    a = gpuprof.analyze(run, cache=False)
    assert [p.rank for p in a.parts] == [0] and a.nvml_summary and a.nvml_summary[0]["samples"] > 0
    assert any("no manifest.json" in w for w in a.warnings)
    whole = gpuprof.analyze(RUN, cache=False)
    assert a.summary["step_time_ms"] == pytest.approx(whole.summary["step_time_ms"])
    assert a.summary["unprofiled_step_time_ms"] == pytest.approx(whole.summary["unprofiled_step_time_ms"])
    assert a.parts[0].nvml_period_s == pytest.approx(1.0 / whole.run["nvml"]["hz"], rel=0.05)


def test_recorder_files_are_not_traces(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    shutil.copytree(RUN / "traces", folder)  # rank0.json.gz beside rank0.meta.json
    (folder / "rank0.json.gz.tmp").write_bytes(b"{half")
    a = gpuprof.analyze(folder, cache=False)
    assert [Path(p.meta.path).name for p in a.parts] == ["rank0.json.gz"]


# --- 5. -o --force replaces atomically ---------------------------------------------------------

def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # writes past 4 KB fail (EFBIG), as on a full disk


def test_failing_write_keeps_the_old_report(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    out.write_text('{"old": "report"}\n')
    r = cli("report", str(SAMPLES / "tiny_graph.json.gz"), "--format", "json", "-o", str(out), "--force",
            "--no-cache", preexec_fn=_limit_file_size)
    one_line_error(r, 2, str(out), "cannot write")
    assert out.read_text() == '{"old": "report"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no temporary file left behind
    r = cli("report", str(SAMPLES / "tiny_graph.json.gz"), "--format", "json", "-o", str(out), "--force", "--no-cache")
    assert r.returncode == 0 and json.loads(out.read_text())["schema_version"] == 1


def test_unwritable_outputs_give_one_line(tmp_path: Path) -> None:
    trace = str(SAMPLES / "tiny_graph.json.gz")
    for target in ("/proc/version", "/proc/self/nope/r.json", "/proc/1/x.json"):
        r = cli("report", trace, "--format", "json", "-o", target, "--force", "--no-cache")
        one_line_error(r, 2, target)
    new = tmp_path / "fresh.json"
    r = cli("report", trace, "--format", "json", "-o", str(new), "--no-cache", preexec_fn=_limit_file_size)
    one_line_error(r, 2, "cannot write")
    assert not new.exists()  # a report that could not be written is not left half-written


# --- 6. bounded work on superlinear shapes (correctness; timing is in benchmarks) -------------

def test_deep_nesting_finishes_with_the_right_parents() -> None:
    """SYNTHETIC: 10^5 ops on one thread, each inside the previous one, plus a second thread."""
    from gpuprof.trace.links import nest

    n = 100_000
    ts = np.arange(n, dtype=float)
    dur = 2.0 * (n - np.arange(n))
    ops = pd.DataFrame({"pid": 1, "tid": np.r_[np.zeros(n, np.int64), [2, 2]], "ts": np.r_[ts, [0.0, 1.0]],
                        "dur": np.r_[dur, [5.0, 1.0]]})
    ops["end"] = ops["ts"] + ops["dur"]
    depth, parent = nest(ops.iloc[::-1].reset_index(drop=True))  # any input order
    depth, parent = depth[::-1], parent[::-1]
    m = len(ops) - 1
    assert (depth[:n] == np.arange(n)).all()
    assert (m - parent[1:n] == np.arange(n - 1)).all() and parent[0] == -1
    assert list(depth[n:]) == [0, 1] and parent[n] == -1 and m - parent[n + 1] == n


def test_step_class_times_match_clipping_per_window() -> None:
    """SYNTHETIC random events and windows: the one-sweep class times equal clipping each event to
    each window (the definition), for overlapping windows too."""
    from gpuprof.timeline import CLASSES, exclusive_time, exclusive_times

    rng = np.random.default_rng(7)
    s = rng.uniform(0, 1000, 400)
    e = s + rng.exponential(20, 400)
    c = rng.choice(np.array(CLASSES, dtype=object), 400)
    lo = rng.uniform(0, 900, 30)
    hi = lo + rng.uniform(1, 200, 30)
    got = exclusive_times(s, e, c, lo, hi)
    for i in range(30):
        ss, ee = np.clip(s, lo[i], hi[i]), np.clip(e, lo[i], hi[i])
        taken = np.zeros(0)
        grid = np.unique(np.r_[ss, ee, lo[i], hi[i]])
        mid = (grid[:-1] + grid[1:]) / 2
        seg = np.diff(grid)
        taken = np.zeros(len(seg), dtype=bool)
        for k in CLASSES:
            m = c == k
            active = ((ss[m][:, None] <= mid) & (mid < ee[m][:, None])).any(axis=0)
            assert got[k][i] == pytest.approx(float(seg[active & ~taken].sum()), abs=1e-9)
            taken |= active
        assert got["idle"][i] == pytest.approx(float(seg[~taken].sum()), abs=1e-9)
    assert exclusive_time(s, e, c, float(lo[0]), float(hi[0]))["idle"] == pytest.approx(got["idle"][0])


def test_long_names_are_cut_but_kept_apart(tmp_path: Path) -> None:
    """SYNTHETIC: two kernels whose 1 MB names differ only at their end."""
    from gpuprof.trace.load import MAX_NAME, load_trace

    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    ext = b.op("aten::mm", 1, 5, [[64, 64], [64, 64]], ["float", "float"])
    b.launch("k" * 1_000_000 + "A", 2, 10, 5.0, ext)
    b.launch("k" * 1_000_000 + "B", 3, 20, 5.0, ext)
    t = load_trace(b.write(tmp_path / "t.json"))
    names = t.kernels["name"].astype(str)
    assert names.nunique() == 2 and names.str.len().max() < MAX_NAME + 64
    assert any("longer than" in w for w in t.meta.warnings)


# --- 7. malformed fields: exit 0 or the one-line error naming file and field -------------------

def _mutated(tmp: Path, edit: Any, raw: dict[str, str] | None = None, src: Path = SAMPLES / "tiny_graph.json.gz") -> Path:
    """A real sample trace, decoded, damaged by ``edit``, written again (the sample is untouched);
    ``raw`` swaps placeholder strings for JSON text Python cannot write (10^400, deep nesting)."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    edit(doc)
    text = json.dumps(doc)
    for k, v in (raw or {}).items():
        text = text.replace(json.dumps(k), v)
    p = tmp / "mutated.json"
    p.write_text(text)
    return p


def _events(doc: dict[str, Any], cat: str, n: int = 1) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == cat][:n]


DEEP = "[" * 5000 + "1" + "]" * 5000
TRACE_CASES: dict[str, tuple[Any, dict[str, str], str | None]] = {
    # name: (edit, raw text, None = must analyse | substring of the one-line error)
    "deep JSON": (lambda d: d.update(traceName="@DEEP"), {"@DEEP": DEEP}, "nested too deeply"),
    "deep Input Dims": (lambda d: [e["args"].update({"Input Dims": "@DEEP"}) for e in _events(d, "cpu_op")],
                        {"@DEEP": DEEP}, "nested too deeply"),
    "ProfilerStep#huge": (lambda d: [e.update(name="ProfilerStep#" + "9" * 40) for e in d["traceEvents"]
                                     if str(e.get("name", "")).startswith("ProfilerStep#")], {}, None),
    "dur 1e308": (lambda d: [e.update(dur=1e308) for e in _events(d, "kernel")], {}, "'dur'"),
    "ts 1e308": (lambda d: [e.update(ts=1e308) for e in _events(d, "gpu_memcpy")], {}, "'ts'"),
    "400-digit dur": (lambda d: [e.update(dur="@BIG") for e in _events(d, "cuda_runtime", 3)],
                      {"@BIG": "1" + "0" * 400}, None),
    "400-digit pid": (lambda d: [e.update(pid="@BIG") for e in _events(d, "gpu_user_annotation")],
                      {"@BIG": "1" + "0" * 400}, None),
    "400-digit External id": (lambda d: [e["args"].update({"External id": "@BIG"}) for e in _events(d, "kernel", 5)],
                              {"@BIG": "1" + "0" * 400}, None),
    "no CPU op readable": (lambda d: [e.update(ph=-1) for e in d["traceEvents"] if e.get("cat") == "cpu_op"], {}, None),
    "400-digit baseTimeNanoseconds": (lambda d: d.update(baseTimeNanoseconds="@BIG"), {"@BIG": "1" + "0" * 400},
                                      None),  # a guard: main crashed on it only with decode_b1 (fuzz)
    "list as cat": (lambda d: [e.update(cat=[1, [2]]) for e in _events(d, "cpu_op")], {}, None),
    "totalGlobalMem string": (lambda d: d["deviceProperties"][0].update(name="NVIDIA A100-SXM4-40GB",
                                                                       totalGlobalMem="80GB"), {}, None),
    "numSms string": (lambda d: d["deviceProperties"][0].update(numSms="many"), {}, None),  # a guard: main passes
}


@pytest.mark.parametrize("case", list(TRACE_CASES))
def test_damaged_traces(tmp_path: Path, case: str) -> None:
    edit, raw, error = TRACE_CASES[case]
    p = _mutated(tmp_path, edit, raw)
    r = cli("report", str(p), "--format", "json", "--no-cache")
    if error is None:
        assert r.returncode == 0, r.stderr[-2000:]
        assert "Infinity" not in r.stdout and "NaN" not in r.stdout
        json.loads(r.stdout)
    else:
        one_line_error(r, 3, str(p), error)


def test_input_dims_beyond_int64_have_no_cost_model(tmp_path: Path) -> None:
    def edit(d: dict[str, Any]) -> None:
        for e in d["traceEvents"]:
            if e.get("cat") == "cpu_op" and e.get("args", {}).get("Input Dims"):
                e["args"]["Input Dims"] = [["@BIG", 3], [3, 3]]
    p = _mutated(tmp_path, edit, {"@BIG": "1" + "0" * 400}, src=SAMPLES / "tiny_eager.json.gz")
    a = gpuprof.analyze(p, cache=False)
    doc = json.loads(a.to_json())
    assert all(k["flops"] is None for k in doc["kernels"])


MANIFEST_CASES: dict[str, tuple[Any, str]] = {
    "list manifest": (lambda d: [d], "got list"),
    "nvml a string": (lambda d: d.update(nvml="nvml.csv"), "'nvml'"),
    "nvml.hz a string": (lambda d: d["nvml"].update(hz="fast"), "'nvml.hz'"),
    "nvml.hz zero": (lambda d: d["nvml"].update(hz=0), "'nvml.hz'"),
    "nvml.path a number": (lambda d: d["nvml"].update(path=5), "'nvml.path'"),
    "ranks a dict": (lambda d: d.update(ranks={"0": {}}), "'ranks'"),
    "rank record a string": (lambda d: d.update(ranks=["rank0"]), "'ranks[0]'"),
    "cuda_device a string": (lambda d: d["ranks"][0].update(cuda_device="0"), "'ranks[0].cuda_device'"),
    "cuda_device negative": (lambda d: d["ranks"][0].update(cuda_device=-1), "'ranks[0].cuda_device'"),
    "traces a dict": (lambda d: d.update(traces={"path": "x"}), "'traces'"),
    "trace path a list": (lambda d: d["traces"][0].update(path=["traces/rank0.json.gz"]), "'traces[0].path'"),
    "trace entry a string": (lambda d: d.update(traces=["traces/rank0.json.gz"]), "'traces[0]'"),
    "unprofiled_step_ms a string": (lambda d: d.update(unprofiled_step_ms="11"), "'unprofiled_step_ms'"),
    "deep manifest": (lambda d: d.update(host="@DEEP"), "nested too deeply"),
}


@pytest.mark.parametrize("case", list(MANIFEST_CASES))
def test_damaged_manifests(tmp_path: Path, case: str) -> None:
    run = copy_run(tmp_path)
    edit, error = MANIFEST_CASES[case]
    set_manifest(run, edit)
    if case == "deep manifest":
        m = run / "manifest.json"
        m.write_text(m.read_text().replace('"@DEEP"', DEEP))
    r = cli("report", str(run), "--format", "json", "--no-cache")
    one_line_error(r, 3, "manifest.json", error)


@pytest.mark.parametrize("case", ["missing column", "text in a metric", "text in ts_ns", "no gpu column"])
def test_damaged_nvml_csv(tmp_path: Path, case: str) -> None:
    run = copy_run(tmp_path)
    df = pd.read_csv(run / "nvml.csv")
    if case == "missing column":
        df = df.drop(columns=["clock_event_reasons", "sm_clock_max_mhz"])
    elif case == "text in a metric":
        df["power_w"] = df["power_w"].astype(object)
        df.loc[3, "power_w"] = "lots"
    elif case == "text in ts_ns":
        df["ts_ns"] = df["ts_ns"].astype(object)
        df.loc[3, "ts_ns"] = "soon"
    else:
        df = df.drop(columns=["gpu"])
    df.to_csv(run / "nvml.csv", index=False)
    r = cli("report", str(run), "--format", "json", "--no-cache")
    if case in ("missing column", "text in a metric"):
        assert r.returncode == 0, r.stderr[-2000:]
        assert json.loads(r.stdout)["nvml"][0]["samples"] == len(df)
    else:
        one_line_error(r, 3, "nvml.csv", "'ts_ns'" if case == "text in ts_ns" else "'gpu'")


VALUES: list[Any] = [None, "x", "", -1, 0, -1e9, 1e300, -1e300, 10 ** 30, 2 ** 63, 10 ** 400, -(10 ** 400), [], {},
                     True, [1, [2]], 1.5]
FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
ARGS = ["External id", "correlation", "stream", "device", "grid", "block", "registers per thread", "Input Dims",
        "Input type", "Concrete Inputs", "Input Strides", "bytes", "Collective name", "Group size",
        "est. achieved occupancy %", "Sequence number", "Fwd thread id"]


def test_fuzzed_fields_of_real_traces(tmp_path: Path) -> None:
    """Fields of two real traces (a graph-mode and an eager one) set to wrong types, signs and
    sizes, a seeded sample of the combinations: each result is an analysis whose JSON is strict
    or a GpuprofError naming the file, never another exception."""
    rng = random.Random(15)
    sources = [SAMPLES / "tiny_graph.json.gz", SAMPLES / "tiny_eager.json.gz"]
    docs = {s: json.loads(gzip.decompress(s.read_bytes())) for s in sources}
    failures = []
    for i in range(24):
        src = sources[i % 2]
        doc = json.loads(json.dumps(docs[src]))
        cats = sorted({e.get("cat") for e in doc["traceEvents"] if isinstance(e.get("cat"), str)})
        cat, value = rng.choice(cats), rng.choice(VALUES)
        evs = [e for e in doc["traceEvents"] if e.get("cat") == cat]
        chosen = rng.sample(evs, min(len(evs), rng.choice([1, 3, 1000])))
        if rng.random() < 0.5:
            what = f"{cat}.{rng.choice(FIELDS)}"
            for e in chosen:
                e[what.split(".", 1)[1]] = value
        else:
            what = f"{cat}.args.{rng.choice(ARGS)}"
            for e in chosen:
                if isinstance(e.get("args"), dict):
                    e["args"][what.split(".args.", 1)[1]] = value
        p = tmp_path / f"fuzz{i}.json"
        p.write_text(json.dumps(doc))
        try:
            a = gpuprof.analyze(p, cache=False)
            json.loads(a.to_json(), parse_constant=lambda c: failures.append(f"{what}={value!r}: {c} in JSON"))
            a.to_text()
            a.to_html()
        except GpuprofError as e:
            if str(p) not in str(e) or "\n" in str(e):
                failures.append(f"{what}={value!r}: error without the file: {e}")
        except Exception as e:  # noqa: BLE001 -- the point of the test: nothing else may escape
            failures.append(f"{what}={value!r}: {e.__class__.__name__}: {e}")
    assert not failures, failures


def test_json_report_writes_no_inf_or_nan() -> None:
    """A non-finite number that reaches the document (from evidence built on damaged input) is
    null in the JSON report, not ``Infinity`` and not a ValueError losing the whole report."""
    from gpuprof.reports.json_report import render_json

    text = render_json({"summary": {"step_time_ms": float("inf")},
                        "findings": [{"evidence": {"ratio": float("nan"), "ms": [1.5, -float("inf")]}}]})
    assert json.loads(text) == {"summary": {"step_time_ms": None}, "findings": [{"evidence": {"ratio": None,
                                                                                              "ms": [1.5, None]}}]}
