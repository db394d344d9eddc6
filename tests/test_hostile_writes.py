"""Hostile output paths (issue #28, second round): nothing gpuprof writes ever replaces what it
read or anything but a regular file, and reports started together never collide on a name.

The traces are real samples copied into a temporary folder (renamed, linked, never edited);
FIFOs and links are made here.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SAMPLES

ENV = {**os.environ, "NO_COLOR": "1"}


def cli(*args: str, cwd: Path | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuprof.cli", *args], capture_output=True, text=True, env=ENV,
                          cwd=cwd, **kw)


def refused(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr[-2000:]
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


def tree(d: Path) -> dict[str, str]:
    """Every file under ``d`` by relative path: its kind and, for regular files, a hash of its bytes."""
    out = {}
    for p in sorted(d.rglob("*")):
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode):
            out[str(p.relative_to(d))] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif not stat.S_ISDIR(st.st_mode):
            out[str(p.relative_to(d))] = f"mode {stat.S_IFMT(st.st_mode):o}"
    return out


def test_annotate_into_the_input_folder_never_replaces_another_ranks_trace(tmp_path: Path) -> None:
    """Rank traces named against their rank (rank1.json.gz holds rank 0): annotating the folder
    into itself with --force would write rank0.json.gz over rank 1's input. Refused before any
    file is written."""
    d = tmp_path / "ranks"
    d.mkdir()
    shutil.copy(SAMPLES / "ddp_slow_rank" / "rank0.json.gz", d / "rank1.json.gz")
    shutil.copy(SAMPLES / "ddp_slow_rank" / "rank1.json.gz", d / "rank0.json.gz")
    before = tree(d)
    refused(cli("annotate", str(d), "-o", str(d), "--force", "--no-cache"), "input trace", "never writes over")
    assert tree(d) == before
    r = cli("report", str(d), "--format", "json", "-o", str(tmp_path / "r.json"), "--annotated", str(d), "--force",
            "--no-cache")
    refused(r, "input trace")
    assert tree(d) == before
    out = tmp_path / "ann"  # another folder is fine
    assert cli("annotate", str(d), "-o", str(out), "--no-cache").returncode == 0
    assert sorted(p.name for p in out.iterdir()) == ["rank0.json.gz", "rank1.json.gz"] and tree(d) == before


@pytest.mark.parametrize("fmt", ["json", "text", "html"])
def test_report_never_replaces_its_input(tmp_path: Path, fmt: str) -> None:
    t = tmp_path / "t.json.gz"
    shutil.copy(SAMPLES / "tiny_eager.json.gz", t)
    before = tree(tmp_path)
    refused(cli("report", str(t), "--format", fmt, "-o", str(t), "--force", "--no-cache"), "never writes over")
    # the same file by another spelling, and a hard link to it
    refused(cli("report", str(t), "--format", fmt, "-o", str(tmp_path / "." / "t.json.gz"), "--force", "--no-cache"))
    os.link(t, tmp_path / "hard.json.gz")
    before = tree(tmp_path)
    refused(cli("report", str(t), "--format", fmt, "-o", str(tmp_path / "hard.json.gz"), "--force", "--no-cache"))
    assert tree(tmp_path) == before


def test_a_link_given_as_input_is_protected_as_is_its_target(tmp_path: Path) -> None:
    t = tmp_path / "t.json.gz"
    shutil.copy(SAMPLES / "tiny_eager.json.gz", t)
    (tmp_path / "link.json.gz").symlink_to(t)
    before = tree(tmp_path)
    for out in ("link.json.gz", "t.json.gz"):
        refused(cli("report", str(tmp_path / "link.json.gz"), "--format", "json", "-o", str(tmp_path / out), "--force",
                    "--no-cache"))
    assert tree(tmp_path) == before and (tmp_path / "link.json.gz").is_symlink()


def test_an_output_link_is_replaced_never_followed(tmp_path: Path) -> None:
    """-o naming a link to a file of the user's (not an input): the link is replaced, what it
    pointed to is untouched."""
    keep = tmp_path / "precious.txt"
    keep.write_text("mine")
    (tmp_path / "out.json").symlink_to(keep)
    r = cli("report", str(SAMPLES / "tiny_eager.json.gz"), "--format", "json", "-o", str(tmp_path / "out.json"),
            "--force", "--no-cache")
    assert r.returncode == 0, r.stderr
    assert keep.read_text() == "mine" and not (tmp_path / "out.json").is_symlink()
    assert '"schema_version"' in (tmp_path / "out.json").read_text()


def test_run_folder_files_are_never_replaced(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "run_gpt_bf16", run)
    before = tree(run)
    for name in ("manifest.json", "nvml.csv", "traces/rank0.json.gz"):
        refused(cli("report", str(run), "--format", "json", "-o", str(run / name), "--force", "--no-cache"),
                "never writes over")
    assert tree(run) == before
    r = cli("report", str(run), "--format", "json", "-o", str(run / "report.json"), "--no-cache")
    assert r.returncode == 0 and (run / "report.json").is_file()  # a new file beside them is fine


def test_diff_never_replaces_either_input(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    shutil.copy(SAMPLES / "tiny_eager.json.gz", a)
    shutil.copy(SAMPLES / "tiny_graph.json.gz", b)
    before = tree(tmp_path)
    for target in (a, b):
        for fmt in ("text", "json", "html"):
            refused(cli("diff", str(a), str(b), "--format", fmt, "-o", str(target), "--force"), "never writes over")
    assert tree(tmp_path) == before


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_only_regular_files_are_replaced(tmp_path: Path, kind: str) -> None:
    """As root, ``-o /dev/null --force`` had turned /dev/null into a regular file. The device here
    is a node of /dev/null's own numbers made in the test's folder, so that a regression replaces
    that node, never the machine's /dev/null."""
    if kind == "fifo":
        target = tmp_path / "pipe"
        os.mkfifo(target)
    elif kind == "device":
        target = tmp_path / "null"
        try:
            os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs root (CAP_MKNOD)")
    else:
        target = tmp_path / "d"
        target.mkdir()
    mode = stat.S_IFMT(os.lstat(target).st_mode)
    for cmd in (["report", str(SAMPLES / "tiny_eager.json.gz"), "--format", "json", "--no-cache"],
                ["report", str(SAMPLES / "tiny_eager.json.gz"), "--format", "html", "--no-cache"],
                ["annotate", str(SAMPLES / "tiny_eager.json.gz"), "--no-cache"],
                ["diff", str(SAMPLES / "tiny_eager.json.gz"), str(SAMPLES / "tiny_graph.json.gz"), "--format", "json"]):
        r = cli(*cmd, "-o", str(target), "--force", timeout=300)
        refused(r, str(target))
        assert stat.S_IFMT(os.lstat(target).st_mode) == mode
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_reports_started_together_take_distinct_names(tmp_path: Path) -> None:
    """Four HTML reports at once with no -o, and a dangling link at the default name: each takes
    the next free name, none fails, the link is left as it was."""
    (tmp_path / "gpuprof-report.html").symlink_to(tmp_path / "nowhere")
    procs = [subprocess.Popen([sys.executable, "-m", "gpuprof.cli", "report", str(SAMPLES / "tiny_eager.json.gz"),
                               "--no-cache"], cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    written = sorted(e.strip().splitlines()[-1].removeprefix("wrote ") for e in errs)
    assert written == [f"gpuprof-report-{n}.html" for n in range(1, 5)], errs
    assert (tmp_path / "gpuprof-report.html").is_symlink() and not (tmp_path / "nowhere").exists()
    assert all("<html" in (tmp_path / w).read_text()[:2000].lower() for w in written)


def test_a_refused_output_is_said_before_the_analysis(tmp_path: Path) -> None:
    """`report -o` and `diff -o` naming a file that exists (no --force), or a folder, are refused
    before the traces are read: the input here is not a trace at all, so an analysis run first
    would fail on it instead (a real sample checks that it would)."""
    garbage = tmp_path / "not_a_trace.json"
    garbage.write_text("{ this is not json")
    out = tmp_path / "report.json"
    out.write_text("the user's own file\n")
    refused(cli("report", str(garbage), "--format", "json", "-o", str(out), "--no-cache"), "report.json", "exists")
    refused(cli("report", str(garbage), "--format", "json", "-o", str(tmp_path), "--no-cache"), "is a folder")
    refused(cli("diff", str(garbage), str(garbage), "--format", "json", "-o", str(out)), "report.json", "exists")
    assert out.read_text() == "the user's own file\n"
    fresh = cli("report", str(garbage), "--format", "json", "-o", str(tmp_path / "new.json"), "--no-cache")
    assert fresh.returncode != 0 and "not_a_trace.json" in fresh.stderr, fresh.stderr
    assert not (tmp_path / "new.json").exists()
