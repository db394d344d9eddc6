"""Many ranks on a real Dask cluster: a ``dask scheduler`` and ``dask worker`` processes started
here (separate OS processes, TCP on 127.0.0.1, ports chosen by the OS), driven through
``gpuprof report --dask tcp://...`` as a user would.

The 64 rank traces are derived in test code from the real 2-rank DDP pair in sample_traces
(copies with ``distributedInfo`` set to ranks 0-63 of 64; the events are the recorded ones).
Every wait is bounded, so a hang fails the test instead of stalling CI.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SAMPLES

RANKS = 64
START_S = 120  # a loaded 2-core machine starts a scheduler and a worker in seconds; this is the bound
REPORT_S = 900  # 64 ranks, each parsed twice, on two single-threaded workers


class Cluster:
    """A scheduler and workers as separate processes; every process is ended on close."""

    def __init__(self, tmp: Path, workers: int) -> None:
        pytest.importorskip("distributed", reason="dask.distributed is part of the test extra")
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        sched_file = tmp / "scheduler.json"
        log = tmp / "logs"
        log.mkdir(parents=True, exist_ok=True)
        self._start("scheduler", ["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                  "--scheduler-file", str(sched_file)])
        deadline = time.monotonic() + START_S
        while not sched_file.is_file() or not sched_file.read_text().strip():
            self._alive("scheduler")
            if time.monotonic() > deadline:
                raise AssertionError("the Dask scheduler did not start in time")
            time.sleep(0.2)
        self.address: str = json.loads(sched_file.read_text())["address"]
        assert self.address.startswith("tcp://127.0.0.1:")
        for i in range(workers):
            env = {"GPUPROF_CACHE_DIR": str(tmp / f"cache-w{i}")}  # each worker its own parse cache
            self._start(f"w{i}", ["worker", self.address, "--name", f"w{i}", "--nthreads", "1", "--no-nanny",
                                  "--no-dashboard", "--host", "127.0.0.1", "--local-directory", str(tmp / f"w{i}"),
                                  "--death-timeout", "60", "--memory-limit", "0"], env)
        self.worker_addr: dict[str, str] = {}
        from distributed import Client

        with Client(self.address, timeout="30s") as c:  # type: ignore[no-untyped-call]
            c.wait_for_workers(workers, timeout=START_S)
            self.worker_addr = {w["name"]: a for a, w in c.scheduler_info()["workers"].items()}

    def _start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        out = open(self.tmp / "logs" / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "dask", *args], stdout=out, stderr=out,
                                            env={**os.environ, **(env or {})})

    def _alive(self, name: str) -> None:
        if self.procs[name].poll() is not None:
            raise AssertionError(f"dask {name} exited: {(self.tmp / 'logs' / f'{name}.log').read_text()[-2000:]}")

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)  # a worker dying hard: no goodbye to the scheduler
        self.procs[name].wait(timeout=30)

    def processing(self, name: str) -> int:
        """Tasks the scheduler has given the worker ``name`` right now."""
        from distributed import Client

        with Client(self.address, timeout="30s") as c:  # type: ignore[no-untyped-call]
            return len(c.processing().get(self.worker_addr[name], ()))

    def close(self) -> None:
        # Workers first, each gone before the scheduler: a worker that loses its scheduler first
        # waits to reconnect (up to --death-timeout) instead of exiting.
        for name in [*(n for n in self.procs if n != "scheduler"), "scheduler"]:
            p = self.procs[name]
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=30)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 rank traces derived from the real DDP pair (see the module docstring)."""
    d = tmp_path_factory.mktemp("ranks64")
    src = [json.loads(gzip.decompress((SAMPLES / "ddp_good" / f"rank{r}.json.gz").read_bytes())) for r in (0, 1)]
    for r in range(RANKS):
        doc = {**src[r % 2], "distributedInfo": {**src[r % 2].get("distributedInfo", {}), "rank": r,
                                                 "world_size": RANKS}}
        (d / f"rank{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return d


@pytest.fixture(scope="module")
def local_report(ranks: Path) -> dict[str, Any]:
    import gpuprof

    doc: dict[str, Any] = json.loads(gpuprof.analyze(ranks, cache=False).to_json())
    return doc


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, workers=2)
    try:
        yield c
    finally:
        c.close()


def _report(ranks: Path, address: str, tmp: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpuprof.cli", "report", str(ranks), "--format", "json",
                             "--dask", address, "--no-cache"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "GPUPROF_CACHE_DIR": str(tmp / "driver-cache"), **(env or {})})


def test_64_ranks_on_a_scheduler_and_two_workers_equal_the_local_report(
        ranks: Path, local_report: dict[str, Any], cluster: Cluster, tmp_path: Path) -> None:
    p = _report(ranks, cluster.address, tmp_path)
    out, err = p.communicate(timeout=REPORT_S)
    assert p.returncode == 0, err[-3000:]
    doc = json.loads(out)
    assert doc["source"]["ranks"] == list(range(RANKS)) and len(doc["summary"]["per_rank"]) == RANKS
    assert doc == local_report
    assert {f["id"] for f in doc["findings"]} >= {"GP-COMM-001"}  # the cross-rank analysis ran


def test_a_worker_killed_mid_analysis_is_rescheduled(ranks: Path, local_report: dict[str, Any], cluster: Cluster,
                                                     tmp_path: Path) -> None:
    p = _report(ranks, cluster.address, tmp_path)
    try:
        deadline = time.monotonic() + REPORT_S
        while cluster.processing("w1") == 0:  # mid-analysis: w1 holds work when it dies
            assert p.poll() is None, f"the report ended before w1 was given work: {p.stderr.read() if p.stderr else ''}"
            assert time.monotonic() < deadline, "w1 was never given work"
            time.sleep(0.2)
        cluster.kill("w1")
        out, err = p.communicate(timeout=REPORT_S)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=60)
    assert p.returncode == 0, err[-3000:]  # the scheduler ran w1's tasks again on w0
    assert json.loads(out) == local_report


def test_a_cluster_left_without_workers_fails_with_one_line(ranks: Path, tmp_path: Path) -> None:
    c = Cluster(tmp_path, workers=1)
    try:
        p = _report(ranks, c.address, tmp_path, env={"GPUPROF_DASK_TIMEOUT_S": "5"})
        deadline = time.monotonic() + REPORT_S
        while c.processing("w0") == 0:
            assert p.poll() is None and time.monotonic() < deadline, "w0 was never given work"
            time.sleep(0.2)
        c.kill("w0")
        try:
            out, err = p.communicate(timeout=300)  # the 5 s limit, start-up and slack: never a hang
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=60)
    finally:
        c.close()
    lines = [x for x in err.splitlines() if x.strip()]
    assert p.returncode != 0 and out == ""
    assert len(lines) == 1 and "has no workers since 5 s" in lines[0] and c.address in lines[0], err[-3000:]


def test_a_worker_that_cannot_see_a_trace_names_the_path_and_itself(cluster: Cluster) -> None:
    """Traces must be at the same path on every worker (a shared file system); a path the worker
    cannot open (here one that exists nowhere) is named with the worker that tried."""
    from gpuprof.executors import Executor
    from gpuprof.errors import TraceError
    from gpuprof.jobs import Job, part_job

    missing = "/nonexistent-on-workers/traces/rank0.json.gz"
    with Executor(1, None, cluster.address) as ex, pytest.raises(TraceError) as e:
        ex.map(part_job, [Job(missing, 0, False)])
    msg = str(e.value)
    assert msg.startswith(f"{missing}: no such file") and "\n" not in msg
    assert any(f"Dask worker {a}" in msg for a in cluster.worker_addr.values()), msg


def test_local_workers_are_capped_at_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """--workers 32 on 2 CPUs used 5 GB for no speed: at most one process per CPU."""
    from gpuprof import executors

    monkeypatch.setattr(executors, "cpu_count", lambda: 2)
    for asked in (32, None):
        with executors.Executor(64, asked, None) as ex:
            assert ex.pool is not None and ex.pool._max_workers == 2
    with executors.Executor(64, 1, None) as ex:
        assert ex.pool is None  # one: in this process
    with executors.Executor(1, 32, None) as ex:
        assert ex.pool is None  # never more processes than ranks


def test_dask_tasks_run_with_the_string_storage_of_the_process_that_sent_them(cluster: Cluster) -> None:
    """gpuprof.strings: a task on a real Dask worker runs with the driver's pandas string storage
    (the CLI's Python storage), so ranks analysed there come back in the driver's."""
    import pandas as pd

    from gpuprof import strings
    from gpuprof.executors import Executor

    with pd.option_context(strings.OPTION, "python"), Executor(1, None, cluster.address) as ex:
        assert ex.map(pd.get_option, [strings.OPTION]) == ["python"]
