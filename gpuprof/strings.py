"""Where pandas keeps gpuprof's string data, in the processes gpuprof owns.

pandas 3 infers a ``str`` dtype for string data, stored in pyarrow when pyarrow is installed
(``mode.string_storage`` "auto"), and the column labels of every frame built from a dict are such
strings too. gpuprof's analysis builds and reshapes many frames of a few columns each (a rank
view, each analyzer's tables, the replay's plans), keeps its long name columns as categoricals,
and asks for columns by label thousands of times a rank; there the pyarrow storage costs per call
(an Index ``insert`` converts through pyarrow, a label lookup goes through its engine) and
stores nothing big. With the Python storage (the same ``str`` dtype and semantics, values kept as
Python objects) a cold report of the 8-rank ~100 MB job took 17 % less CPU after the imports, and
every report over the sample, public and HTA traces stayed byte-identical
(``benchmarks.report_digest``; docs/performance.md, "String storage").

A library must not change its caller's pandas settings, so only the processes gpuprof owns take
it: the CLI's (:func:`own_process`) and the local worker and Dask tasks a job hands work to, which
run with the storage of the process that started them (:func:`current`, :func:`running`), so a
rank analysed elsewhere comes back in the same storage as one analysed here. A call of the Python
API keeps the caller's setting.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

#: The pandas option that chooses the storage of inferred strings (pandas 2.x and 3.x).
OPTION = "mode.string_storage"
#: What gpuprof's own processes use.
OWN = "python"


def own_process() -> None:
    """Set this process's string storage to :data:`OWN`: for a process gpuprof owns (the CLI's)."""
    import pandas as pd

    with contextlib.suppress(KeyError, ValueError, pd.errors.OptionError):  # an option a later pandas dropped
        pd.set_option(OPTION, OWN)


def current() -> str | None:
    """This process's string storage, to hand to the work it starts elsewhere (``None`` where
    pandas is not imported yet, or has no such option)."""
    pd = sys.modules.get("pandas")
    if pd is None:
        return None
    try:
        value = pd.get_option(OPTION)
    except (KeyError, ValueError, pd.errors.OptionError):
        return None
    return str(value)


@contextlib.contextmanager
def running(storage: str | None) -> Iterator[None]:
    """Work in another process with the storage of the process that started it (``None``: as is)."""
    if storage is None:
        yield
        return
    import pandas as pd

    with contextlib.ExitStack() as stack:
        with contextlib.suppress(KeyError, ValueError, pd.errors.OptionError):  # a worker's pandas without it
            stack.enter_context(pd.option_context(OPTION, storage))
        yield
