"""Where per-rank work runs: this process, local worker processes, or a Dask cluster.

:class:`Executor` maps a function over argument lists, results in order. In this process it can
keep each rank's frames once loaded (``keep``): the later passes over a rank (its findings, the
slow rank's detail, its replay graph) then reuse them instead of loading the rank again; that is
how a job small enough to hold whole (:func:`in_process`) and a single trace are analysed.
Worker processes and Dask workers hold one rank at a time and send back only what a rank yields.

Workers never outlive the report: a worker process ends when the process that started it does,
even by SIGKILL (:func:`_die_with_parent`), and an interrupted or terminated report kills its
workers before it exits; a local Dask cluster's worker processes watch their parent themselves
(``distributed``'s ``AsyncProcess`` exits when its parent's pipe closes) and are closed with it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuprof import strings
from gpuprof.errors import GpuprofError

if TYPE_CHECKING:
    from gpuprof.jobs import Store


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask, which containers and batch schedulers set)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def local_workers(n: int, workers: int | None) -> int:
    """Local processes for ``n`` ranks: ``workers`` (default: one per CPU), at most one per rank
    and per CPU; 1 works in this process."""
    cpus = cpu_count()
    return max(1, min(n, workers or cpus, cpus))


#: A job of several ranks whose traces hold at most this many bytes of JSON (a gzipped file
#: counted at its uncompressed size) is analysed in this process by default, each rank loaded
#: once and kept until its findings are made. Each worker process costs its own imports (numpy,
#: pandas, pyarrow: about half a second of CPU and a hundred MB before any trace) and a second load
#: of each rank it summarised, while this process holds every rank's frames (about half the JSON;
#: less than a single trace of that size holds at its peak), so below this size one process takes
#: less CPU and less memory (measured in docs/performance.md). Bigger jobs go to worker processes,
#: which hold one rank at a time; ``--workers N`` asks for them whatever the size.
IN_PROCESS_MAX_BYTES = 256 * 2**20

#: Worker processes pay only where they run in parallel: a bigger job's rank costs about 1.8x the
#: CPU in a worker (its summary, its graph and its findings each load it, the second and third from
#: a private parse cache), so on fewer CPUs than this they cannot beat one process even on wall
#: time (8 ranks of 44 and of 80 MB on 2 CPUs: 12.1 and 19.3 s of CPU, 7.2 and 11.7 s wall, 852
#: and 1204 MB in all, against 6.8 and 11.1 s, 6.7 and 11.0 s, 607 and 1018 MB in one process;
#: docs/performance.md). There a job of any size that fits memory is analysed in this process.
PARALLEL_MIN_CPUS = 3

#: This process's peak per byte of the job's JSON when it holds every rank (1.74 and 1.59 measured
#: on the two jobs above, imports included), rounded up.
HELD_BYTES_PER_JSON_BYTE = 2.0


def available_memory() -> int | None:
    """Bytes this process may still use: the system's available memory (``MemAvailable``), or
    less where a cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) caps the container;
    None where unknown."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    for limit, used in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit) as a, open(used) as b:
                found.append(max(0, int(a.read().strip()) - int(b.read().strip())))
        except (OSError, ValueError):  # absent, or "max": no cap
            continue
    return min(found) if found else None


def in_process(nbytes: int) -> bool:
    """Whether a job of ``nbytes`` of JSON is analysed in this process by default: at most
    ``IN_PROCESS_MAX_BYTES``; or, with fewer than ``PARALLEL_MIN_CPUS`` CPUs, where holding every
    rank takes at most half the memory available."""
    if nbytes <= IN_PROCESS_MAX_BYTES:
        return True
    if cpu_count() >= PARALLEL_MIN_CPUS:
        return False
    free = available_memory()
    return free is not None and HELD_BYTES_PER_JSON_BYTE * nbytes <= free / 2


def job_bytes(files: Sequence[Path]) -> int:
    """The JSON bytes of ``files``: a gzipped file's uncompressed size from its trailer (ISIZE,
    modulo 4 GiB, so never counted below 4x its compressed size; Kineto JSON compresses ~15x)."""
    total = 0
    for f in files:
        try:
            size = Path(f).stat().st_size
            if str(f).endswith(".gz") and size >= 18:
                with open(f, "rb") as fh:
                    fh.seek(-4, os.SEEK_END)
                    size = max(int.from_bytes(fh.read(4), "little"), 4 * size)
        except OSError:
            continue  # loading it says what is wrong
        total += size
    return total


#: Seconds a Dask run may go without a scheduler connection or without any worker before it
#: fails with one line (``$GPUPROF_DASK_TIMEOUT_S``); a worker lost meanwhile is not an error:
#: the scheduler runs its tasks again elsewhere.
DASK_TIMEOUT_S = 60.0


_DASK_POLL_S = 1.0


def _dask_timeout() -> float:
    try:
        return float(os.environ.get("GPUPROF_DASK_TIMEOUT_S", DASK_TIMEOUT_S))
    except ValueError:
        return DASK_TIMEOUT_S


def _in_worker(storage: str | None, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a local worker process, with the string storage of the process that
    started it (:mod:`gpuprof.strings`)."""
    with strings.running(storage):
        return fn(*args)


def _on_dask_worker(fn: Any, storage: str | None, *args: Any) -> Any:
    """``fn(*args)`` on a Dask worker, with the string storage of the process that sent it
    (:mod:`gpuprof.strings`); an error about the input names this worker, since a path
    the driver sees may be missing on the worker (traces must be on a shared file system)."""
    try:
        with strings.running(storage):
            return fn(*args)
    except GpuprofError as e:
        from dask.distributed import get_worker

        try:
            where = get_worker().address
        except ValueError:  # not on a worker after all
            raise e from None
        raise type(e)(f"{e} (read on Dask worker {where})") from None


_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int, forked: bool) -> None:
    """A worker process's initializer: it is sent SIGKILL as soon as the process that started it
    dies, however that died (``kill -9``, the OOM killer, a batch scheduler), so no worker is left
    holding a rank's frames, waiting for ever on a queue nobody reads (Linux ``PR_SET_PDEATHSIG``;
    elsewhere a thread that checks every second whether it was re-parented). ``forked``: the
    worker is a fork of ``parent``, so a parent already gone (before the signal was armed) shows
    as another parent pid."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            armed = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if not armed:
        first = os.getppid()

        def watch() -> None:
            while os.getppid() == first:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="gpuprof-parent-watch", daemon=True).start()
    if forked and os.getppid() != parent:
        os._exit(1)


def _kill_workers(pool: Any) -> None:
    """SIGKILL the pool's worker processes (a rank's work holds the GIL in pandas for seconds, so
    only SIGKILL is sure to stop it now); the pool then sees them gone and shuts down."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):  # ProcessPoolExecutor's own table
        try:
            proc.kill()
        except (OSError, ValueError):  # already gone, or closed
            pass


def _label(arg: Any) -> str:
    return str(getattr(arg, "path", arg))


class Executor:
    """Where per-rank work runs: this process, local worker processes, or a Dask cluster.

    Local processes are capped at the CPUs this process may use: more only add memory (each
    holds a rank's frames) and no speed. In this process, ``keep`` keeps each rank's frames once
    loaded (``store``, handed to the functions mapped as their ``store`` argument)."""

    def __init__(self, n: int, workers: int | None, dask: str | None,
                 progress: Callable[[int, int, str], None] | None = None, keep: bool = False) -> None:
        self.progress = progress
        self.store: Store | None = None
        self.client: Any = None
        self.cluster: Any = None
        self.pool: Any = None
        self.address = dask
        w = local_workers(n, workers)
        if dask:
            try:
                from dask.distributed import Client, LocalCluster
            except ImportError:
                raise GpuprofError("--dask needs dask.distributed: pip install 'gpuprof[dask]'") from None
            try:
                if dask == "local":
                    self.cluster = LocalCluster(  # type: ignore[no-untyped-call]
                        n_workers=w, threads_per_worker=1, processes=True,
                        dashboard_address=None, silence_logs=logging.CRITICAL)  # a bad trace: one line, ours
                    self.client = Client(self.cluster)  # type: ignore[no-untyped-call]
                else:
                    self.client = Client(dask, timeout="10s")  # type: ignore[no-untyped-call]
            except OSError as e:
                raise GpuprofError(f"cannot reach the Dask scheduler {dask!r} ({e})") from None
            return
        if w > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            ctx = multiprocessing.get_context()
            self.pool = ProcessPoolExecutor(max_workers=w, mp_context=ctx, initializer=_die_with_parent,
                                            initargs=(os.getpid(), ctx.get_start_method() == "fork"))
        elif keep:
            self.store = {}

    @property
    def here(self) -> bool:
        """Whether the work runs in this process."""
        return self.pool is None and self.client is None

    def map(self, fn: Any, *args: Sequence[Any], stage: str = "") -> list[Any]:
        """``fn`` over the argument lists, results in order; ``progress(done, total, stage)`` is
        called as results arrive (when several)."""
        n = len(args[0]) if args else 0
        report = self.progress if self.progress is not None and stage and n > 1 else None
        if self.client is not None:
            return self._dask_map(fn, args, n, report, stage)
        if self.pool is not None:
            from concurrent.futures import as_completed

            storage = strings.current()
            pending = [self.pool.submit(_in_worker, storage, fn, *a) for a in zip(*args)]
            if report is not None:
                for i, _ in enumerate(as_completed(pending), 1):
                    report(i, n, stage)
            return [f.result() for f in pending]
        call = partial(fn, store=self.store) if self.store is not None else fn
        out = []
        for i, a in enumerate(zip(*args), 1):
            out.append(call(*a))
            if report is not None:
                report(i, n, stage)
        return out

    def _dask_map(self, fn: Any, args: Sequence[Sequence[Any]], n: int,
                  report: Callable[[int, int, str], None] | None, stage: str) -> list[Any]:
        """The tasks on the cluster, watched: a task's error is raised as soon as it arrives, and
        a cluster without a scheduler connection or without workers for ``$GPUPROF_DASK_TIMEOUT_S``
        fails with one line instead of waiting for ever."""
        import time
        from functools import partial

        from dask.distributed import KilledWorker, wait

        futures = self.client.map(partial(_on_dask_worker, fn, strings.current()), *args, pure=False)
        label = {f.key: _label(a) for f, a in zip(futures, args[0])}
        limit = _dask_timeout()
        remaining, done, stalled_since = list(futures), 0, None
        while remaining:
            try:
                got = wait(remaining, timeout=_DASK_POLL_S, return_when="FIRST_COMPLETED")  # type: ignore[no-untyped-call]
                finished, remaining = list(got.done), list(got.not_done)
            except TimeoutError:
                finished = []
            for f in finished:
                if f.status == "error":
                    try:
                        f.result()
                    except KilledWorker:
                        raise GpuprofError(f"{label[f.key]}: Dask workers died while analysing it, more often than "
                                           "the scheduler retries a task (distributed.scheduler.allowed-failures); "
                                           "the trace may need more memory than a worker has") from None
                elif f.status == "cancelled":
                    raise GpuprofError(f"{label[f.key]}: its task was cancelled on the Dask cluster {self.address!r}")
            done += len(finished)
            if report is not None:
                for i in range(done - len(finished) + 1, done + 1):
                    report(i, n, stage)
            if not remaining:
                break
            connected = self.client.status == "running"
            workers = len(self.client.scheduler_info().get("workers", {})) if connected else 0
            if connected and workers:
                stalled_since = None
            elif stalled_since is None:
                stalled_since = time.monotonic()
            elif time.monotonic() - stalled_since > limit:
                why = "has no workers" if connected else "is unreachable"
                raise GpuprofError(f"the Dask cluster {self.address!r} {why} since {limit:.0f} s; {len(remaining)} of "
                                   f"{n} ranks unfinished (GPUPROF_DASK_TIMEOUT_S sets how long to wait)")
        return list(self.client.gather(futures))

    def call(self, fn: Any, *args: Any) -> Any:
        return self.map(fn, *[[a] for a in args])[0]

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self.pool is not None:
            if kind is not None and not issubclass(kind, Exception):  # Ctrl-C, SIGTERM: stop now, not after the ranks
                _kill_workers(self.pool)
            self.pool.shutdown(cancel_futures=kind is not None)
        if self.client is not None:
            self.client.close(timeout=10)
        if self.cluster is not None:
            self.cluster.close()
