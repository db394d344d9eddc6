"""`gpuprof record` stops everything it started (#28 items 9 and 10), on plain Python programs:

- a program that ignores SIGTERM is killed (SIGKILL) ``--kill-after`` seconds after the signal was
  passed on, with the processes it runs in other sessions;
- ``kill -9`` of the recorder takes the program's whole tree with it (its own process, a child in
  a session of its own that ignores SIGTERM, a grandchild), and what was recorded stays: the
  trace and the rank record, a folder ``gpuprof report`` reads without a manifest;
- orphans that die while the program runs are reaped at once: 600 short-lived grandchildren leave
  no zombie behind (today they all stay zombies until the program ends).

Every wait polls with a generous deadline: the machine running the suite may be busy.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.test_record import FAST, LONG, alive, manifest, trace_recorded, wait_progress, write


def until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} (waited {timeout:g} s)")


def read_pid(path: Path, timeout: float = 120) -> int:
    until(lambda: path.is_file() and path.read_text().strip().isdigit(), timeout, f"no pid in {path}")
    return int(path.read_text())


def start(tmp: Path, *cmd: str, opts: list[str] = FAST) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpuprof.cli", "record", "--out", str(tmp / "run"), *opts, "--",
                             *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)


def cleanup(p: subprocess.Popen[str], *pids: int) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    if p.poll() is None:
        p.kill()
    p.communicate()


def watchdogs(run: Path) -> list[int]:
    """Live watchdog processes of the recording into ``run``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmd = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(c.endswith(b"_watchdog.py") for c in cmd) and str(run).encode() in cmd and alive(int(name)):
                out.append(int(name))
    return out


# A program that ignores SIGTERM and starts a child in a session of its own that ignores it too
# (as torchrun starts its workers), each writing its pid.
IGNORES_TERM = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)", sys.argv[2]],
                 start_new_session=True)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(600)
"""


def test_a_program_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    prog = write(tmp_path, "stubborn.py", IGNORES_TERM)
    p = start(tmp_path, sys.executable, str(prog), str(tmp_path / "main.pid"), str(tmp_path / "child.pid"),
              opts=["--kill-after", "2"])
    main, child = read_pid(tmp_path / "main.pid"), read_pid(tmp_path / "child.pid")
    try:
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)  # the recorder before the fix waited here for ever
        assert p.returncode == 128 + signal.SIGKILL, err
        assert time.time() - t0 < 100 and not alive(main) and not alive(child)
        assert err.count("passed SIGTERM on to the program; what still runs 2 s later is killed (SIGKILL") == 1, err
        m = manifest(tmp_path, "run")
        assert m["exit_code"] == 137 and m["signal"] == signal.SIGKILL
        (note,) = [f for f in m["failures"] if f.startswith("killed the program's processes")]
        assert "still running 2 s after SIGTERM was passed on" in note and str(main) in note and str(child) in note
        until(lambda: not watchdogs(tmp_path / "run"), 30, "the watchdog outlived the recording")
    finally:
        cleanup(p, main, child)


def test_kill_9_of_the_recorder_takes_the_program_with_it_and_keeps_its_trace(tmp_path: Path) -> None:
    prog = write(tmp_path, "long.py", LONG)
    p = start(tmp_path, sys.executable, str(prog), str(tmp_path / "progress"), "0.01")
    pid = wait_progress(tmp_path / "progress", 12)  # past the profiled window (steps 9-10 with FAST)
    run = tmp_path / "run"
    meta = run / "traces" / "rank0.meta.json"
    try:
        until(lambda: trace_recorded(meta), 120, "no trace recorded")
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        until(lambda: not alive(pid), 90, "the program outlived its recorder")
        assert (run / "traces" / "rank0.json.gz").is_file() and not (run / "manifest.json").exists()
        rec = json.loads(meta.read_text())  # SIGTERM from the watchdog: the hook wrote its record on exit
        assert rec["trace"] == "traces/rank0.json.gz" and rec["status"] == "complete"
        rep = subprocess.run([sys.executable, "-m", "gpuprof.cli", "report", str(run), "--format", "json"],
                             capture_output=True, text=True, timeout=300)
        assert rep.returncode == 0, rep.stderr[-2000:]
        assert json.loads(rep.stdout)["summary"]["steps"] == 2
    finally:
        cleanup(p, pid)


def test_kill_9_of_the_recorder_takes_the_whole_tree(tmp_path: Path) -> None:
    """The program's own process, a grandchild in its process group, and a grandchild in a session
    of its own that ignores SIGTERM (torchrun's workers): all end, SIGKILL after --kill-after."""
    stubborn = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)")
    shell = (f'setsid "{sys.executable}" -c "{stubborn}" "{tmp_path / "session.pid"}" & '
             f'sleep 600 & echo $! > "{tmp_path / "sleep.pid"}"; echo $$ > "{tmp_path / "bash.pid"}"; wait')
    p = start(tmp_path, "bash", "-c", shell, opts=["--kill-after", "2"])
    pids = [read_pid(tmp_path / f"{n}.pid") for n in ("bash", "sleep", "session")]
    try:
        assert all(alive(x) for x in pids)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        until(lambda: not any(alive(x) for x in pids), 90,
              f"processes outlived their recorder: {[x for x in pids if alive(x)]}")
        until(lambda: not watchdogs(tmp_path / "run"), 30, "the watchdog outlived the program")
    finally:
        cleanup(p, *pids)


ORPHANS = """
import os, sys, time
for i in range(600):  # each child leaves a grandchild that outlives it by 20 ms, then ends
    if os.fork() == 0:
        if os.fork() == 0:
            time.sleep(0.02)
            os._exit(0)
        os._exit(0)
    os.waitpid(-1, 0)
open(sys.argv[1], "w").write(str(os.getpid()))
deadline = time.time() + 300
while not os.path.exists(sys.argv[2]) and time.time() < deadline:
    time.sleep(0.05)
"""


def zombies_of(pid: int) -> int:
    n = 0
    for kid in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            n += Path(f"/proc/{kid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            pass
    return n


def test_orphans_are_reaped_while_the_program_runs(tmp_path: Path) -> None:
    prog = write(tmp_path, "orphans.py", ORPHANS)
    stop = tmp_path / "stop"
    p = start(tmp_path, sys.executable, str(prog), str(tmp_path / "spawned"), str(stop))
    try:
        read_pid(tmp_path / "spawned")
        until(lambda: zombies_of(p.pid) == 0, 60, f"{zombies_of(p.pid)} zombies under the recorder")
        stop.write_text("")
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    finally:
        stop.write_text("")
        cleanup(p)


def test_a_normal_run_leaves_no_watchdog(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "gpuprof.cli", "record", "--out", str(tmp_path / "run"), "--",
                        sys.executable, "-c", "print('hi')"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "hi\n", r.stderr  # capture_output ends once the watchdog has gone
    assert not watchdogs(tmp_path / "run") and "watchdog" not in r.stderr
