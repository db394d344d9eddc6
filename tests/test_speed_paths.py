"""Work done once: the report cache, the views' claims from the first analysis, one pass when a
run folder's recorded step time is impossible, and the loader's columns (issue 14)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gpuprof
from tests.conftest import SAMPLES

ROOT = Path(__file__).resolve().parents[1]

# A cached report in a fresh process: prints it and says which heavy modules were imported.
_CACHED = r"""
import sys
from gpuprof.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    heavy = sorted(m for m in ("pandas", "numpy", "pyarrow", "gpuprof.analyzers", "gpuprof.api") if m in sys.modules)
    print("IMPORTED:" + ",".join(heavy), file=sys.stderr)
"""


def _report(path: Path, env: dict[str, str], *extra: str) -> tuple[str, list[str]]:
    r = subprocess.run([sys.executable, "-c", _CACHED, "report", str(path), "--format", "json", *extra],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("IMPORTED:"))
    return r.stdout, [m for m in line[len("IMPORTED:"):].split(",") if m]


def test_a_second_json_report_is_the_stored_one_and_imports_no_pandas(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "GPUPROF_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    trace = tmp_path / "t.json.gz"
    shutil.copy(SAMPLES / "gpt_bf16.json.gz", trace)
    first, heavy_first = _report(trace, env)
    assert "pandas" in heavy_first  # (the first one analysed it)
    again, heavy = _report(trace, env)
    assert again == first and heavy == []
    # other options, or other bytes under the same name: analysed, never the stored report
    other, heavy_other = _report(trace, env, "--step-ms", "9.5")
    assert other != first and "pandas" in heavy_other
    assert json.loads(other)["summary"]["unprofiled_step_time_ms"] == 9.5
    shutil.copy(SAMPLES / "gpt_fp32.json.gz", trace)
    replaced, _ = _report(trace, env)
    fresh, _ = _report(SAMPLES / "gpt_fp32.json.gz", {**env, "GPUPROF_CACHE_DIR": str(tmp_path / "other")})
    doc, want = json.loads(replaced), json.loads(fresh)
    assert doc["findings"] == want["findings"] and doc["summary"] == want["summary"]


def test_a_damaged_stored_report_is_recomputed(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "GPUPROF_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    trace = tmp_path / "t.json.gz"
    shutil.copy(SAMPLES / "tiny_eager.json.gz", trace)
    first, _ = _report(trace, env)
    for f in (tmp_path / "cache" / "results").glob("*.msgpack"):
        f.write_bytes(b"\x80garbage")
    again, heavy = _report(trace, env)
    assert again == first and "pandas" in heavy


def _count(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    calls = [0]
    real = getattr(module, name)

    def counted(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("name", ["gpt_host_sync.json.gz", "vision_pinned.json.gz", "ddp_slow_rank"])
def test_views_claims_come_from_the_first_analysis(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The claims the views draw are those the analysis made and kept (no second run of the
    analyzers), in this process and where the ranks were analysed in worker processes alike."""
    import gpuprof.jobs as jobs
    from gpuprof import views

    a = gpuprof.analyze(SAMPLES / name, cache=False, keep_traces=True)
    apart = gpuprof.analyze(SAMPLES / name, cache=False, workers=2)
    assert a.findings and all(a.claims)
    reruns = _count(monkeypatch, jobs, "analyse_rank")
    kept = views.claims(a, a.ranks)
    again = views.claims(apart, apart.ranks)  # claims made in another process, sent back with the findings
    a.views_detail(), apart.views_detail()
    assert reruns[0] == 0 and len(kept)
    assert kept.equals(again)


def test_an_impossible_recorded_step_time_is_dropped_in_one_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """SYNTHETIC manifest on a real run (as tests/test_numbers.py): 5.05 ms recorded where the
    kernels alone take ~10.2 ms per step. The analyzers run once, and the report equals the
    run folder's without any recorded step time (the notice aside)."""
    import gpuprof.jobs as jobs

    def run_with(step: float | None) -> Path:
        run = tmp_path / f"run-{step}"
        shutil.copytree(SAMPLES / "run_vision_workers", run)
        m = json.loads((run / "manifest.json").read_text())
        if step is None:
            m.pop("unprofiled_step_ms", None)
        else:
            m["unprofiled_step_ms"] = step
        (run / "manifest.json").write_text(json.dumps(m))
        return run

    calls = _count(monkeypatch, jobs, "analyse_rank")
    bad = gpuprof.analyze(run_with(5.05), cache=False)
    assert calls[0] == 1 and any("5.05 ms" in n and "not used" in n for n in bad.notices)
    none = gpuprof.analyze(run_with(None), cache=False)
    a, b = bad.to_dict(), none.to_dict()
    for d in (a, b):
        d["warnings"] = [w for w in d["warnings"] if "5.05 ms" not in w]
        d["source"].pop("run_folder")
        d["source"].pop("paths")
    assert a == b


@pytest.mark.parametrize("folder", ["ddp_slow_rank", "ddp_manual_allreduce"])
def test_a_small_job_of_ranks_is_analysed_in_process_each_rank_loaded_once(folder: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Real 2-rank DDP samples, default workers, no cache, a real step time below the traced one
    (so the cross-rank findings replay the job and detail the slow rank): no worker process is
    started and each rank is parsed once, though its summary, the job's replay graph, its
    findings and the HTML views all read it; the report, claims and views equal those made with
    two worker processes, where each pass loads the rank again."""
    import concurrent.futures

    import gpuprof.jobs as jobs
    import gpuprof.pipeline as pipeline
    from gpuprof import views
    from gpuprof.executors import IN_PROCESS_MAX_BYTES, job_bytes
    from gpuprof.runfolder import find_traces

    path = SAMPLES / folder
    real = 0.7 * gpuprof.analyze(path, cache=False).summary["step_time_ms"]
    apart = gpuprof.analyze(path, cache=False, workers=2, step_ms=real)
    pooled = apart.to_dict()
    views.claims(apart, apart.ranks), apart.views_detail()  # (loads the ranks again, before the pool is refused)
    assert job_bytes(find_traces([path])) <= IN_PROCESS_MAX_BYTES

    def no_pool(*a: Any, **k: Any) -> Any:
        raise AssertionError("a worker process was started")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_pool)
    loads = _count(monkeypatch, jobs, "load_trace_cached")
    graphs = _count(monkeypatch, pipeline, "graph_job")
    analysed = _count(monkeypatch, pipeline, "rank_job")
    here = gpuprof.analyze(path, cache=False, step_ms=real)
    assert loads[0] == 2 and graphs[0] == 2 and analysed[0] == 2
    assert here.to_dict() == pooled and pooled["findings"]
    # the views read the frames the analysis loaded, and the claims it kept with them
    want = views.claims(apart, apart.ranks)
    reruns = _count(monkeypatch, jobs, "analyse_rank")
    assert views.claims(here, here.ranks).equals(want) and reruns[0] == 0
    assert here.views_detail() == apart.views_detail() and loads[0] == 2


def test_a_job_over_the_bound_stays_in_process_where_workers_cannot_run_in_parallel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``IN_PROCESS_MAX_BYTES`` a job goes to worker processes only with CPUs enough for them
    to pay (``PARALLEL_MIN_CPUS``), and stays here only while holding it takes at most half the
    memory available: measured on 2 CPUs, 8 ranks of 44 MB took 1.8x the CPU in two workers."""
    from gpuprof import executors

    gib = 2**30
    monkeypatch.setattr(executors, "available_memory", lambda: 10 * gib)
    monkeypatch.setattr(executors, "cpu_count", lambda: 2)
    assert executors.in_process(executors.IN_PROCESS_MAX_BYTES)
    assert executors.in_process(2 * gib)  # 4 GiB held of 10 available
    assert not executors.in_process(3 * gib)  # 6 GiB: more than half of it
    monkeypatch.setattr(executors, "available_memory", lambda: None)
    assert not executors.in_process(executors.IN_PROCESS_MAX_BYTES + 1)  # unknown memory: the bound
    monkeypatch.setattr(executors, "available_memory", lambda: 10 * gib)
    monkeypatch.setattr(executors, "cpu_count", lambda: executors.PARALLEL_MIN_CPUS)
    assert executors.in_process(executors.IN_PROCESS_MAX_BYTES)
    assert not executors.in_process(executors.IN_PROCESS_MAX_BYTES + 1)


def test_available_memory_is_read_on_linux() -> None:
    from gpuprof.executors import available_memory

    if not Path("/proc/meminfo").exists():
        pytest.skip("no /proc/meminfo: not Linux")
    free = available_memory()
    assert free is not None and 0 < free < 2**50


def test_a_big_job_on_two_cpus_starts_no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real 2-rank DDP sample taken as over the in-process bound on a 2-CPU machine with
    memory to spare: analysed here (no pool), each rank loaded once."""
    import concurrent.futures

    import gpuprof.jobs as jobs
    from gpuprof import executors

    monkeypatch.setattr(executors, "IN_PROCESS_MAX_BYTES", 0)
    monkeypatch.setattr(executors, "cpu_count", lambda: 2)
    monkeypatch.setattr(executors, "available_memory", lambda: 2**40)

    def no_pool(*a: Any, **k: Any) -> Any:
        raise AssertionError("a worker process was started")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_pool)
    loads = _count(monkeypatch, jobs, "load_trace_cached")
    a = gpuprof.analyze(SAMPLES / "ddp_slow_rank", cache=False)
    assert loads[0] == 2 and a.to_dict()["findings"]


def test_loader_columns_on_a_chunk_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Columns built a chunk at a time join up exactly, whatever the chunk size: names coded in
    order of first appearance across chunks, record_function ranges moved to the annotations."""
    import dataclasses

    from gpuprof.trace import chunks, columnar, load

    path = SAMPLES / "gpt_bf16.json.gz"
    whole = load.load_trace(path)  # (the native scanner's, where it is compiled: one pass, no chunks)
    monkeypatch.setattr(columnar, "scan", lambda data: None)  # the msgspec path, which decodes in chunks
    monkeypatch.setattr(chunks, "CHUNK_EVENTS", 997)  # a prime: buckets split unevenly between chunks
    chunked = load.load_trace(path)
    assert dataclasses.asdict(whole.meta) == dataclasses.asdict(chunked.meta)
    for f in ("kernels", "memcpys", "ops", "runtime", "annotations", "steps", "collectives", "python", "memory"):
        x, y = getattr(whole, f), getattr(chunked, f)
        assert list(x.columns) == list(y.columns), f
        for c in x.columns:
            if hasattr(x[c], "cat"):
                assert list(x[c].cat.categories) == list(y[c].cat.categories), (f, c)
        assert x.equals(y), f


def test_a_folder_of_rank_traces_is_stored_by_its_listing(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "GPUPROF_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    ranks = tmp_path / "ranks"
    shutil.copytree(SAMPLES / "ddp_good", ranks)
    first, _ = _report(ranks, env)
    again, heavy = _report(ranks, env)
    assert again == first and heavy == []
    (ranks / "rank1.json.gz").unlink()  # another listing: analysed again
    one, heavy_one = _report(ranks, env)
    assert "pandas" in heavy_one and len(json.loads(one)["source"]["paths"]) == 1


@pytest.mark.parametrize("bad", [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 3.0, "dur": 1.0, "args": 5},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 3.0, "dur": 1.0, "args": "x"},
    {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 1, "tid": 1, "ts": 3.0, "args": [1]},
    {"ph": "X", "cat": "python_function", "name": "f.py(1): g", "pid": 1, "tid": 1, "ts": 3.0, "dur": 1.0,
     "args": 2.5},
])
def test_args_decoded_per_bucket_refuse_what_a_whole_decode_refused(tmp_path: Path, bad: dict[str, Any]) -> None:
    """Each bucket's args are decoded after the events (into a struct of that bucket's fields):
    args that are not an object, in a bucket's event or in an event of no bucket, still fail the
    load with the whole decode's words, naming the event (synthetic trace, built here)."""
    from gpuprof.errors import TraceError
    from gpuprof.trace import load

    op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0,
          "args": {"External id": 3, "Input Dims": [[2, 2]]}}
    path = tmp_path / "t.json"
    # three ops that differ (events repeated exactly are counted once: gpuprof.trace.integrity)
    ops = [dict(op, ts=t, args={"External id": 3 + i, "Input Dims": [[2, 2]]}) for i, t in enumerate((1.0, 5.0, 8.0))]
    path.write_text(json.dumps({"traceEvents": [ops[0], ops[1], bad, ops[2]]}))
    with pytest.raises(TraceError) as e:
        load.load_trace(path)
    got = str(e.value)
    assert "not a Kineto trace: Expected `object | null`" in got and "at `$[2].args`" in got, got
    good = dict(bad, args={"External id": 9})
    path.write_text(json.dumps({"traceEvents": [ops[0], ops[1], good, ops[2]]}))
    assert len(load.load_trace(path).ops) == 3 + (good["cat"] == "cpu_op")


def test_the_cli_analyses_with_python_strings_and_the_api_keeps_the_callers_setting(tmp_path: Path) -> None:
    """gpuprof.strings: `gpuprof report` sets its own process's string storage to Python's (a real
    sample trace, in this process through click); a call of the API leaves the caller's as it was."""
    import pandas as pd
    from click.testing import CliRunner

    from gpuprof import strings
    from gpuprof.cli import main

    before = pd.get_option(strings.OPTION)
    try:
        pd.set_option(strings.OPTION, "auto")
        gpuprof.analyze(SAMPLES / "gpt_host_sync.json.gz", cache=False)
        assert pd.get_option(strings.OPTION) == "auto"
        r = CliRunner().invoke(main, ["report", str(SAMPLES / "gpt_host_sync.json.gz"), "--format", "json",
                                      "--no-cache", "-o", str(tmp_path / "r.json")])
        assert r.exit_code == 0, r.output
        assert pd.get_option(strings.OPTION) == strings.OWN and json.loads((tmp_path / "r.json").read_text())
        assert pd.Index(["a"]).dtype == "str"  # the same dtype, in the Python storage
    finally:
        pd.set_option(strings.OPTION, before)


def test_a_command_freezes_its_imports_for_the_analysis_and_gives_them_back(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """gpuprof.owned: during `gpuprof report` (and annotate, diff) the objects the imports made are
    out of the collector's reach (gc.freeze); when the command ends they are given back, so a
    command run in another program (here: click's runner in pytest's process) leaves the collector
    as it found it; a process that froze objects itself keeps them frozen; the API freezes nothing."""
    import gc

    from click.testing import CliRunner

    from gpuprof.cli import main

    real = gpuprof.analyze
    seen: list[int] = []

    def spy(*a: Any, **k: Any) -> Any:
        seen.append(gc.get_freeze_count())
        return real(*a, **k)

    monkeypatch.setattr(gpuprof, "analyze", spy)
    trace = str(SAMPLES / "gpt_host_sync.json.gz")
    assert gc.get_freeze_count() == 0
    gpuprof.analyze(trace, cache=False)
    assert seen == [0]
    r = CliRunner().invoke(main, ["report", trace, "--format", "json", "--no-cache", "-o", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    assert seen[1] > 10_000 and gc.get_freeze_count() == 0  # pandas' and numpy's objects, then given back
    r = CliRunner().invoke(main, ["diff", trace, trace, "--format", "json", "-o", str(tmp_path / "d.json")])
    assert r.exit_code == 0, r.output
    assert seen[2] > 10_000 and gc.get_freeze_count() == 0
    gc.freeze()  # someone else's freeze: left as it is
    try:
        frozen = gc.get_freeze_count()
        r = CliRunner().invoke(main, ["report", trace, "--format", "json", "--no-cache", "-o", str(tmp_path / "s.json")])
        assert r.exit_code == 0, r.output
        assert frozen > 0 and gc.get_freeze_count() > frozen // 2  # not given back (some died since)
    finally:
        gc.unfreeze()


def test_local_workers_run_with_the_string_storage_of_the_process_that_started_them() -> None:
    """Two real worker processes asked for their pandas string storage: the parent's, whichever
    it is (so a rank analysed in a worker comes back in the parent's storage)."""
    import pandas as pd

    from gpuprof import executors, strings

    for storage in ("python", "pyarrow"):
        if storage == "pyarrow" and importlib.util.find_spec("pyarrow") is None:
            continue
        with pd.option_context(strings.OPTION, storage), executors.Executor(2, 2, None) as ex:
            if ex.pool is None:
                pytest.skip("one CPU: no worker processes to start")
            assert ex.map(pd.get_option, [strings.OPTION, strings.OPTION]) == [storage, storage]


_BLAS_PROBE = r"""
import ctypes, json, os, sys
from gpuprof.cli import main
env_before = os.environ.get("OPENBLAS_NUM_THREADS")
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    libs = sorted({line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line.split("/")[-1]})
    threads = None
    for lib in libs:
        handle = ctypes.CDLL(lib)
        for sym in ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
                    "openblas_get_num_threads"):
            if hasattr(handle, sym):
                threads = getattr(handle, sym)()
                break
    print(json.dumps({"libs": libs, "threads": threads, "env": [env_before, os.environ.get("OPENBLAS_NUM_THREADS")]}))
"""


@pytest.mark.parametrize("setting", [None, "3"])
def test_the_cli_loads_openblas_with_one_thread_and_leaves_the_environment_as_it_was(tmp_path: Path,
                                                                                     setting: str | None) -> None:
    """gpuprof.owned: a real `gpuprof report` in a fresh process loads numpy's OpenBLAS with one
    thread (its idle workers only burn CPU: the analysis makes no BLAS call), whatever the caller
    set, and puts OPENBLAS_NUM_THREADS back as it was, so nothing it starts inherits the change.
    Asked of the library itself (its get_num_threads); skipped where numpy bundles no OpenBLAS."""
    import os

    if not Path("/proc/self/maps").exists():
        pytest.skip("reads the loaded libraries from /proc/self/maps (Linux)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if setting is not None:
        env["OPENBLAS_NUM_THREADS"] = setting
    r = subprocess.run([sys.executable, "-c", _BLAS_PROBE, "report", str(SAMPLES / "gpt_host_sync.json.gz"),
                        "--format", "json", "--no-cache", "-o", str(tmp_path / "r.json")],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    if not seen["libs"] or seen["threads"] is None:
        pytest.skip(f"numpy loaded no OpenBLAS with a known get_num_threads here ({seen['libs']})")
    assert seen["threads"] == 1 and seen["env"] == [setting, setting]
    assert json.loads((tmp_path / "r.json").read_text())["schema_version"] == 1
