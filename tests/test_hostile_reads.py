"""Hostile inputs that gpuprof reads (issue #28, second round): every file it opens (a trace, a
run manifest, a rank record, the NVML samples, a cache entry) is read one way
(:func:`gpuprof.files.read`): a regular file, inside its folder, bounded, by content.

The run folder is a real one (``sample_traces/h200/run_gpt_bf16``) copied and then damaged in
code (FIFOs, links, bombs made here); the re-encoded traces are a real sample converted in the
test. Each subprocess has a timeout and a memory limit: a hang or a blow-up fails the test.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import resource
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SAMPLES

ENV = {**os.environ, "NO_COLOR": "1"}
RUN = SAMPLES / "run_gpt_bf16"
MEMORY_LIMIT = 3 << 30


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuprof.cli", *args], capture_output=True, text=True,
                          env={**ENV, **(env or {})}, timeout=timeout, preexec_fn=_limit)


def one_line(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr[-2000:]
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


def copy_run(tmp: Path, manifest: bool = True) -> Path:
    run = tmp / "run"
    shutil.copytree(RUN, run)
    if not manifest:
        (run / "manifest.json").unlink()
    return run


def bomb(kind: str) -> bytes:
    """About 1 MB (gzip) or less (bzip2, xz) that would expand to 1 GB of CSV-looking bytes."""
    body = b"ts_ns,gpu\n" + b"1,0\n" * (256 << 20)
    return {"gzip": lambda: gzip.compress(body, 9), "bzip2": lambda: bz2.compress(body, 9),
            "xz": lambda: lzma.compress(body)}[kind]()


# --- 5. what a killed recorder left: rank records --------------------------------------------

@pytest.mark.parametrize("how", ["fifo", "dev_zero", "outside"])
def test_rank_records_are_read_bounded_and_inside_the_folder(tmp_path: Path, how: str) -> None:
    """A run folder without its manifest: the rank record is a FIFO (had hung), a link to
    /dev/zero (had grown to 6 GB) or a link out of the folder (had been read). It is skipped, said
    so, and the traces are still analysed."""
    run = copy_run(tmp_path, manifest=False)
    (run / "traces" / "rank0.meta.json").unlink()
    rec = run / "traces" / "rank0.meta.json"
    if how == "fifo":
        os.mkfifo(rec)
    elif how == "dev_zero":
        rec.symlink_to("/dev/zero")
    else:
        secret = tmp_path / "secret.json"  # the real record, moved out: read, it would set the step time
        secret.write_text((RUN / "traces" / "rank0.meta.json").read_text().replace('"rank"', '"leaked": "outside", "rank"', 1))
        rec.symlink_to(secret)
    r = cli("report", str(run), "--format", "json", "--no-cache", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["summary"]["steps"] > 0 and "outside" not in r.stdout
    assert doc["summary"]["unprofiled_step_time_ms"] is None  # the record was not read


def test_a_manifest_that_leads_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    run = copy_run(tmp_path)
    outside = tmp_path / "elsewhere.json"
    shutil.move(run / "manifest.json", outside)
    (run / "manifest.json").symlink_to(outside)
    one_line(cli("report", str(run), "--format", "json", "--no-cache"), 3, "manifest.json", "leads outside")
    (run / "manifest.json").unlink()
    os.mkfifo(run / "manifest.json")
    one_line(cli("report", str(run), "--format", "json", "--no-cache", timeout=60), 3, "a FIFO")


# --- 6. the NVML samples, decompressed by content and bounded --------------------------------

@pytest.mark.parametrize("kind", ["gzip", "bzip2", "xz"])
def test_nvml_bombs_fail_in_one_line_within_bounded_memory(tmp_path: Path, kind: str) -> None:
    """The manifest names ``nvml.csv.gz`` (``.bz2``, ``.xz``): a small file that would expand to a
    GB (pandas had decompressed it by its name: 2.9 GB from 1.1 MB)."""
    run = copy_run(tmp_path)
    name = {"gzip": "nvml.csv.gz", "bzip2": "nvml.csv.bz2", "xz": "nvml.csv.xz"}[kind]
    (run / name).write_bytes(bomb(kind))
    doc = json.loads((run / "manifest.json").read_text())
    doc["nvml"]["path"] = name
    (run / "manifest.json").write_text(json.dumps(doc))
    one_line(cli("report", str(run), "--format", "json", "--no-cache", timeout=120), 3, name, "expands more than")


def test_nvml_is_read_by_content_not_by_name(tmp_path: Path) -> None:
    """A gzipped CSV named nvml.csv and a plain one named nvml.csv.gz both read as the samples."""
    want = cli("report", str(RUN), "--format", "json", "--no-cache")
    assert want.returncode == 0
    run = copy_run(tmp_path)
    csv = (run / "nvml.csv").read_bytes()
    (run / "nvml.csv").write_bytes(gzip.compress(csv))
    got = cli("report", str(run), "--format", "json", "--no-cache")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["nvml"] == json.loads(want.stdout)["nvml"]
    (run / "nvml.csv").unlink()
    (run / "nvml.csv.gz").write_bytes(csv)
    doc = json.loads((run / "manifest.json").read_text())
    doc["nvml"]["path"] = "nvml.csv.gz"
    (run / "manifest.json").write_text(json.dumps(doc))
    got = cli("report", str(run), "--format", "json", "--no-cache")
    assert got.returncode == 0 and json.loads(got.stdout)["nvml"] == json.loads(want.stdout)["nvml"]


# --- 7. cache entries ------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["fifo", "dev_zero"])
def test_a_planted_cache_entry_never_hangs_nor_grows(tmp_path: Path, how: str) -> None:
    cache = tmp_path / "cache"
    env = {"GPUPROF_CACHE_DIR": str(cache)}
    first = cli("report", str(SAMPLES / "tiny_eager.json.gz"), "--format", "text", env=env)
    assert first.returncode == 0
    (entry,) = list((cache / "frames").iterdir())
    for f in ("meta.json", "kernels.parquet"):
        (entry / f).unlink()
        if how == "fifo":
            os.mkfifo(entry / f)
        else:
            (entry / f).symlink_to("/dev/zero")
    again = cli("report", str(SAMPLES / "tiny_eager.json.gz"), "--format", "text", env=env, timeout=120)
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr[-2000:]
    for r in (cache / "results").iterdir():  # results read the same way
        r.unlink()
        os.mkfifo(r) if how == "fifo" else r.symlink_to("/dev/zero")
    again = cli("report", str(SAMPLES / "tiny_eager.json.gz"), "--format", "json", env=env, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]


# --- 13. encodings and containers are named ---------------------------------------------------

def _encoded(raw: bytes, how: str) -> bytes:
    if how == "utf8_bom":
        return b"\xef\xbb\xbf" + raw
    if how in ("utf16", "utf16_nobom", "utf32"):
        text = raw.decode("utf-8")
        return {"utf16": text.encode("utf-16"), "utf16_nobom": text.encode("utf-16-le"),
                "utf32": text.encode("utf-32")}[how]
    if how == "zip":
        sink = io.BytesIO()
        with zipfile.ZipFile(sink, "w") as z:
            z.writestr("trace.json", raw)
        return sink.getvalue()
    if how == "zstd":
        return b"(\xb5/\xfd" + b"\0" * 64  # the zstd frame magic, then anything
    if how == "gzip_of_gzip":
        return gzip.compress(gzip.compress(raw))
    if how == "bzip2":
        return bz2.compress(raw)
    if how == "xz":
        return lzma.compress(raw)
    raise AssertionError(how)


@pytest.mark.parametrize("how,needle", [
    ("utf16", "UTF-16"), ("utf16_nobom", "UTF-16"), ("utf32", "UTF-32"), ("zip", "a zip archive"),
    ("zstd", "zstd-compressed"), ("gzip_of_gzip", "compressed twice")])
def test_other_encodings_and_containers_are_named(tmp_path: Path, how: str, needle: str) -> None:
    raw = gzip.decompress((SAMPLES / "tiny_eager.json.gz").read_bytes())
    t = tmp_path / "t.json"
    t.write_bytes(_encoded(raw, how))
    one_line(cli("report", str(t), "--format", "json", "--no-cache"), 3, "t.json", needle)


@pytest.mark.parametrize("how", ["utf8_bom", "bzip2", "xz"])
def test_a_bom_and_other_compressions_read_as_the_trace(tmp_path: Path, how: str) -> None:
    raw = gzip.decompress((SAMPLES / "tiny_eager.json.gz").read_bytes())
    plain = tmp_path / "plain.json"
    plain.write_bytes(raw)
    t = tmp_path / "t.json"
    t.write_bytes(_encoded(raw, how))
    a, b = (cli("report", str(p), "--format", "text", "--no-cache") for p in (plain, t))
    assert a.returncode == 0 and b.returncode == 0, b.stderr
    assert a.stdout.replace("plain.json", "t.json") == b.stdout
