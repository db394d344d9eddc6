"""What a gpuprof command sets in its own process (the CLI's), for as long as it runs; a call of
the Python API sets none of it.

* pandas' string storage (:mod:`gpuprof.strings`), kept after the command as before.
* Python's cyclic garbage collector: by the time the analysis starts, importing pandas, numpy,
  pyarrow and gpuprof's own modules has made about 60,000 objects the collector tracks, which
  live as long as the process and are never garbage, and each full collection during the
  analysis walks them all again. :func:`analysing` moves them out of its reach (``gc.freeze``)
  once they are imported; objects made after that are collected as before. Measured on the ~100 MB matrix traces, cold
  JSON reports (docs/performance.md, "The collector's frozen imports"): the collector's own time
  (``gc.callbacks``) 0.065 → 0.038 s on the sync-heavy rank and 0.072 → 0.059 s on the 8-rank
  job, peak memory the same: small, and not a constant tuned to get it. :func:`command` gives
  the objects back (``gc.unfreeze``) when the command ends, so a command run inside another
  program (click's test runner, a notebook) leaves the collector as it found it.
* OpenBLAS's thread count, read once when numpy loads the library: :func:`analysing` loads it
  with ``OPENBLAS_NUM_THREADS=1`` and puts the variable back as it was at once, so nothing the
  command starts later inherits the setting. gpuprof's analysis makes no BLAS call (no matrix
  product, no linear algebra), yet on load OpenBLAS starts a worker thread per further CPU that
  spins, waiting for work, before it sleeps: CPU time that bought nothing. Measured on this
  project's 2-core VM (docs/performance.md, "OpenBLAS's idle threads"): ``import numpy`` 0.33 →
  0.19 s of CPU, mean of 8 interleaved runs each.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator

from gpuprof import strings


#: Whether :func:`analysing` froze the collector's objects (and :func:`command` gives them back).
_froze = False


def analysing() -> None:
    """Just before a command's analysis, inside :func:`command`: the string storage set, the
    analysis' modules imported, and everything made so far moved out of the collector's reach
    until :func:`command` ends (unless something else in this process froze objects already: that
    is left to its owner). The collector's state is the process's: a host program that freezes
    objects of its own while a command runs in it has them given back with the command's."""
    global _froze
    _load_numpy_single_threaded()
    strings.own_process()
    import gpuprof.api  # noqa: F401  (its modules are imported now, so that the freeze covers them)

    if not _froze and gc.get_freeze_count() == 0:
        gc.freeze()
        _froze = True


#: OpenBLAS's variable for its thread count (numpy's wheels bundle OpenBLAS).
BLAS_THREADS = "OPENBLAS_NUM_THREADS"


def _load_numpy_single_threaded() -> None:
    """Import numpy, where nothing has yet, with OpenBLAS set to one thread, then put the
    environment back as it was: OpenBLAS reads the variable once, when numpy loads it, so the
    setting stays this process's and no child (a worker, ``record``'s program) inherits it."""
    if "numpy" in sys.modules:
        return
    saved = os.environ.get(BLAS_THREADS)
    os.environ[BLAS_THREADS] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        if saved is None:
            os.environ.pop(BLAS_THREADS, None)
        else:
            os.environ[BLAS_THREADS] = saved


@contextlib.contextmanager
def command() -> Iterator[None]:
    """Around one command: whatever :func:`analysing` froze is given back when it ends."""
    global _froze
    try:
        yield
    finally:
        if _froze:
            gc.unfreeze()
            _froze = False
