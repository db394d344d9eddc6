"""Inside a profiled process: turn optimizer steps (or ``gpuprof.step()``) into a profiler schedule.

Configured by environment variables the launcher sets (``GPUPROF_RUN_DIR``, ``GPUPROF_SCHEDULE``
"skip,timed,wait,warmup,active,repeat", ``GPUPROF_RECORD_SHAPES``, ``GPUPROF_WITH_STACK``).
Steps: the first ``skip`` are left alone (start-up, compilation); the next ``timed`` are timed
without the profiler (the run's real step time); then torch.profiler runs its
``wait, warmup, active`` schedule ``repeat`` times and writes ``traces/rank{R}.json.gz``.

Steps are counted from the first optimizer whose ``step()`` runs (others are ignored, so GANs
count iterations, not optimizer calls), or from ``gpuprof.step()`` once the program calls it.
Any profiler error is reported in the rank's record and the program carries on unprofiled: a
profiler failure never kills training. On exit, a crash, SIGTERM or Ctrl-C, an active window
is stopped and written, and the rank's record ``traces/rank{R}.meta.json`` is saved.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

_STATE: "Recorder | None" = None


class Recorder:
    def __init__(self, run_dir: Path, schedule: tuple[int, ...], record_shapes: bool, with_stack: bool) -> None:
        self.run_dir = run_dir
        self.skip, self.timed, self.wait, self.warmup, self.active, self.repeat = schedule
        self.record_shapes, self.with_stack = record_shapes, with_stack
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        self.steps = 0
        self.marks: list[float] = []
        self.prof: Any = None
        self.prof_steps = 0
        self.finished = False
        self.failures: list[str] = []
        self.traces: list[str] = []
        self.manual = False
        self.optimizer_id: int | None = None
        self.t_first: float | None = None

    # --- steps -----------------------------------------------------------------------------
    def on_optimizer_step(self, optimizer: Any) -> None:
        if self.manual:
            return
        if self.optimizer_id is None:
            self.optimizer_id = id(optimizer)
        if id(optimizer) == self.optimizer_id:
            self.step()

    def step(self) -> None:
        if self.finished:
            return
        self.steps += 1
        now = time.perf_counter()
        if self.t_first is None:
            self.t_first = now
        first_timed = self.skip + 1
        if first_timed <= self.steps <= self.skip + self.timed + 1:
            self.marks.append(now)  # timed+1 marks bound timed intervals
            if self.steps == self.skip + self.timed + 1:
                self._start()
            return
        if self.prof is not None:
            self._advance()

    def _start(self) -> None:
        try:
            import torch

            acts = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            (self.run_dir / "traces").mkdir(exist_ok=True)
            self.prof = torch.profiler.profile(
                activities=acts, record_shapes=self.record_shapes, with_stack=self.with_stack,
                schedule=torch.profiler.schedule(wait=self.wait, warmup=self.warmup, active=self.active,
                                                 repeat=self.repeat),
                on_trace_ready=self._export)
            self.prof.start()
        except Exception as e:
            self._fail(f"profiler could not start: {e.__class__.__name__}: {e}")

    def _advance(self) -> None:
        try:
            self.prof.step()
            self.prof_steps += 1
            if self.prof_steps >= (self.wait + self.warmup + self.active) * self.repeat:
                self._stop()
        except Exception as e:
            self._fail(f"profiler step failed: {e.__class__.__name__}: {e}")

    def _export(self, prof: Any) -> None:
        """Write the trace under a temporary name, then rename: a trace file that exists is whole.
        SIGINT/SIGTERM arriving meanwhile are held and delivered once the file is written."""
        name = f"rank{self.rank}.json.gz" if not self.traces else f"rank{self.rank}.cycle{len(self.traces)}.json.gz"
        path = self.run_dir / "traces" / name
        tmp = path.with_name(name.replace(".json.gz", ".partial.json.gz"))
        with _held_signals():
            try:
                prof.export_chrome_trace(str(tmp))
                os.replace(tmp, path)
                self.traces.append(f"traces/{name}")
                self.write_record()
            except Exception as e:
                self._fail(f"trace export failed: {e.__class__.__name__}: {e}")

    def _stop(self) -> None:
        prof, self.prof = self.prof, None
        self.finished = True
        if prof is not None:
            try:
                prof.stop()  # in an active window this writes the partial trace via on_trace_ready
            except Exception as e:
                self._fail(f"profiler stop failed: {e.__class__.__name__}: {e}")
        self.write_record()

    def _fail(self, msg: str) -> None:
        self.failures.append(msg)
        self.prof = None
        self.finished = True
        print(f"gpuprof: {msg}; the program continues unprofiled", file=sys.stderr)
        self.write_record()

    # --- record ----------------------------------------------------------------------------
    def unprofiled_step_ms(self) -> float | None:
        if len(self.marks) < 2:
            return None
        return (self.marks[-1] - self.marks[0]) * 1000.0 / (len(self.marks) - 1)

    def write_record(self, status: str | None = None) -> None:
        if self.steps == 0:
            return  # a helper process (launcher, DataLoader worker): nothing to say
        try:
            import torch

            versions = {"torch": torch.__version__, "cuda": torch.version.cuda,
                        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                        "cuda_device": torch.cuda.current_device() if torch.cuda.is_available() else None,
                        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        except Exception:
            versions = {}
        rec = {
            "rank": self.rank, "world_size": self.world, "pid": os.getpid(), **versions,
            "steps_seen": self.steps, "step_source": "gpuprof.step()" if self.manual else "optimizer.step()",
            "timed_steps": max(len(self.marks) - 1, 0), "unprofiled_step_ms": self.unprofiled_step_ms(),
            "profiled_steps": self.prof_steps, "trace": self.traces[0] if self.traces else None,
            "traces": self.traces, "status": status or ("complete" if self.finished and not self.failures else "partial"),
            "failures": self.failures,
        }
        try:
            from gpuprof.record.manifest import RANK_FILE, write_json_atomic

            (self.run_dir / "traces").mkdir(exist_ok=True)
            write_json_atomic(self.run_dir / "traces" / RANK_FILE.format(rank=self.rank), rec)
        except Exception as e:
            print(f"gpuprof: could not write the rank record: {e}", file=sys.stderr)

    def at_exit(self) -> None:
        if self.prof is not None:
            in_cycle = self.prof_steps % (self.wait + self.warmup + self.active)
            if in_cycle >= self.wait + self.warmup:
                self.failures.append(f"the program ended inside the active window after {in_cycle - self.wait - self.warmup}"
                                     f" of {self.active} active steps; the partial trace is kept")
            else:
                self.failures.append("the program ended before the active window began; no trace was captured")
            self._stop()
        elif self.steps and not self.finished:
            if self.steps <= self.skip + self.timed:
                self.failures.append(f"the program ended after {self.steps} steps, before profiling began "
                                     f"(skip {self.skip} + timed {self.timed}); lower --skip-steps/--timed-steps")
            self.write_record()
        else:
            self.write_record()


class _held_signals:
    """Hold SIGINT and SIGTERM (main thread only) and re-deliver them on exit."""

    def __enter__(self) -> None:
        self.got: list[int] = []
        self.old: dict[int, Any] = {}
        try:
            for s in (signal.SIGINT, signal.SIGTERM):
                self.old[s] = signal.signal(s, lambda signum, frame: self.got.append(signum))
        except ValueError:
            self.old = {}  # not the main thread: signals go to the main thread anyway

    def __exit__(self, *exc: Any) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)
        for s in self.got:
            os.kill(os.getpid(), s)


def step() -> None:
    """Mark the end of one step, for loops without an optimizer (inference, evaluation).

    A no-op unless the program runs under ``gpuprof record``. Once called, optimizer steps are
    no longer counted.
    """
    if _STATE is not None:
        _STATE.manual = True
        _STATE.step()


def install() -> None:
    """Called by the bootstrap once torch is imported in a process of a recorded run."""
    global _STATE
    run_dir = os.environ.get("GPUPROF_RUN_DIR")
    if not run_dir or _STATE is not None:
        return
    sched = tuple(int(x) for x in os.environ.get("GPUPROF_SCHEDULE", "5,10,1,2,3,1").split(","))
    _STATE = Recorder(Path(run_dir), sched,
                      os.environ.get("GPUPROF_RECORD_SHAPES", "1") == "1", os.environ.get("GPUPROF_WITH_STACK") == "1")
    state = _STATE
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(lambda opt, args, kwargs: state.on_optimizer_step(opt))
    except Exception as e:  # very old torch: gpuprof.step() still works
        state.failures.append(f"no global optimizer hook ({e}); call gpuprof.step() each step")
    atexit.register(state.at_exit)
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        try:  # turn SIGTERM into a normal exit so the window is flushed (only if the program has no handler)
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        except ValueError:
            pass  # not the main thread
