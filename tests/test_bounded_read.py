"""Bounded reading (#15): only regular files are read, and gzip expansion is bounded.

Every input here is SYNTHETIC, built in the test: a FIFO, /dev/zero, a folder, a gzip bomb
(concatenated members of zeros), and real sample traces re-read under a low ratio limit.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprof.errors import SpecError, TraceError
from gpuprof import files
from gpuprof.trace import load
from tests.conftest import SAMPLES


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuprof.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def _one_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return lines[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")
def test_fifo_device_and_folder_are_refused_in_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)  # nobody ever writes: reading it would block forever
    for p, what in ((fifo, "a FIFO"), (Path("/dev/zero"), "a device")):
        with pytest.raises(TraceError, match=f"not a regular file \\({what}\\)"):
            load.read_bytes(p)
        r = _cli("report", str(p), "--format", "json")
        assert r.returncode == 3 and str(p) in _one_line(r) and what in _one_line(r)
    with pytest.raises(TraceError, match="is a folder"):
        files.read_file(tmp_path)
    spec = tmp_path / "spec.json"
    os.mkfifo(spec)
    with pytest.raises(SpecError, match="not a regular file"):
        from gpuprof.specs import load_spec_file

        load_spec_file(spec)
    r = _cli("report", str(SAMPLES / "tiny_eager.json.gz"), "--gpu-spec", str(spec), "--format", "json", "--no-cache")
    assert r.returncode == 4 and "spec.json: not a regular file (a FIFO)" in _one_line(r)


def test_gzip_bomb_fails_fast_in_little_memory(tmp_path: Path) -> None:
    """8 MB of gzip that would expand to 8 GB: refused after at most a few hundred MB of output,
    in about a second, with a line naming the file and the override."""
    member = gzip.compress(bytes(200 << 20), 9)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(member * 40)
    assert bomb.stat().st_size < 9 << 20
    code = ("import resource, sys, time\n"
            "from pathlib import Path\n"
            "from gpuprof.trace.load import read_bytes\n"
            "from gpuprof.errors import TraceError\n"
            "t = time.perf_counter()\n"
            "try:\n    read_bytes(Path(sys.argv[1]))\nexcept TraceError as e:\n    print(e)\n"
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    r = subprocess.run([sys.executable, "-c", code, str(bomb)], capture_output=True, text=True, timeout=120)
    msg, stats = r.stdout.strip().splitlines()
    seconds, rss_kb = (float(x) for x in stats.split())
    assert "bomb.json.gz: gzip data expands more than 200x" in msg and "GPUPROF_GUNZIP_MAX_RATIO=0" in msg
    assert rss_kb < 400 * 1024 and seconds < 10
    r = _cli("report", str(bomb), "--format", "json", "--no-cache")
    assert r.returncode == 3 and "expands more than 200x" in _one_line(r)


def test_ratio_limit_and_its_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real sample (about 13x) read with the free allowance at 0: refused under a 5x limit,
    read under the default and with the limit off (0), identical to gzip's own output."""
    raw = (SAMPLES / "gpt_bf16.json.gz").read_bytes()
    want = gzip.decompress(raw)
    monkeypatch.setattr(files, "GUNZIP_FREE_BYTES", 0)
    assert load.decompress(Path("t.gz"), raw) == want
    monkeypatch.setenv("GPUPROF_GUNZIP_MAX_RATIO", "5")
    with pytest.raises(TraceError, match="t.gz: gzip data expands more than 5x"):
        load.decompress(Path("t.gz"), raw)
    monkeypatch.setenv("GPUPROF_GUNZIP_MAX_RATIO", "0")
    assert load.decompress(Path("t.gz"), raw) == want
    monkeypatch.setenv("GPUPROF_GUNZIP_MAX_RATIO", "lots")
    with pytest.raises(TraceError, match="GPUPROF_GUNZIP_MAX_RATIO must be a number"):
        load.decompress(Path("t.gz"), raw)


def test_gzip_edge_cases(tmp_path: Path) -> None:
    """Concatenated members and zero padding read as gzip reads them; truncation and trailing
    garbage are one clear error each."""
    a, b = b'{"traceEvents": [' * 1000, b"]}"
    assert load.decompress(Path("x"), gzip.compress(a) + gzip.compress(b)) == a + b
    assert load.decompress(Path("x"), gzip.compress(a) + b"\0" * 16) == a
    assert load.decompress(Path("x"), b"plain json") == b"plain json"
    with pytest.raises(TraceError, match="truncated gzip stream"):
        load.decompress(Path("x"), gzip.compress(a)[:-6])
    with pytest.raises(TraceError, match="garbage after the gzip stream"):
        load.decompress(Path("x"), gzip.compress(a) + b"junk")
    with pytest.raises(TraceError, match="corrupt gzip data"):
        load.decompress(Path("x"), b"\x1f\x8b\x08\xffgarbage-garbage")
