"""Inside a profiled process: turn optimizer steps (or ``gpuprof.step()``) into a profiler schedule.

Configured by environment variables the launcher sets (``GPUPROF_RUN_DIR``, ``GPUPROF_SCHEDULE``
"skip,timed,wait,warmup,active,repeat", ``GPUPROF_RECORD_SHAPES``, ``GPUPROF_WITH_STACK``).
Steps: the first ``skip`` are left alone (start-up, compilation); then steps are timed without
the profiler until they show the steady state (:mod:`gpuprof.record.window`: chunks of 10 steps
until the steady phase's mean is known within 2 % and the DataLoader's queue is not draining, or
a budget is spent;
``timed`` >= 0 instead times exactly that many steps); then torch.profiler runs its
``wait, warmup, active`` schedule ``repeat`` times and writes ``traces/{name}.json.gz``.

Timing without the profiler: when the program uses CUDA, a CUDA event is recorded on the
stepping optimizer's device at each chunk boundary, so the figure is the GPU timeline's step
time (the host runs ahead of the GPU by as many steps as the launch queue holds; timing the
host alone read half the real step time on a GPU-bound loop). No step synchronises: an event is
read once it has completed, or, at exit, waited for. Programs that never initialise CUDA are
timed on the host clock. The record says which (``unprofiled_timing``), which steps the figure
covers (``window``), every chunk's time and the spread over the window.

File names: each process claims its own name before it writes anything (``O_EXCL``), so no
process ever writes over another's files: ``rank{R}`` with R from the process group once it
exists, else from torchrun's ``RANK``; a process without a rank that is the program's main
process is ``rank0``; one started by multiprocessing (``torch.multiprocessing.spawn`` workers
before or without a process group) is ``pid{PID}``; a name already claimed gets ``.pid{PID}``.

One step is one update of the program's optimizer: steps are counted at the end of the first
optimizer whose ``step()`` runs (others are ignored, so GANs count iterations, not optimizer
calls), or by ``gpuprof.step()`` once the program calls it. An optimizer that holds another one
(Lightning's ``LightningOptimizer``, Accelerate's ``AcceleratedOptimizer``, ZeRO) is a wrapper and
never counted: the optimizer it steps is, so a wrapper's ``step`` and the inner one are one step,
and a wrapper that skips the inner step (Accelerate between gradient-accumulation boundaries)
counts nothing: with accumulation, one step is one optimizer step and is timed as such. Lightning
runs forward and backward inside ``optimizer.step(closure)``; the step still ends when the
optimizer's does. The profiler's schedule advances once per counted step.
Any profiler error is reported in the rank's record and the program carries on unprofiled: a
profiler failure never kills training. A program that runs a profiler of its own (torch.profiler,
the autograd profiler, emit_nvtx/emit_itt) is left to it: gpuprof's profiler does not start, or
stops and discards its window, before the program's starts (two Kineto sessions in one process
fail or crash), and the record says so. On exit, a crash, SIGTERM, SIGHUP or Ctrl-C, an active
window is stopped and written, and the rank's record ``traces/{name}.meta.json`` is saved.

After the profiler stops, the recorder times more steps (the same CUDA events, from
:data:`AFTER_SKIP` steps after the stop so that the trace's export is not in them): under the
steady rule in chunks for as long as its budget allows or the program runs (window.py), the figure
then pooling both; with ``--timed-steps N``, :data:`AFTER_STEPS` steps. They
are recorded as ``after_profiling_step_ms``: whether the program went back to its unprofiled
speed. It did not under torch 2.11 unless CUPTI is torn down at the profiler's stop, which the
launcher asks for (``TEARDOWN_CUPTI=1``; docs/collector.md); the record keeps the value the
process saw at the stop (torch sets ``0`` itself where CUDA graphs need it).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import math
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpuprof.record.window import CHUNK_STEPS, Window

_STATE: "Recorder | None" = None
AFTER_SKIP = 2  # steps between the profiler's stop and the after-profiling check (the export runs in them)
AFTER_STEPS = 20  # steps the after-profiling check times
_EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


class Recorder:
    def __init__(self, run_dir: Path, schedule: tuple[int, ...], record_shapes: bool, with_stack: bool) -> None:
        self.run_dir = run_dir
        self.skip, self.timed, self.wait, self.warmup, self.active, self.repeat = schedule
        self.record_shapes, self.with_stack = record_shapes, with_stack
        self.env_rank = _int_env("RANK")
        self.rank: int | None = self.env_rank
        self.world = _int_env("WORLD_SIZE") or 1
        self.rank_source = "env" if self.env_rank is not None else None
        self.stem: str | None = None  # this process's claimed file name
        self.steps = 0
        self.fixed = self.timed if self.timed >= 0 else None  # --timed-steps N, or the steady rule
        self.window = Window(self.skip + 1, self.fixed)
        self.prof: Any = None
        self.prof_steps = 0
        self.finished = False
        self.failures: list[str] = []
        self.traces: list[str] = []
        self.manual = False
        self.optimizer_id: int | None = None
        self.optimizer_name: str | None = None  # the counted optimizer's class
        self.wrappers: set[str] = set()  # classes of the wrappers seen stepping it (never counted)
        self.device: Any = None  # the stepping optimizer's CUDA device, for the timing events
        self.timing: dict[str, Any] = {}
        self.loaders: weakref.WeakSet[Any] = weakref.WeakSet()
        self.loader_s = 0.0  # host seconds the stepping thread spent inside DataLoader __next__ calls
        self.loader_seen = False  # whether the stepping thread has iterated a DataLoader since its first step
        self.loader_depth = 0  # DataLoader __next__ calls the stepping thread is inside (nested loaders)
        self.step_tid: int | None = None  # the thread that counts steps (the training loop's)
        self.profiled_from: int | None = None  # the first step the profiler saw  # the process's multi-worker DataLoader iterators
        self.foreign: dict[str, Any] | None = None  # the program's own profiler, once seen
        self.own = 0  # > 0 while gpuprof itself drives torch.profiler
        self.discard = False
        self.after: Window | None = None  # the steps timed after the profiler stopped
        self.teardown_cupti: str | None = None  # TEARDOWN_CUPTI as this process saw it at the stop

    # --- steps -----------------------------------------------------------------------------
    def on_optimizer_step(self, optimizer: Any) -> None:
        if self.manual:
            return
        if _wraps_an_optimizer(optimizer):
            if len(self.wrappers) < 8:
                self.wrappers.add(type(optimizer).__name__)
            return  # a wrapper's step: the optimizer it stepped (if it did) has counted already
        if self.optimizer_id is None:
            self.optimizer_id = id(optimizer)
            self.optimizer_name = type(optimizer).__name__
            self.device = _cuda_device_of(optimizer)
        if id(optimizer) == self.optimizer_id:
            self.step()

    def manual_step(self) -> None:
        """``gpuprof.step()``: from its first call on, it alone counts. Optimizer steps counted
        before (the same training steps, usually one) are dropped, and the timing starts over,
        unless the profiler has already begun."""
        if not self.manual:
            self.manual = True
            if self.prof is None and not self.finished:
                self.steps = 0
                self.window = Window(self.skip + 1, self.fixed)
                self.timing = {}
        self.step()

    def step(self) -> None:
        self.steps += 1
        if self.step_tid is None:
            self.step_tid = threading.get_ident()
        if self.finished:
            a = self.after
            if a is not None and a.due(self.steps):
                a.mark(self.steps, self._after_event(a), self.loader_s if self.loader_seen else None)
            return
        if self.prof is not None:
            self._advance()
            return
        w = self.window
        if self.steps < w.first:
            return
        if not w.closed:
            w.sample(self._ready_batches(), self._loader_workers() if len(w.marks) < 2 else None)
            if w.due(self.steps):
                w.mark(self.steps, self._event(first=not w.marks), self.loader_s if self.loader_seen else None)
        if w.decide():
            self._start()

    def _ready_batches(self) -> int | None:
        """Batches the workers have produced and the program not yet taken, over its multi-process
        DataLoader iterators (None: none, or unreadable in this torch)."""
        n, seen = 0, False
        try:
            for it in list(self.loaders):
                if getattr(it, "_shutdown", True):
                    continue
                q, results = it._data_queue, it._worker_result_queue
                n += q.qsize() + (results.qsize() if results is not q else 0)
                n += sum(1 for v in it._task_info.values() if len(v) == 2)  # arrived out of order
                seen = True
        except Exception:
            return None  # qsize() is not implemented everywhere (macOS)
        return n if seen else None

    def _loader_workers(self) -> int | None:
        """The cycle of the program's live multi-process DataLoader iterators, in steps: their
        worker count; over several loaders the least common multiple of their counts where it is
        at most twice the first chunk, else the largest count (window.py); None: none, or
        unreadable."""
        counts = []
        try:
            for it in list(self.loaders):
                if not getattr(it, "_shutdown", True):
                    counts.append(int(it._num_workers))
        except Exception:
            return None
        n = math.lcm(*counts) if counts else 1
        if n > 2 * CHUNK_STEPS:
            n = max(counts)
        return n if n > 1 else None

    # --- timing without the profiler -------------------------------------------------------
    def _event(self, first: bool) -> Any:
        """A CUDA event at a chunk boundary, on the stream the program steps on (None: host clock)."""
        w = self.window
        try:
            import torch

            cuda: Any = torch.cuda  # partly untyped
            if first:
                if not cuda.is_initialized():  # never create a CUDA context the program did not
                    self.timing = {"method": "host_clock", "why": "the program does not use CUDA"}
                    return None
                if cuda.is_current_stream_capturing():
                    self.timing = {"method": "host_clock", "why": "the steps run inside CUDA graph capture"}
                    return None
            elif not w.cuda or w.failed:
                return None
        except Exception as e:
            w.failed = f"CUDA events failed ({e.__class__.__name__}: {e})"
            return None
        made = self._stream_event(w)
        if made is None:
            return None
        self.timing = {"method": "cuda_events", "device": str(made[1])}
        return made[0]

    def _after_event(self, a: Window) -> Any:
        """A CUDA event for the after-profiling check, where the unprofiled window used them."""
        if not self.window.cuda or self.window.failed:
            return None
        made = self._stream_event(a)
        return None if made is None else made[0]

    def _stream_event(self, w: Window) -> tuple[Any, Any] | None:
        """A timing CUDA event recorded now on the stream the program steps on, and its device
        (None, with ``w.failed`` set, where CUDA refuses)."""
        try:
            import torch

            cuda: Any = torch.cuda
            dev = self.device if self.device is not None else torch.device("cuda", cuda.current_device())
            ev = cuda.Event(enable_timing=True)
            ev.record(cuda.current_stream(dev))
        except Exception as e:
            w.failed = f"CUDA events failed ({e.__class__.__name__}: {e})"
            return None
        w.cuda = True
        return ev, dev

    def after_profiling(self, block: bool = False) -> tuple[float | None, dict[str, Any]]:
        """The step time measured after the profiler stopped, and how (None: not, or not yet, timed)."""
        a = self.after
        if a is None or not a.chunks:
            return None, {}
        ms, info = a.result(block)  # the host clock's figure where the events failed (Window.times)
        steps = info.get("window")
        if ms is None:
            return None, {}
        return ms, {"method": "cuda_events" if a.cuda and not a.failed else "host_clock",
                    "steps": [steps["first_step"], steps["last_step"]] if steps else None,
                    "teardown_cupti": self.teardown_cupti}

    def pools(self) -> bool:
        """Whether the steps timed after the profiler count in the unprofiled figure (window.py):
        under the steady rule, on the same clock, with nothing of the profiler left behind (CUPTI
        torn down at its stop, or no CUDA)."""
        a, w = self.after, self.window
        return (a is not None and a.every is not None and not w.failed and not a.failed and a.cuda == w.cuda
                and (self.teardown_cupti == "1" or not w.cuda))

    def unprofiled(self, block: bool = False) -> tuple[float | None, dict[str, Any]]:
        ms, info = self.window.result(block, self.after if self.pools() else None)
        timing = dict(self.timing, **info)
        if self.window.failed:
            timing.update(method="host_clock", why=self.window.failed)
            ms = info.get("host_step_ms")
        if self.foreign is not None and not self.window.chunks:
            return None, dict(timing, method=None, steps=0,
                              why=f"the program's own profiler ({self.foreign['what']}) was active in the timed steps")
        if ms is None:  # nothing timed, or the GPU has not yet passed the window's end
            return None, timing if self.window.chunks and timing.get("method") else dict(timing, method=None)
        if timing.get("method") == "cuda_events":
            timing["gpu_step_ms"] = ms
        else:
            timing["method"] = "host_clock"
        return ms, timing

    # --- gpuprof's own profiler --------------------------------------------------------------
    @contextlib.contextmanager
    def _ours(self) -> Iterator[None]:
        self.own += 1
        try:
            yield
        finally:
            self.own -= 1

    def _start(self) -> None:
        self.profiled_from = self.steps + 1
        self._claim()
        if torch_profiler_enabled():
            self.on_foreign_profiler("a profiler already enabled in this process")
            return
        try:
            import torch

            acts = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            (self.run_dir / "traces").mkdir(exist_ok=True)
            with self._ours():
                self.prof = torch.profiler.profile(
                    activities=acts, record_shapes=self.record_shapes, with_stack=self.with_stack,
                    schedule=torch.profiler.schedule(wait=self.wait, warmup=self.warmup, active=self.active,
                                                     repeat=self.repeat),
                    on_trace_ready=self._export)
                self.prof.start()
        except Exception as e:
            self._fail(f"profiler could not start: {e.__class__.__name__}: {e}")
            return
        self.write_record()

    def _advance(self) -> None:
        try:
            with self._ours():
                self.prof.step()
            self.prof_steps += 1
            if self.prof_steps >= (self.wait + self.warmup + self.active) * self.repeat:
                self._stop()
        except Exception as e:
            self._fail(f"profiler step failed: {e.__class__.__name__}: {e}")

    def _export(self, prof: Any) -> None:
        """Write the trace under a temporary name, then rename: a trace file that exists is whole.
        SIGINT/SIGTERM/SIGHUP arriving meanwhile are held and delivered once the file is written."""
        if self.discard:
            return
        stem = self._claim()
        name = f"{stem}.json.gz" if not self.traces else f"{stem}.cycle{len(self.traces)}.json.gz"
        path = self.run_dir / "traces" / name
        tmp = path.with_name(f"{stem}.partial.json.gz")
        with _held_signals():
            try:
                prof.export_chrome_trace(str(tmp))
                os.replace(tmp, path)  # the name is this process's own (claimed): nothing else is replaced
                self.traces.append(f"traces/{name}")
                self.write_record()
            except Exception as e:
                self._fail(f"trace export failed: {e.__class__.__name__}: {e}")

    def _stop(self) -> None:
        prof, self.prof = self.prof, None
        self.finished = True
        if prof is not None:
            try:
                with self._ours():
                    prof.stop()  # in an active window this writes the partial trace via on_trace_ready
            except Exception as e:
                self._fail(f"profiler stop failed: {e.__class__.__name__}: {e}")
            self.teardown_cupti = os.environ.get("TEARDOWN_CUPTI")
            if not self.failures and not self.discard:
                first = self.steps + AFTER_SKIP + 1
                self.after = (Window(first, AFTER_STEPS) if self.fixed is not None else  # the check alone
                              Window(first, None, every=self.window.chunk_steps))  # the steady rule goes on
        self.write_record()

    def _fail(self, msg: str) -> None:
        self.failures.append(msg)
        self.prof = None
        self.finished = True
        print(f"gpuprof: {msg}; the program continues unprofiled", file=sys.stderr)
        self.write_record()

    def on_foreign_profiler(self, what: str) -> None:
        """The program starts a profiler of its own: stand aside, once, before it starts."""
        if self.foreign is not None:
            return
        self.foreign = {"what": what, "at_step": self.steps}
        self.window.stop("the program's own profiler began")  # its steps are no unprofiled time
        if self.finished and self.prof is None:
            if self.steps:
                self.write_record()  # gpuprof's window is over (or failed): only note it
            return
        print(f"gpuprof: the program runs its own profiler ({what}, at step {self.steps}); gpuprof stands aside "
              f"and records no trace of its own", file=sys.stderr)
        self.discard = True
        self._stop()  # before the program's profiler starts: one Kineto session at a time

    # --- record ----------------------------------------------------------------------------
    def _identity(self) -> None:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                self.rank, self.world, self.rank_source = dist.get_rank(), dist.get_world_size(), "process_group"
                return
        except Exception:
            pass
        if self.rank_source is None and _is_main_process():
            self.rank, self.rank_source = 0, "main_process"

    def _claim(self) -> str:
        """This process's file name, claimed once by creating its record exclusively."""
        if self.stem is not None:
            return self.stem
        self._identity()
        pid = os.getpid()
        names = ([f"rank{self.rank}", f"rank{self.rank}.pid{pid}"] if self.rank is not None else [f"pid{pid}"])
        names += [f"{names[-1]}.{i}" for i in range(1, 100)]  # a recycled pid in a long run
        d = self.run_dir / "traces"
        d.mkdir(exist_ok=True)
        for stem in names:
            try:
                os.close(os.open(d / f"{stem}.meta.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            except FileExistsError:
                continue
            self.stem = stem
            return stem
        raise OSError(f"no free file name for pid {pid} in {d}")

    def write_record(self, block: bool = False) -> None:
        if self.steps == 0:
            return  # a helper process (launcher, DataLoader worker): see at_exit
        try:
            import torch

            cuda: Any = torch.cuda
            versions = {"torch": torch.__version__, "cuda": torch.version.cuda,
                        "gpu": cuda.get_device_name() if cuda.is_initialized() else None,
                        "cuda_device": cuda.current_device() if cuda.is_initialized() else None,
                        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        except Exception:
            versions = {}
        try:
            stem = self._claim()
            if self.rank_source in (None, "main_process"):
                self._identity()  # a process group created after the name was claimed still names the rank
            step_ms, timing = self.unprofiled(block)
            status = ("stood_aside" if self.foreign is not None and self.discard else
                      "complete" if self.finished and not self.failures else "partial")
            rec = {
                "rank": self.rank, "rank_source": self.rank_source or "pid", "world_size": self.world,
                "pid": os.getpid(), "name": stem, **versions,
                "steps_seen": self.steps, "step_source": "gpuprof.step()" if self.manual else "optimizer.step()",
                "optimizer": None if self.manual else self.optimizer_name,
                "optimizer_wrappers": sorted(self.wrappers),
                "timed_steps": timing.get("steps", 0), "unprofiled_step_ms": step_ms, "unprofiled_timing": timing,
                "profiled_steps": self.prof_steps, "profiler_started_at_step": self.profiled_from, "trace": self.traces[0] if self.traces else None,
                "traces": self.traces, "status": status, "own_profiler": self.foreign,
                "failures": self.failures,
            }
            after_ms, after = self.after_profiling(block)
            if after_ms is not None:
                rec.update(after_profiling_step_ms=after_ms, after_profiling_timing=after)
            if self.rank is None:
                del rec["rank"]  # readers take a missing rank as unknown; null would read as a number
            from gpuprof.record.manifest import write_json_atomic

            write_json_atomic(self.run_dir / "traces" / f"{stem}.meta.json", rec)
        except Exception as e:
            print(f"gpuprof: could not write the rank record: {e}", file=sys.stderr)

    def _note_no_steps(self) -> None:
        """A process that imported torch and never stepped leaves a note, so the launcher can say
        what happened (DataLoader workers excepted: they never step by design)."""
        try:
            from torch.utils.data import get_worker_info

            if get_worker_info() is not None:
                return
            from gpuprof.record.manifest import PROCS_DIR, write_json_atomic

            d = self.run_dir / PROCS_DIR
            d.mkdir(exist_ok=True)
            write_json_atomic(d / f"pid{os.getpid()}.json",
                              {"pid": os.getpid(), "program": os.path.basename(sys.argv[0]) if sys.argv else "",
                               "main_process": _is_main_process(), "own_profiler": self.foreign})
        except Exception:
            pass

    def at_exit(self) -> None:
        if self.steps == 0:
            self._note_no_steps()
            return
        if self.prof is not None:
            in_cycle = self.prof_steps % (self.wait + self.warmup + self.active)
            if in_cycle >= self.wait + self.warmup:
                self.failures.append(f"the program ended inside the active window after {in_cycle - self.wait - self.warmup}"
                                     f" of {self.active} active steps; the partial trace is kept")
            else:
                self.failures.append("the program ended before the active window began; no trace was captured")
            self._stop()
        elif not self.finished:
            window = (f"timed {self.fixed}" if self.fixed is not None else
                      "the steady-state timing, at least 31 steps; --timed-steps N times a fixed window instead")
            self.failures.append(f"the program ended after {self.steps} steps, before profiling began "
                                 f"(skip {self.skip} + {window}); lower --skip-steps/--timed-steps")
        self.window.stop("the program ended")
        if self.after is not None:
            self.after.stop("the program ended")
        self.write_record(block=True)


def _is_main_process() -> bool:
    import multiprocessing

    return multiprocessing.parent_process() is None


def _wraps_an_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` holds another torch optimizer (a framework's wrapper around it)."""
    try:
        from torch.optim import Optimizer

        return any(isinstance(v, Optimizer) and v is not optimizer for v in vars(optimizer).values())
    except Exception:
        return False


def _cuda_device_of(optimizer: Any) -> Any:
    try:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.device.type == "cuda":
                    return p.device
    except Exception:
        pass
    return None


def torch_profiler_enabled() -> bool:
    """Whether a profiler session (any of torch's) is enabled in this process right now."""
    try:
        import torch

        return bool(torch._C._autograd._profiler_enabled() or torch.autograd.profiler._is_profiler_enabled)
    except Exception:
        return False


class _held_signals:
    """Hold SIGINT, SIGTERM and SIGHUP (main thread only) and re-deliver them on exit."""

    def __enter__(self) -> None:
        self.got: list[int] = []
        self.old: dict[int, Any] = {}
        try:
            for s in (signal.SIGINT, *_EXIT_SIGNALS):
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
    no longer counted (those counted before its first call are dropped: they were the same steps).
    """
    if _STATE is not None:
        _STATE.manual_step()


# Where a program enters a profiler of its own. torch.profiler.profile.start is seen even in a
# schedule's wait steps; autograd.profiler.profile._prepare_trace is every Kineto session's start
# (torch.profiler's cycles and the autograd profiler used directly).
_PROFILER_ENTRIES = (("torch.profiler", "profile", "start", "torch.profiler.profile"),
                     ("torch.profiler.profiler", "_KinetoProfile", "start", "torch.profiler (_KinetoProfile)"),
                     ("torch.autograd.profiler", "profile", "_prepare_trace", "torch.autograd.profiler.profile"),
                     ("torch.autograd.profiler", "emit_nvtx", "__enter__", "torch.autograd.profiler.emit_nvtx"),
                     ("torch.autograd.profiler", "emit_itt", "__enter__", "torch.autograd.profiler.emit_itt"),
                     ("torch.autograd.profiler_legacy", "profile", "__enter__", "torch.autograd.profiler_legacy.profile"))


def _patch(cls: Any, method: str, wrap: Callable[[Any], Any]) -> None:
    """Replace ``cls.method`` (defined by ``cls`` itself) by ``wrap(original)``, with the original's
    name and docstring, once: a second install in one process leaves it as it is."""
    orig = cls.__dict__.get(method)
    if orig is None or getattr(orig, "_gpuprof_watch", False):
        return
    new = wrap(orig)
    functools.update_wrapper(new, orig)
    setattr(new, "_gpuprof_watch", True)
    setattr(cls, method, new)


def _watch_profilers(state: Recorder) -> None:
    import importlib

    for module, cls_name, method, what in _PROFILER_ENTRIES:
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except Exception:
            continue

        def wrap(orig: Any, _what: str = what) -> Any:
            def entered(self: Any, *args: Any, **kwargs: Any) -> Any:
                if state.own == 0:
                    try:
                        state.on_foreign_profiler(_what)
                    except Exception as e:  # never break the program's own profiler
                        print(f"gpuprof: {e}", file=sys.stderr)
                return orig(self, *args, **kwargs)
            return entered

        _patch(cls, method, wrap)


def _watch_loaders(state: Recorder) -> None:
    """Keep a weak reference to each multi-process DataLoader iterator the program creates, so the
    timing can see whether their prefetched queue is draining (window.py); and add up the host time
    the training loop's thread spends inside every DataLoader iterator's ``__next__`` (waiting for a
    worker's batch, or loading it in-process: :func:`_time_loader_waits`), which the unprofiled
    window reports per step. Each patch stands alone: a torch without one keeps the other."""
    try:
        from torch.utils.data import dataloader
    except Exception:
        return
    _time_loader_waits(state, dataloader)

    def wrap(orig: Any) -> Any:
        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            with contextlib.suppress(Exception):
                state.loaders.add(self)
        return init

    with contextlib.suppress(Exception):
        _patch(dataloader._MultiProcessingDataLoaderIter, "__init__", wrap)


def _time_loader_waits(state: Recorder, dataloader: Any) -> None:
    """Add up the time the stepping thread spends inside any DataLoader iterator's ``__next__``
    (``state.loader_s``): the unprofiled window reports it per step (window.py)."""
    def wrap(orig: Any) -> Any:
        def next_(self: Any) -> Any:
            # only the stepping thread's calls, from its first step on (a prefetching thread's wait is
            # not the loop's), and only the outermost (a dataset that iterates another DataLoader)
            if state.step_tid is None or threading.get_ident() != state.step_tid or state.loader_depth:
                return orig(self)
            state.loader_depth += 1
            t0 = time.perf_counter()
            try:
                return orig(self)  # StopIteration too: an epoch's end (its workers' shutdown) is waited for
            finally:
                state.loader_s += time.perf_counter() - t0
                state.loader_seen = True
                state.loader_depth -= 1
        return next_

    with contextlib.suppress(Exception):
        _patch(dataloader._BaseDataLoaderIter, "__next__", wrap)


def install() -> None:
    """Called by the bootstrap once torch is imported in a process of a recorded run."""
    global _STATE
    run_dir = os.environ.get("GPUPROF_RUN_DIR")
    if not run_dir or _STATE is not None:
        return
    sched = tuple(int(x) for x in os.environ.get("GPUPROF_SCHEDULE", "5,-1,1,2,3,1").split(","))
    _STATE = Recorder(Path(run_dir), sched,
                      os.environ.get("GPUPROF_RECORD_SHAPES", "1") == "1", os.environ.get("GPUPROF_WITH_STACK") == "1")
    state = _STATE
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(lambda opt, args, kwargs: state.on_optimizer_step(opt))
    except Exception as e:  # very old torch: gpuprof.step() still works
        state.failures.append(f"no global optimizer hook ({e}); call gpuprof.step() each step")
    _watch_profilers(state)
    _watch_loaders(state)
    atexit.register(state.at_exit)
    for s in _EXIT_SIGNALS:
        if signal.getsignal(s) in (signal.SIG_DFL, None):
            try:  # turn the signal into a normal exit so the window is flushed (only if the program has no handler)
                signal.signal(s, lambda signum, frame: sys.exit(128 + signum))
            except ValueError:
                pass  # not the main thread
