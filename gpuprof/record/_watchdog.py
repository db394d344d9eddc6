"""The recorder's watchdog: the program dies with its recorder, however the recorder dies.

``gpuprof record`` starts this file (``python -I -S _watchdog.py FD RUN_DIR KILL_AFTER``) before
it starts the program. It forks once and the first process exits, so the watchdog is no child of
the recorder (whose waiting for the program's processes it must not hold up) and, in a session of
its own, ignoring SIGINT, SIGTERM and SIGHUP, is not reached by what stops the recorder's group.
It then blocks reading the pipe FD, whose only write end the recorder holds: the recorder writes
``pgid N`` once the program runs and ``done`` once every process of the program has ended. End of
file without ``done`` means the recorder died (``kill -9``, the OOM killer, a crash): the watchdog
then sends SIGTERM to the program's processes, so that each flushes its profiled window and its
rank record (the hook turns SIGTERM into a normal exit), and SIGKILL to whatever still runs
KILL_AFTER seconds later.

The program's processes are those whose environment holds ``GPUPROF_RUN_DIR=RUN_DIR`` (every
process the program starts inherits it, whatever its parent, session or process group: torchrun's
workers run in sessions of their own and, once the recorder is gone, are no longer its
descendants), and every member of the program's process group. Only the standard library is used
(``-I -S``: nothing of the program's environment is imported), and nothing is written to the run
folder: what the processes wrote stays, and a run folder without ``manifest.json`` is analysed
from its traces and rank records.
"""

import os
import signal
import sys
import time

POLL_S = 0.1


def _processes(marker: bytes, pgid: "int | None") -> "set[int]":
    """Live processes of the recorded program (zombies have no environment and are left out)."""
    me, out = os.getpid(), set()
    try:
        names = os.listdir("/proc")
    except OSError:
        names = []
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if not env:
            continue  # a zombie, or a kernel thread
        if marker in env.split(b"\0"):
            out.add(pid)
            continue
        if pgid is not None:
            try:
                if os.getpgid(pid) == pgid:
                    out.add(pid)
            except OSError:
                pass
    return out


def _signal(pids: "set[int]", pgid: "int | None", signum: int) -> None:
    if pgid is not None:
        try:
            os.killpg(pgid, signum)
        except OSError:
            pass
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def _say(msg: str) -> None:
    try:
        os.write(2, f"gpuprof: {msg}\n".encode())
    except OSError:
        pass  # the terminal is gone with the recorder


def stop_program(marker: bytes, pgid: "int | None", kill_after: float) -> None:
    pids = _processes(marker, pgid)
    if not pids:
        return
    _say(f"the recorder died; stopping the program's {len(pids)} process(es) (SIGTERM, then SIGKILL after "
         f"{kill_after:g} s); its run folder keeps the traces written, without a manifest")
    _signal(pids, pgid, signal.SIGTERM)
    deadline = time.monotonic() + kill_after
    while pids and time.monotonic() < deadline:
        time.sleep(POLL_S)
        fresh = _processes(marker, pgid)
        _signal(fresh - pids, None, signal.SIGTERM)  # started meanwhile
        pids = fresh
    for _ in range(100):  # SIGKILL until nothing is left (a fork can race one round)
        if not pids:
            return
        _signal(pids, pgid, signal.SIGKILL)
        time.sleep(POLL_S)
        pids = _processes(marker, pgid)


def main(argv: "list[str]") -> int:
    fd, run_dir, kill_after = int(argv[1]), argv[2], float(argv[3])
    if os.fork() != 0:
        os._exit(0)  # the recorder waits for this first process; the watchdog is re-parented away
    os.setsid()
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    marker = f"GPUPROF_RUN_DIR={run_dir}".encode()
    pgid, done, buf = None, False, b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except InterruptedError:
            continue
        except OSError:
            chunk = b""
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            word, _, value = line.decode("ascii", "replace").partition(" ")
            if word == "pgid":
                pgid = int(value)
            elif word == "done":
                done = True
    if not done:
        stop_program(marker, pgid, kill_after)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
