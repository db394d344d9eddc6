"""The ``gpuprof record`` parent: run the program, sample NVML, write the run folder.

The program runs unchanged as a child process (no shell), in a process group of its own, with
only the bootstrap directory prepended to PYTHONPATH (the bootstrap finds gpuprof itself, so the
folder gpuprof lives in, a checkout with its ``reports/`` and ``tests/``, never shadows the
program's modules). SIGINT, SIGTERM and SIGHUP are passed on to that whole group, as a terminal
passes Ctrl-C to every process of a job (``bash -c "python train.py; ..."`` stops python too).

The manifest is written only once every process the program started has ended: gpuprof is the
child subreaper on Linux (``PR_SET_CHILD_SUBREAPER``), so processes orphaned by the program come
to it, and a thread reaps every child as it ends (a program that leaves hundreds of short-lived
orphans leaves no zombie); no child left means the whole tree has ended, so a trace written by a
grandchild after its parent died lands before the manifest. After a passed-on signal, gpuprof says
in one line that whatever still runs ``kill_after`` seconds later is killed, and then kills it
(SIGKILL to the group and to every process below gpuprof, the program's own process included:
a program that ignores SIGTERM is stopped too); the manifest says so. If gpuprof itself dies
(``kill -9``), its watchdog (:mod:`gpuprof.record._watchdog`) stops the program's processes
(SIGTERM, so each writes its window and record; SIGKILL ``kill_after`` s later): the program
never outlives its recorder, and the run folder keeps what was written, without a manifest.
gpuprof exits with the program's exit code (128 + N when signal N ended it).

The run folder is claimed atomically (a second ``record`` into the same folder fails, and an
existing non-empty ``--out`` is refused: a run is never overwritten). A command that cannot be
started is refused before anything is created (exit 127 when not found, 126 when not executable,
as a shell would): nothing ran, so no run folder is left to be mistaken for a recording.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprof.errors import GpuprofError, UsageError
from gpuprof.record import manifest
from gpuprof.record.nvml import Sampler, load_nvml

BOOT = Path(__file__).resolve().parent / "_boot"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class CommandError(GpuprofError):
    """The command cannot be started; exit codes as a POSIX shell's (127 not found, 126 not executable)."""

    def __init__(self, message: str, path: str | None = None, exit_code: int = 127) -> None:
        super().__init__(message, path)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Options:
    out: Path | None = None
    skip: int = 5
    timed: int | None = None  # None: until the steady state (window.py); N: exactly N steps
    wait: int = 1
    warmup: int = 2
    active: int = 3
    repeat: int = 1
    nvml_hz: float = 20.0
    nvml: bool = True
    gpm: bool = True
    nvml_counters: bool = True
    with_stack: bool = False
    record_shapes: bool = True
    kill_after: float = 60.0


def _claim(d: Path) -> None:
    """Make ``traces/``: the one step that two recorders into the same folder cannot both pass."""
    try:
        (d / "traces").mkdir()
    except FileExistsError:
        raise UsageError("is already in use by another gpuprof record (choose a new --out)", str(d)) from None
    except OSError as e:
        raise UsageError(f"cannot write in the run folder ({e.strerror})", str(d)) from None


def new_run_dir(out: Path | None, base: Path = Path("gpuprof_runs")) -> tuple[Path, bool]:
    """Create and claim the run folder: ``out`` if new or empty, else a fresh time-stamped one
    under ``base``. Returns the folder and whether gpuprof created it."""
    if out is not None:
        created = False
        try:
            out.mkdir(parents=True)
            created = True
        except FileExistsError:
            if not out.is_dir():
                raise UsageError("exists and is not a folder; --out takes a new or empty folder", str(out)) from None
            try:
                if any(out.iterdir()):
                    raise UsageError("exists and is not empty; gpuprof never writes over a run (choose a new --out)",
                                     str(out))
            except OSError as e:
                raise UsageError(f"cannot read the folder ({e.strerror})", str(out)) from None
        except OSError as e:
            raise UsageError(f"cannot create the run folder ({e.strerror})", str(out)) from None
        _claim(out)
        return out, created
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in range(1000):
        d = base / (stamp if i == 0 else f"{stamp}-{i}")
        try:
            d.mkdir(parents=True)
        except FileExistsError:
            continue
        except OSError as e:
            raise UsageError(f"cannot create a run folder ({e.strerror}); choose one with --out", str(base)) from None
        _claim(d)
        return d, True
    raise UsageError("could not create a new run folder", str(base))


def resolve_command(cmd: list[str], env: dict[str, str]) -> str:
    """The executable ``cmd[0]`` names, looked up as a shell would, or a :class:`CommandError`."""
    name = cmd[0]
    if os.sep in name:
        if not os.path.exists(name):
            raise CommandError("no such file", name)
        if os.path.isdir(name) or not os.access(name, os.X_OK):
            raise CommandError("is not an executable file", name, exit_code=126)
        return name
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    if found is None:
        raise CommandError("command not found", name)
    return found


def _gpus(nv: Any) -> list[dict[str, Any]]:
    out = []
    try:
        driver = nv.nvmlSystemGetDriverVersion()
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            out.append({"index": i, "name": nv.nvmlDeviceGetName(h), "uuid": nv.nvmlDeviceGetUUID(h), "driver": driver})
    except Exception as e:
        out.append({"error": str(e)})
    return out


def _visible(env: dict[str, str]) -> list[int] | None:
    v = env.get("CUDA_VISIBLE_DEVICES")
    if v is None or v.strip() == "":
        return None
    try:
        return [int(x) for x in v.split(",") if x.strip()]
    except ValueError:
        return None  # UUIDs or MIG names: sample every GPU


def _remove_unused(run_dir: Path, created: bool) -> None:
    """Undo a run folder whose program never started: only what gpuprof itself put there."""
    for p in (run_dir / "nvml.csv", run_dir / "traces", run_dir):
        if p == run_dir and not created:
            break
        with contextlib.suppress(OSError):
            p.rmdir() if p.is_dir() else p.unlink()


def record(cmd: list[str], opts: Options) -> int:
    """Run ``cmd`` under the recorder; return its exit code (the run folder is always written)."""
    if not cmd:
        raise UsageError("no command to record: gpuprof record [OPTIONS] -- CMD ARGS...")
    env = dict(os.environ)
    resolve_command(cmd, env)  # before the folder exists: a command that cannot start leaves nothing
    run_dir, created = new_run_dir(opts.out)
    run_dir = run_dir.resolve()
    # Kineto leaves CUPTI's callbacks subscribed after the profiler stops unless asked to tear it
    # down; the rest of the run then launches every kernel slower (docs/collector.md). The user's
    # own setting wins; torch itself sets 0 in-process where CUDA graphs need it.
    teardown_source = "environment" if "TEARDOWN_CUPTI" in env else "gpuprof"
    env.setdefault("TEARDOWN_CUPTI", "1")
    env["PYTHONPATH"] = os.pathsep.join([str(BOOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(GPUPROF_RUN_DIR=str(run_dir), GPUPROF_RECORD_SHAPES="1" if opts.record_shapes else "0",
               GPUPROF_WITH_STACK="1" if opts.with_stack else "0",
               GPUPROF_SCHEDULE=",".join(str(x) for x in (opts.skip, -1 if opts.timed is None else opts.timed, opts.wait, opts.warmup,
                                                             opts.active, opts.repeat)))
    base: dict[str, Any] = {
        "command": cmd, "cwd": os.getcwd(), "host": platform.node(), "start_ns": time.time_ns(),
        "profiler": {"skip_steps": opts.skip, "timed_steps": opts.timed,
                     "timing_rule": "steady" if opts.timed is None else "fixed",
                     "schedule": {"wait": opts.wait, "warmup": opts.warmup, "active": opts.active, "repeat": opts.repeat},
                     "record_shapes": opts.record_shapes, "with_stack": opts.with_stack,
                     "teardown_cupti": {"value": env["TEARDOWN_CUPTI"], "set_by": teardown_source}},
        "failures": [],
    }
    group = _Group(opts.kill_after, run_dir)  # starts the watchdog, then becomes the subreaper
    sampler: Sampler | None = None
    nvml_info: dict[str, Any] = {"enabled": opts.nvml}
    if opts.nvml:
        try:
            nv = load_nvml()
            base["gpus"] = _gpus(nv)
            sampler = Sampler(run_dir / "nvml.csv", opts.nvml_hz, nv, _visible(env), gpm=opts.gpm,
                              fields=opts.nvml_counters)
            sampler.start()
            nvml_info.update(path="nvml.csv", hz=opts.nvml_hz, devices=sampler.devices)
        except Exception as e:
            nvml_info["error"] = f"NVML unavailable ({e.__class__.__name__}: {e}); recorded without GPU samples"
            print(f"gpuprof: {nvml_info['error']}", file=sys.stderr)
    try:
        try:
            code, sig = group.run(cmd, env)
        except OSError as e:  # it passed resolve_command, yet exec failed (a script without #!, a race)
            group.watchdog.done()
            if sampler is not None:
                sampler.stop()
            _remove_unused(run_dir, created)
            raise CommandError(f"could not start ({e.strerror})", cmd[0],
                               exit_code=127 if isinstance(e, FileNotFoundError) else 126) from None
        base["end_ns"] = time.time_ns()
        base["failures"].extend(group.notes)
        if sampler is not None:
            sampler.stop()
            steady = (round(100 * sampler.steady_cpu_seconds / sampler.steady_seconds, 3)
                      if sampler.steady_seconds > 0 else None)
            nvml_info.update(samples=sampler.samples, unavailable=sampler.off, read_periods_s=sampler.periods_s,
                             sampler_cpu_pct_after_first_second=steady,
                             read_cost_us={g: round(v, 1) for g, v in sampler.group_us.items()},
                             sampler_cpu_pct_of_one_core=round(100 * sampler.cpu_seconds /
                                                               max((base["end_ns"] - base["start_ns"]) / 1e9, 1e-9), 3))
        base.update(exit_code=code, signal=sig, nvml=nvml_info)
        doc = manifest.build(run_dir, base, manifest.collect_ranks(run_dir), manifest.collect_idle(run_dir))
        try:
            manifest.write_json_atomic(run_dir / "manifest.json", doc)
        except OSError as e:
            print(f"gpuprof: error: {run_dir / 'manifest.json'}: cannot write the manifest ({e.strerror})",
                  file=sys.stderr)
            return code or 3
    finally:
        group.restore()
    print(f"gpuprof: run folder {run_dir} ({len(doc['traces'])} trace(s)); report: gpuprof report {run_dir}",
          file=sys.stderr)
    for f in doc["failures"]:
        print(f"gpuprof: note: {f}", file=sys.stderr)
    return code


def _become_subreaper() -> bool:
    """Ask Linux to give gpuprof the program's orphaned processes (so they can be waited for)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(36, 1, 0, 0, 0) == 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    """Live processes whose parent is gpuprof (the program's orphans, once it is the subreaper)."""
    me, out = os.getpid(), []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{me}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{me}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        return sorted(set(out))
    return out


def _descendants() -> list[int]:
    """Every process below gpuprof (children, theirs, ... in any session or group), from ``/proc``."""
    kids: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces
                kids.setdefault(ppid, []).append(int(name))
    out, todo = [], list(kids.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return sorted(out)


class _Watchdog:
    """The process that stops the program if gpuprof itself dies (``_watchdog.py``)."""

    def __init__(self, run_dir: Path, kill_after: float) -> None:
        self.fd: int | None = None
        self.error: str | None = None
        r, w = os.pipe()  # not inheritable: the program never holds the write end
        try:
            subprocess.run([sys.executable, "-I", "-S", str(Path(__file__).with_name("_watchdog.py")), str(r),
                            str(run_dir), repr(kill_after)], pass_fds=(r,), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, check=True, timeout=60)
            self.fd = w
        except (OSError, subprocess.SubprocessError) as e:
            os.close(w)
            self.error = (f"no watchdog ({e.__class__.__name__}: {e}): if gpuprof itself is killed, the program "
                          f"keeps running")
        finally:
            os.close(r)

    def tell(self, line: str) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.write(self.fd, f"{line}\n".encode())

    def done(self) -> None:
        """Every process of the program has ended: the watchdog leaves without stopping anything."""
        self.tell("done")
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _Group:
    """The program's processes: started, signalled, reaped as they end, waited for to the last one,
    and killed if they outlive a passed-on signal by ``kill_after`` seconds or outlive gpuprof."""

    def __init__(self, kill_after: float, run_dir: Path) -> None:
        self.kill_after = kill_after
        self.pgid: int | None = None
        self.signalled_at: float | None = None
        self.signals: list[int] = []
        self.notes: list[str] = []
        self.old: dict[int, Any] = {}
        self.pending: list[int] = []
        self.watchdog = _Watchdog(run_dir, kill_after)  # before the subreaper: it must not be re-parented to us
        if self.watchdog.error:
            self.notes.append(self.watchdog.error)
        self.subreaper = _become_subreaper()
        self.status: int | None = None  # the program's own process's wait status, once reaped
        self.ended_at: float | None = None
        self.reaped = 0  # processes reaped besides the program's own (its orphans)
        self.all_ended = threading.Event()

    def _send(self, signum: int) -> None:
        if self.pgid is None:
            self.pending.append(signum)  # arrived while the program was being started
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)
        for pid in _children():  # orphans that left the group (their own session, as torchrun's workers)
            with contextlib.suppress(OSError):
                if os.getpgid(pid) != self.pgid:
                    os.kill(pid, signum)

    def forward(self, signum: int, frame: Any) -> None:
        """The signal handler (main thread): pass the signal on; the main loop says so and escalates."""
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
        self.signals.append(signum)
        self._send(signum)

    def restore(self) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)
        self.old = {}

    def run(self, cmd: list[str], env: dict[str, str]) -> tuple[int, int | None]:
        # Handlers first: a signal that arrives while the program starts is passed on, not lost.
        self.old = {s: signal.signal(s, self.forward) for s in FORWARDED}
        if sys.version_info >= (3, 11):
            child = subprocess.Popen(cmd, env=env, process_group=0)
        else:  # pragma: no cover - Python 3.10
            child = subprocess.Popen(cmd, env=env, preexec_fn=os.setpgrp)  # noqa: PLW1509
        self.pgid = child.pid
        self.watchdog.tell(f"pgid {child.pid}")
        for s in self.pending:
            self._send(s)
        threading.Thread(target=self._reap, args=(child,), name="gpuprof-reaper", daemon=True).start()
        self._wait(cmd[0], child.pid)
        assert self.status is not None  # _wait returns once the reaper has seen the program end
        rc = os.waitstatus_to_exitcode(self.status)
        child.returncode = rc  # reaped here, not by Popen
        self.watchdog.done()
        if rc < 0:
            return 128 - rc, -rc
        return rc, None

    def _reap(self, child: subprocess.Popen[bytes]) -> None:
        """Reaper thread: wait for every child as it ends, the program's orphans included (gpuprof is
        their subreaper), so none stays a zombie; no child left at all means the program's whole
        tree has ended (an orphan of the program comes to gpuprof before its parent is gone)."""
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == child.pid:
                self.status, self.ended_at = status, time.monotonic()
                if not self.subreaper:
                    break  # orphans go to init: only the group can be watched (_group_alive)
            else:
                self.reaped += 1
        self.all_ended.set()

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.pgid or 0, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def _kill_all(self) -> list[int]:
        """SIGKILL the program's group and every process below gpuprof; the pids killed."""
        pids = _descendants()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid or 0, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def _wait(self, name: str, pid: int) -> None:
        """Until the program's every process has ended; after a passed-on signal, SIGKILL what still
        runs ``kill_after`` seconds later (the program's own process included)."""
        told = announced = False
        killed: list[int] | None = None
        while True:
            if self.all_ended.wait(0.2) and (self.subreaper or not self._group_alive()):
                return
            now = time.monotonic()
            if self.signalled_at is not None and not announced:
                print(f"gpuprof: passed {signal.Signals(self.signals[0]).name} on to the program; what still runs "
                      f"{self.kill_after:g} s later is killed (SIGKILL; --kill-after)", file=sys.stderr)
                announced = True
            if not told and self.ended_at is not None and now - self.ended_at > 1.0:
                left = [str(p) for p in _children()] or ["?"]
                print(f"gpuprof: {name} (pid {pid}) ended; waiting for the {len(left)} process(es) it left running "
                      f"(pid {', '.join(left[:8])}) before writing the manifest; Ctrl-C stops them",
                      file=sys.stderr)
                told = True
            if self.signalled_at is not None and now - self.signalled_at > self.kill_after:
                pids = self._kill_all()  # every round: a process forked meanwhile goes too
                if killed is None:
                    killed = pids
                    shown = ", ".join(str(p) for p in pids[:8]) + (f" and {len(pids) - 8} more" if len(pids) > 8
                                                                    else "")
                    note = (f"killed the program's processes still running {self.kill_after:g} s after "
                            f"{signal.Signals(self.signals[0]).name} was passed on (pid {shown or self.pgid})")
                    self.notes.append(note)
                    print(f"gpuprof: {note}", file=sys.stderr)
