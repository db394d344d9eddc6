"""Links between frames (kernel → launch → CPU op → ancestors) and the step windows.

All vectorised: the only Python loops run over threads, nesting levels and steps, never events.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.trace import integrity
from gpuprof.trace.model import RankTrace, TraceMeta, empty_memory
from gpuprof.trace.names import call_kinds

_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
#: Launch calls of this kind replay a graph: the kernels carrying their correlation ran in it.
_GRAPH_LAUNCH = "graph_launch"
_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")


def thread_order(pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Rows by thread (pid, tid), then start time, longer spans first at equal starts, then row:
    ``np.lexsort((-dur, ts, tid, pid))``, computed faster.

    The rows of a trace come nearly in that order, so sorting by (pid, tid, ts) is cheap, while a
    stable sort by the duration first costs 20x as much (18 ms vs 0.8 ms for 170k ops); only rows
    that tie on (pid, tid, ts) need the duration, so only they are sorted by it."""
    order: np.ndarray = np.lexsort((ts, tid, pid))
    p, t, s = pid[order], tid[order], ts[order]
    tie = (p[1:] == p[:-1]) & (t[1:] == t[:-1]) & (s[1:] == s[:-1])
    if tie.any():
        tied = np.r_[tie, False] | np.r_[False, tie]  # every row of a tie group
        group = np.cumsum(np.r_[True, ~tie])  # the tie group of each position
        at = np.flatnonzero(tied)
        rows = order[at]
        order[at] = rows[np.lexsort((rows, -dur[rows], group[at]))]
    return order


def _ranks(x: np.ndarray) -> np.ndarray:
    """Each value's place among the distinct values of ``x`` (``np.unique(x, return_inverse=True)[1]``)."""
    perm = np.argsort(x, kind="stable")
    v = x[perm]
    out = np.empty(len(x), dtype=np.int64)
    out[perm] = np.cumsum(np.r_[True, v[1:] != v[:-1]]) - 1
    return out


def nest(ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Depth and parent row of each op among the ops of its own thread (properly nested spans).

    An op's depth is the number of spans on its thread still open when it starts; its parent is
    the latest-starting op one level up that started no later than it did.

    O(n log n) in ops whatever the depth or the number of threads: every thread is worked on at
    once, through sorted integer keys (thread, time rank) and (depth, position), not a loop per
    thread or per nesting level (10^6 nested ops took 10 minutes that way).
    """
    n = len(ops)
    depth = np.zeros(n, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return depth, parent
    # Outer spans first at equal start times: longer duration first.
    order = thread_order(ops["pid"].to_numpy(), ops["tid"].to_numpy(), ops["ts"].to_numpy(), ops["dur"].to_numpy())
    pid, tid = ops["pid"].to_numpy()[order], ops["tid"].to_numpy()[order]
    ts, end = ops["ts"].to_numpy()[order], ops["end"].to_numpy()[order]
    first = np.r_[True, (np.diff(pid) != 0) | (np.diff(tid) != 0)]
    thread = np.cumsum(first) - 1
    lo = np.flatnonzero(first)[thread]  # where each op's thread begins in this order
    rank = _ranks(np.r_[ts, end])  # times as integers, order kept
    width = 2 * n + 1
    ends = np.sort(thread * width + rank[n:])
    closed = np.searchsorted(ends, thread * width + rank[:n], side="right") - lo  # own thread's spans ended by then
    pos = np.arange(n)
    d = np.maximum(pos - lo - closed + (end <= ts), 0)  # a zero-length span counted itself as closed
    # Parent: the last op before this one one level up; it is on this thread when it is at or after lo.
    keys = np.sort(d * n + pos)
    k = np.searchsorted(keys, (d - 1) * n + pos, side="left") - 1
    hit = keys[np.maximum(k, 0)]
    up = hit % n
    ok = (d > 0) & (k >= 0) & (hit // n == d - 1) & (up >= lo)
    depth[order] = d
    parent[order] = np.where(ok, order[up], -1)
    return depth, parent


_Table = tuple[np.ndarray, np.ndarray, np.ndarray]


def _distinct(table_keys: np.ndarray) -> _Table:
    """A lookup table: the keys, their distinct values sorted and the first row holding each
    (made once per key array: the ops' External ids serve four lookups)."""
    uniq, first = np.unique(table_keys, return_index=True)
    return table_keys, uniq, first


def _lookup(keys: np.ndarray, table: _Table, values: np.ndarray, missing: Any) -> np.ndarray:
    """values[row of the table's keys == key] for each key (first occurrence wins), else ``missing``."""
    table_keys, uniq, first = table
    if len(table_keys) == 0:
        return np.full(len(keys), missing, dtype=values.dtype if len(values) else object)
    pos = np.searchsorted(uniq, keys)
    pos = np.clip(pos, 0, len(uniq) - 1)
    hit = (uniq[pos] == keys) & (keys >= 0)
    out = np.full(len(keys), missing, dtype=values.dtype)
    out[hit] = values[first[pos[hit]]]
    return out


def enclosing_op(ops: pd.DataFrame, parent: np.ndarray, pid: np.ndarray, tid: np.ndarray,
                 ts: np.ndarray) -> np.ndarray:
    """Row of the innermost op on thread (``pid``, ``tid``) whose span holds time ``ts`` (start and
    end included), else -1, for each query. ``parent`` is :func:`nest`'s parent of each op.

    The latest op to start at or before ``ts`` is the innermost candidate (at equal starts the
    shorter one sorts later, as in :func:`nest`); where it has already ended, its ancestors are
    tried, one nesting level per pass.
    """
    out = np.full(len(ts), -1, dtype=np.int64)
    if len(ops) == 0 or len(ts) == 0:
        return out
    o_pid, o_tid = ops["pid"].to_numpy(), ops["tid"].to_numpy()
    o_ts, o_end, o_dur = ops["ts"].to_numpy(), ops["end"].to_numpy(), ops["dur"].to_numpy()
    order = thread_order(o_pid, o_tid, o_ts, o_dur)
    starts = np.flatnonzero(np.r_[True, (np.diff(o_pid[order]) != 0) | (np.diff(o_tid[order]) != 0)])
    bounds = np.r_[starts, len(order)]
    threads = pd.MultiIndex.from_arrays([o_pid[order][starts], o_tid[order][starts]])
    q_thread = threads.get_indexer(pd.MultiIndex.from_arrays([pid, tid]))
    for i in np.unique(q_thread[q_thread >= 0]):
        q = np.flatnonzero(q_thread == i)
        lo, hi = bounds[i], bounds[i + 1]
        k = np.searchsorted(o_ts[order[lo:hi]], ts[q], side="right") - 1
        out[q] = np.where(k >= 0, order[lo + np.maximum(k, 0)], -1)
    open_ = (out >= 0) & np.isfinite(ts)
    pending = np.flatnonzero(open_ & (o_end[np.maximum(out, 0)] < ts))
    while len(pending):  # one pass per nesting level
        out[pending] = parent[out[pending]]
        pending = pending[(out[pending] >= 0) & (o_end[np.maximum(out[pending], 0)] < ts[pending])]
    out[~np.isfinite(ts)] = -1
    return out


def _verified(cand: np.ndarray, ops: pd.DataFrame, ok: np.ndarray, pid: np.ndarray, tid: np.ndarray,
              ts: np.ndarray) -> np.ndarray:
    """Whether each candidate op row holds its launch call: same thread, call inside its span."""
    if len(ops) == 0:
        return np.zeros(len(cand), dtype=bool)
    c = np.maximum(cand, 0)
    held: np.ndarray = ((cand >= 0) & ok & (ops["pid"].to_numpy()[c] == pid) & (ops["tid"].to_numpy()[c] == tid)
                        & (ops["ts"].to_numpy()[c] <= ts) & (ts <= ops["end"].to_numpy()[c]))
    return held


def _link_launches(gpu: pd.DataFrame, runtime: pd.DataFrame, ops: pd.DataFrame, rt_corr: _Table,
                  op_ext: _Table, ambiguous: np.ndarray | None = None) -> pd.DataFrame:
    """Kernel (or copy) → launch call by correlation → op.

    The op is the one whose External id the kernel (else its launch call) carries, provided the
    launch call lies inside that op's span on the op's own thread; otherwise the innermost op
    around the call (``runtime["op"]``). torch ~2.0-2.3 wrote each kernel's correlation id as its
    External id, which names some unrelated op: the check keeps such ids from linking. A kernel
    with no launch call in the trace (launched before the profiler started) keeps its External id
    link unless that id merely repeats its correlation. An ``ambiguous`` event (its correlation id
    shared: :func:`gpuprof.trace.integrity.ambiguous_launches`) is linked to no call and no op.
    """
    corr = gpu["correlation"].to_numpy()
    rows = np.arange(len(runtime))
    rt_row = _lookup(corr, rt_corr, rows, -1).astype(np.int64)
    if ambiguous is not None:
        rt_row[ambiguous] = -1
    ok = rt_row >= 0
    r = np.maximum(rt_row, 0)
    has_rt = len(runtime) > 0
    launch_ts = np.where(ok, runtime["ts"].to_numpy()[r] if has_rt else np.nan, np.nan)
    launch_pid = np.where(ok, runtime["pid"].to_numpy()[r] if has_rt else -1, -1)
    launch_tid = np.where(ok, runtime["tid"].to_numpy()[r] if has_rt else -1, -1)
    gpu["launch_ts"] = launch_ts
    gpu["launch_tid"] = launch_tid
    names = runtime["name"].astype(object).to_numpy()
    api: Any = names[r] if has_rt else np.full(len(gpu), None, dtype=object)
    api[~ok] = None
    gpu["launch_api"] = pd.Categorical(api)
    kind = runtime["kind"].astype(object).to_numpy()
    gpu["in_graph"] = ok & (kind[r] == _GRAPH_LAUNCH) if has_rt else np.zeros(len(gpu), dtype=bool)
    op_rows = np.arange(len(ops))
    by_kernel = _lookup(gpu["external_id"].to_numpy(), op_ext, op_rows, -1)
    rt_ext = np.where(ok, runtime["external_id"].to_numpy()[r] if has_rt else -1, -1)
    by_call = _lookup(rt_ext, op_ext, op_rows, -1)
    around = np.where(ok, runtime["op"].to_numpy()[r] if has_rt else -1, -1)
    op = np.where(_verified(by_kernel, ops, ok, launch_pid, launch_tid, launch_ts), by_kernel,
                  np.where(_verified(by_call, ops, ok, launch_pid, launch_tid, launch_ts), by_call, around))
    unlaunched = ~ok & (by_kernel >= 0) & (gpu["external_id"].to_numpy() != corr)
    if ambiguous is not None:
        unlaunched &= ~ambiguous
    gpu["op"] = np.where(unlaunched, by_kernel, op)
    return gpu


def _profiler_steps(ann: pd.DataFrame, warnings: list[str] | None = None) -> pd.DataFrame | None:
    """The ``ProfilerStep#N`` spans of ``ann`` as step windows, else None. A span of zero or
    negative duration (the loader reads a negative one as 0) holds no event, and had been reported
    as a step of 0.00 ms: it is left out, and a warning in ``warnings`` says how many were."""
    names = ann["name"].astype(str) if len(ann) else pd.Series([], dtype=str)
    m = names.str.extract(_PROFILER_STEP.pattern, expand=False)
    if not (len(ann) and m.notna().any()):
        return None
    empty = m.notna().to_numpy() & ~(ann["dur"].to_numpy() > 0)
    if empty.any() and warnings is not None:
        kept = int(m.notna().sum() - empty.sum())
        first = str(ann["name"].iloc[int(np.flatnonzero(empty)[0])])[:40]
        warnings.append(f"{int(empty.sum())} ProfilerStep span(s) of zero or negative duration (e.g. {first!r}) are "
                        "left out: they hold no event; "
                        + (f"{kept} step(s) remain" if kept else "steps are taken from what else marks them"))
    m = m.where(~empty)
    if not m.notna().any():
        return None
    sel = ann[m.notna()]
    digits = m[m.notna()]
    if digits.str.len().max() <= 18:
        number = digits.astype(np.int64).to_numpy()
    else:  # ProfilerStep#<40 digits>: not an int64; the steps are numbered in order instead
        number = pd.Series(sel["ts"].to_numpy()).rank(method="first").astype(np.int64).to_numpy() - 1
    steps = pd.DataFrame({"step": number, "name": sel["name"].astype(str).to_numpy(),
                          "cpu_start": sel["ts"].to_numpy(), "cpu_end": sel["end"].to_numpy()})
    return steps.sort_values("cpu_start").drop_duplicates("step").reset_index(drop=True)


def _step_windows(annotations: pd.DataFrame, frames: tuple[pd.DataFrame, ...],
                  warnings: list[str] | None = None) -> tuple[pd.DataFrame, str]:
    """Step windows and where they came from: CPU ``ProfilerStep#N`` spans; else the GPU's
    ``ProfilerStep#N`` annotations (a GPU-only trace: the windows are then on the GPU timeline);
    else one step per ``Optimizer.step``; else the whole trace (its first to last event).
    ``ProfilerStep`` spans without duration are left out, said in ``warnings``."""
    on_gpu = annotations["on_gpu"].to_numpy(dtype=bool) if len(annotations) else np.zeros(0, dtype=bool)
    cpu = annotations[~on_gpu]
    steps = _profiler_steps(cpu, warnings)
    if steps is not None:
        return steps, "ProfilerStep"
    starts = [f["ts"].min() for f in frames if len(f)]
    t_first = float(min(starts)) if starts else 0.0
    names = cpu["name"].astype(str) if len(cpu) else pd.Series([], dtype=str)
    opt = names.str.contains(_OPTIMIZER_STEP.pattern) if len(cpu) else pd.Series([], dtype=bool)
    if len(cpu) and opt.any():
        ends = np.sort(cpu[opt]["end"].to_numpy())
        begins = np.r_[t_first, ends[:-1]]
        steps = pd.DataFrame({"step": np.arange(len(ends)), "name": [f"optimizer step {i}" for i in range(len(ends))],
                              "cpu_start": begins, "cpu_end": ends})
        # The first window runs from the trace's first event, not from a step's end: it holds what
        # ran before the loop (set-up, cuDNN autotuning, first allocations), not one step. With
        # enough complete windows (between consecutive optimizer steps) it is left out.
        if len(steps) >= FIRST_WINDOW_DROPPED_FROM:
            steps = steps.iloc[1:].reset_index(drop=True)
        return steps, "optimizer"
    if not len(cpu):
        steps = _profiler_steps(annotations[on_gpu], warnings)
        if steps is not None:
            return steps, "ProfilerStep (GPU)"
    ends_all = [f["end"].max() for f in frames if len(f)]
    t_last = float(max(ends_all)) if ends_all else t_first
    return pd.DataFrame({"step": [0], "name": ["whole trace"], "cpu_start": [t_first], "cpu_end": [t_last]}), "whole trace"


#: Optimizer-step windows needed before the first (open-ended) one is left out of the analysis.
FIRST_WINDOW_DROPPED_FROM = 3


def _assign(times: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Index of the step whose CPU window holds each time, else -1."""
    if len(steps) == 0:
        return np.full(len(times), -1, dtype=np.int64)
    starts, ends = steps["cpu_start"].to_numpy(), steps["cpu_end"].to_numpy()
    k = np.searchsorted(starts, times, side="right") - 1
    kk = np.maximum(k, 0)
    ok = (k >= 0) & (times < ends[kk]) & np.isfinite(times)
    return np.where(ok, kk, -1)


def _gpu_times(steps: pd.DataFrame, kernels: pd.DataFrame, memcpys: pd.DataFrame) -> pd.DataFrame:
    """Step windows on the GPU timeline.

    The CPU runs ahead of the GPU, so CPU spans misstate step time. A step starts on the GPU when
    both its CPU span has begun and the GPU has finished earlier work (the previous step's, or
    work launched before the profiled window), and ends when its last kernel or copy ends.
    """
    gpu = pd.concat([kernels[["ts", "end", "step"]], memcpys[["ts", "end", "step"]]], ignore_index=True)
    g = gpu[gpu["step"] >= 0].groupby("step")
    first, last, count = g["ts"].min(), g["end"].max(), g.size()
    steps["gpu_start"] = first.reindex(range(len(steps))).to_numpy()
    steps["gpu_end"] = last.reindex(range(len(steps))).to_numpy()
    steps["kernels"] = count.reindex(range(len(steps))).fillna(0).astype(np.int64).to_numpy()
    prev_end = np.r_[np.nan, steps["gpu_end"].to_numpy()[:-1]]
    if len(steps) and np.isfinite(steps["gpu_start"].iloc[0]):
        earlier = gpu[(gpu["step"] < 0) & (gpu["ts"] < steps["gpu_start"].iloc[0])]
        prev_end[0] = earlier["end"].max() if len(earlier) else np.nan
    start = np.fmax(steps["cpu_start"].to_numpy(), prev_end)
    start = np.fmin(start, steps["gpu_start"].to_numpy())  # never after the step's own first kernel
    has_gpu = np.isfinite(steps["gpu_start"].to_numpy())
    steps["start"] = np.where(has_gpu, start, steps["cpu_start"].to_numpy())
    steps["end"] = np.where(has_gpu, steps["gpu_end"].to_numpy(), steps["cpu_end"].to_numpy())
    steps["time"] = steps["end"] - steps["start"]
    return steps


def attach_links(kernels: pd.DataFrame, memcpys: pd.DataFrame, ops: pd.DataFrame, runtime: pd.DataFrame,
                 annotations: pd.DataFrame, meta_kwargs: dict[str, Any], warnings: list[str],
                 memory: pd.DataFrame | None = None) -> RankTrace:
    memory = empty_memory() if memory is None else memory
    # Damage no profiler writes, found before anything is linked (gpuprof.trace.integrity).
    kept, repeated = integrity.drop_repeated({"kernels": kernels, "memcpys": memcpys, "ops": ops, "runtime": runtime,
                                              "annotations": annotations, "memory": memory})
    kernels, memcpys, ops, runtime = kept["kernels"], kept["memcpys"], kept["ops"], kept["runtime"]
    annotations, memory = kept["annotations"], kept["memory"]
    if repeated:
        warnings.append(repeated)
    depth, parent = nest(ops)
    ops["depth"], ops["parent"] = depth, parent
    runtime["kind"] = pd.Categorical(call_kinds(runtime["name"]))
    runtime["op"] = enclosing_op(ops, parent, runtime["pid"].to_numpy(), runtime["tid"].to_numpy(),
                                 runtime["ts"].to_numpy())
    k_amb, m_amb, shared = integrity.ambiguous_launches(kernels, memcpys, runtime, str(meta_kwargs.get("path")))
    if shared:
        warnings.append(shared)
    rt_corr, op_ext = _distinct(runtime["correlation"].to_numpy()), _distinct(ops["external_id"].to_numpy())
    kernels = _link_launches(kernels, runtime, ops, rt_corr, op_ext, k_amb if shared else None)
    memcpys = _link_launches(memcpys, runtime, ops, rt_corr, op_ext, m_amb if shared else None)
    steps, source = _step_windows(annotations, (ops, runtime, annotations, kernels, memcpys), warnings)
    if source == "whole trace":
        warnings.append("no ProfilerStep or optimizer-step annotations: the whole trace is analysed as one step")
    elif source == "optimizer" and len(steps) >= FIRST_WINDOW_DROPPED_FROM - 1:
        warnings.append("steps are the windows between optimizer steps (no ProfilerStep annotations); the one "
                        "before the first optimizer step (set-up, warm-up) is left out")
    for frame, col in ((ops, "ts"), (runtime, "ts"), (memory, "ts")):
        frame["step"] = _assign(frame[col].to_numpy(), steps)
    for frame in (kernels, memcpys):
        # GPU-annotation windows hold the GPU work itself; CPU windows hold its launch calls.
        frame["step"] = _assign(frame["ts" if source == "ProfilerStep (GPU)" else "launch_ts"].to_numpy(), steps)
        if source == "whole trace":
            frame["step"] = 0
    steps = _gpu_times(steps, kernels, memcpys)
    comm = kernels[kernels["is_comm"]]
    collectives = pd.DataFrame({
        "kernel": comm.index.to_numpy(), "name": comm["name"].astype(str).to_numpy(),
        "collective": comm["collective"].astype(object).to_numpy(), "dtype": comm["coll_dtype"].astype(object).to_numpy(),
        "in_nelems": comm["in_nelems"].to_numpy(), "out_nelems": comm["out_nelems"].to_numpy(),
        "group_size": comm["group_size"].to_numpy(), "process_group": comm["process_group"].astype(object).to_numpy(),
        "ts": comm["ts"].to_numpy(), "dur": comm["dur"].to_numpy(), "step": comm["step"].to_numpy(),
    })
    kinds = runtime["kind"].astype(object).to_numpy()
    meta = TraceMeta(steps_source=source, warnings=tuple(warnings),
                     graph_capture_calls=int((kinds == "graph_capture").sum()),
                     graph_launch_calls=int((kinds == _GRAPH_LAUNCH).sum()),
                     cpu_events=len(ops) + int((~annotations["on_gpu"].to_numpy(dtype=bool)).sum()),
                     runtime_calls=len(runtime), **meta_kwargs)
    return RankTrace(meta=meta, kernels=kernels, memcpys=memcpys, ops=ops, runtime=runtime,
                     annotations=annotations, steps=steps, collectives=collectives, memory=memory)
