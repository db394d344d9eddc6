"""What no profiler writes, found in a trace's frames before they are linked: events recorded
twice, correlation ids shared by launches. Each is dropped, left unlinked or refused, and said,
never counted quietly (a trace concatenated with itself had doubled every kernel count; shared
ids had linked kernels to other steps' launches, one finding then claiming the whole step).

No real trace here (``sample_traces/``; the public, HTA and TraceLens traces of CUDA and ROCm,
torch 1.8 to 2.11) holds either: a rule fires only on damage, which
``tests/test_hostile_numbers.py`` makes from a real trace.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuprof.errors import TraceError
from gpuprof.trace.names import per_category

#: The columns that make two events of a frame the same event: a profiler never writes two
#: events alike in all of them (the same kernel on the same stream at the same time, the same op
#: with the same External id on the same thread at the same time).
IDENTITY: dict[str, tuple[str, ...]] = {
    "kernels": ("name", "ts", "dur", "device", "stream", "correlation"),
    "memcpys": ("name", "ts", "dur", "device", "stream", "correlation", "bytes"),
    "ops": ("name", "ts", "dur", "pid", "tid", "external_id"),
    "runtime": ("name", "ts", "dur", "pid", "tid", "correlation"),
    "annotations": ("name", "ts", "dur", "pid", "tid", "on_gpu", "device", "stream"),
    "memory": ("ts", "bytes", "total_allocated", "total_reserved", "device", "pid", "tid"),
}

#: Above this share of GPU events with an ambiguous launch (see :func:`ambiguous_launches`) the
#: trace is refused: its links, and every number built on them, would rest on guesses. At or
#: below it those events are left without a launch call and a warning counts them.
AMBIGUOUS_MAX_SHARE = 0.01


def drop_repeated(frames: dict[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], str | None]:
    """``frames`` with every event that repeats an earlier one exactly (:data:`IDENTITY`) left
    out, rows renumbered, and the warning saying so (None when nothing repeats)."""
    out, dropped = {}, 0
    for key, df in frames.items():
        cols = [c for c in IDENTITY.get(key, ()) if c in df.columns]
        if len(df) < 2 or not cols:
            out[key] = df
            continue
        again = _repeats(df, cols)
        n = int(again.sum())
        if n:
            dropped += n
            df = df[~again].reset_index(drop=True)
        out[key] = df
    if not dropped:
        return out, None
    total = sum(len(f) for f in frames.values())
    return out, (f"{dropped:,} of {total:,} events repeat another exactly (a trace concatenated with itself, "
                 "or written twice?): each is counted once")


def _repeats(df: pd.DataFrame, cols: list[str]) -> np.ndarray:
    """Whether each row repeats an earlier one in ``cols``. Only rows whose start and duration
    (bytes, for memory events) recur are compared in full: one hashed column over all rows is 5x
    cheaper than all of them (15 ms against 90 ms for 260k ops), and they are rare."""
    second = "dur" if "dur" in df.columns else "bytes"
    a = df["ts"].to_numpy(dtype=np.float64).view(np.uint64)
    b = df[second].to_numpy(dtype=np.float64).view(np.uint64)
    key = a ^ ((b << np.uint64(29)) | (b >> np.uint64(35)))  # equal for equal pairs; collisions only add rows
    maybe = pd.Series(key).duplicated(keep=False).to_numpy()
    out = np.zeros(len(df), dtype=bool)
    if maybe.any():
        out[np.flatnonzero(maybe)] = df[maybe].duplicated(subset=cols).to_numpy()
    return out


def ambiguous_launches(kernels: pd.DataFrame, memcpys: pd.DataFrame, runtime: pd.DataFrame,
                       path: str) -> tuple[np.ndarray, np.ndarray, str | None]:
    """Which kernels and which memcpys cannot be matched to the call that launched them, and the
    warning counting them; refuses the trace (:class:`TraceError`) when more than
    :data:`AMBIGUOUS_MAX_SHARE` of its GPU events are so.

    A GPU event is ambiguous when its correlation id is carried by two or more runtime calls; a
    kernel too when it shares a single-kernel launch call (``cudaLaunchKernel``,
    ``hipLaunchKernel``...) with another kernel. A graph launch is one call for many kernels, and
    kernels of a graph replayed before the profiler started share an id with no call in the
    trace: neither is ambiguous. ``runtime`` must have its ``kind`` column."""
    rt_corr = runtime["correlation"].to_numpy(dtype=np.int64)
    ids, calls = np.unique(rt_corr[rt_corr >= 0], return_counts=True)
    shared = ids[calls > 1]
    kinds = runtime["kind"].astype(object).to_numpy()
    # cudaLaunchCooperativeKernelMultiDevice, hipExtLaunchMultiKernelMultiDevice: one call, several kernels
    several = per_category(runtime["name"], lambda n: "Multi" in n, dtype=bool) if len(runtime) else np.zeros(0, bool)
    single = np.unique(rt_corr[(kinds == "launch") & ~several & (rt_corr >= 0)])
    k_corr = kernels["correlation"].to_numpy(dtype=np.int64)
    on_single = k_corr[(k_corr >= 0) & np.isin(k_corr, single)]
    k_ids, k_n = np.unique(on_single, return_counts=True)
    k_hit = (k_corr >= 0) & (np.isin(k_corr, shared) | np.isin(k_corr, k_ids[k_n > 1]))
    m_corr = memcpys["correlation"].to_numpy(dtype=np.int64)
    m_hit = (m_corr >= 0) & np.isin(m_corr, shared)
    n = int(k_hit.sum() + m_hit.sum())
    if not n:
        return k_hit, m_hit, None
    total = len(kernels) + len(memcpys)
    frame, hit = (kernels, k_hit) if k_hit.any() else (memcpys, m_hit)
    row = int(np.flatnonzero(hit)[0])
    example = f"{str(frame['name'].iloc[row])[:60]!r}, correlation {int(frame['correlation'].iloc[row])}"
    said = f"{n:,} of {total:,} GPU events share their correlation id with other launches (e.g. {example})"
    if n > AMBIGUOUS_MAX_SHARE * total:
        raise TraceError(f"{said}, so they cannot be matched to the calls that launched them; a profiler writes "
                         "one id per launch (two traces merged into one file?)", path)
    return k_hit, m_hit, f"{said}: each is left unlinked (no launch call, op or CPU step window)"
