"""Hostile stops and sizes (issue #28, second round, items 8 and 12): a report killed the way
``timeout``, SLURM and CI kill it leaves no worker behind, and no terminal width makes it grow.

The report runs on two SYNTHETIC ranks (``tests/test_numbers.py``'s 60k-launch trace, twice)
in two worker processes, local or a local Dask cluster; the test waits until the workers are
analysing, signals the report, and polls ``/proc`` until every process it had started is gone
(a zombie counts as gone: it holds no memory, and only its parent, gone too, could reap it).
main had left both pool workers alive and blocked (~130 MB each, still there after 128 s).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import SAMPLES
from tests.test_numbers import _big_trace, _children, _cpu_s

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to see the workers")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ranks")
    _big_trace(d / "a.json")
    (d / "b.json").write_bytes((d / "a.json").read_bytes())
    return d


def _tree(pid: int) -> list[int]:
    out = []
    for c in _children(pid):
        out += [c, *_tree(c)]
    return out


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start(ranks: Path, tmp: Path, how: str) -> tuple[subprocess.Popen[bytes], list[int]]:
    """The report on two worker processes (``how``: "pool" or "dask"), once both are analysing;
    with its process tree then. Output goes to files: workers that outlived it would hold pipes."""
    backend = ["--workers", "2"] + (["--dask", "local"] if how == "dask" else [])
    env = {**os.environ, "NO_COLOR": "1", "GPUPROF_CACHE_DIR": str(tmp / "cache")}
    with (tmp / "out").open("wb") as out, (tmp / "err").open("wb") as err:
        p = subprocess.Popen([sys.executable, "-m", "gpuprof.cli", "report", str(ranks), "--as-ranks", "--no-cache",
                              "--format", "json", *backend], stdout=out, stderr=err, env=env, start_new_session=True)
    # Forked pool workers start with gpuprof imported; Dask's spawned ones import it first (~1.5 s of CPU).
    busy = 0.3 if how == "pool" else 2.5
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and p.poll() is None:
        workers = [c for c in _children(p.pid) if _cpu_s(c) > busy]
        if len(workers) >= 2:
            break
        time.sleep(0.05)
    assert p.poll() is None, "finished before it could be stopped"
    return p, _tree(p.pid)


def _all_gone(pids: list[int], within: float = 120) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(_running(q) for q in pids):
        time.sleep(0.1)
    return [q for q in pids if _running(q)]


def _reap(pids: list[int]) -> None:
    for q in pids:  # a failed test must not leave its workers running
        if _running(q):
            os.kill(q, signal.SIGKILL)


@pytest.mark.parametrize("how,to", [("pool", "parent"), ("pool", "group"), ("dask", "parent")])
def test_sigterm_stops_the_report_and_its_workers(ranks: Path, tmp_path: Path, how: str, to: str) -> None:
    """SIGTERM, to the report alone or to its process group: one line, exit 143 (128 + SIGTERM),
    as Ctrl-C gives 130; no worker left. main died of the signal (-15), its pool workers running."""
    p, tree = _start(ranks, tmp_path, how)
    try:
        if to == "group":
            os.killpg(p.pid, signal.SIGTERM)
        else:
            os.kill(p.pid, signal.SIGTERM)
        code = p.wait(timeout=120)
        left = _all_gone(tree)
        err = (tmp_path / "err").read_text()
        assert code == 143, (code, err[-2000:])
        assert err.strip() == "gpuprof: terminated", err[-2000:]
        assert (tmp_path / "out").read_bytes() == b""
        assert not left, f"still running after the report ended: {left}"
    finally:
        _reap([p.pid, *tree])


@pytest.mark.parametrize("how", ["pool", "dask"])
def test_sigkill_of_the_report_takes_its_workers_with_it(ranks: Path, tmp_path: Path, how: str) -> None:
    """``kill -9`` of the report (the OOM killer, a scheduler's last word): its workers die with
    it (pool: PR_SET_PDEATHSIG; Dask's own workers watch their parent, as they did on main)."""
    p, tree = _start(ranks, tmp_path, how)
    try:
        os.kill(p.pid, signal.SIGKILL)
        assert p.wait(timeout=60) == -signal.SIGKILL
        left = _all_gone(tree)
        assert not left, f"workers outlived the report: {left}"
    finally:
        _reap([p.pid, *tree])


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def test_a_huge_terminal_width_is_capped() -> None:
    """``COLUMNS=100000000`` had written 650 MB at a 3.5 GB peak: the summary is written at
    :data:`gpuprof.cli.MAX_WIDTH` columns at most, as on a terminal that wide."""
    from gpuprof.cli import MAX_WIDTH

    def text(columns: int) -> str:
        r = subprocess.run([sys.executable, "-m", "gpuprof.cli", "report", str(SAMPLES / "tiny_eager.json.gz"),
                            "--format", "text", "--no-cache"], capture_output=True, text=True, timeout=120,
                           check=False, env={**os.environ, "NO_COLOR": "1", "COLUMNS": str(columns)}, preexec_fn=_limit)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout

    huge = text(100_000_000)
    assert max(map(len, huge.splitlines())) <= MAX_WIDTH and len(huge) < 100_000
    assert huge == text(MAX_WIDTH)
