"""The dependency graph of one job's traces, as flat arrays (the replay's data model).

Two kinds of node, each with a start and an end:

* **host calls** (``h_*``, one per CUDA runtime/driver call, every rank): one chain per rank in
  start order, whatever the thread. A call starts ``h_gap`` after the previous call of its rank
  ended (the host work between them: Python, the dispatcher, the profiler's own cost) and lasts
  ``h_dur``. A call that waits for the GPU (stream/device/event synchronise, a blocking copy,
  ``.item()``) ends no earlier than ``h_tail`` after the GPU work it waited for (``h_wait``) ends.
  Threads share one chain because PyTorch's threads hand work to each other (the main thread
  waits in ``backward()`` while the autograd thread launches): a delay on one delays what follows
  on the rank. Overlapping calls of two threads get a negative gap, which replays them as traced.
* **GPU activities** (``a_*``: kernels, copies, memsets): one chain per (rank, stream) in start
  order. An activity starts at the latest of: its launch call's start + ``a_lat``, its stream
  predecessor's end + ``a_sgap``, and the end of ``a_dep`` + ``a_depw``, an activity of another
  stream it waited on (inferred: an activity that started later than its launch and its stream
  allow waited on the latest-ending activity of another stream before it, the effect of
  ``cudaStreamWaitEvent``). It lasts ``a_dur``. A CUDA-graph launch is one host call holding all
  its kernels: they share that call as their launch.
* **collectives** (NCCL/RCCL kernels) matched across ranks by process group and sequence number
  (``a_coll``, set when ranks are joined: :mod:`gpuprof.replay.job`): each ends ``a_dur`` (its
  transfer time, measured on the last rank to arrive) after the last rank's kernel started.

Edge weights are measured. The edge that held a node up in the trace (its latest constraint) gets
exactly the measured difference; the others get the rank's typical value (the median launch
latency when the stream was idle, the median gap between back-to-back kernels), never more than
the measured difference. Replaying the unchanged graph therefore gives back the traced times;
a transformation moves a node only as far as its other constraints allow.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from gpuprof.errors import GpuprofError
from gpuprof.trace.model import RankTrace
from gpuprof.trace.names import ALLOCATOR_CALLS, REPLAY_COPY_CALLS, REPLAY_SYNC_CALLS

KINDS = ("kernel", "memcpy")
#: A call lasting this many times its name's median that saw GPU work finish was held by the GPU.
BLOCKED_FACTOR = 10.0
#: A rank whose pending launches reach this many has filled CUDA's launch queue (about a thousand
#: entries: 1038-1041 pending when the host of ddp_slow_rank's waiting rank was held up).
QUEUE_MIN = 512
QUEUE_FULL = 0.9


@dataclass(frozen=True)
class Graph:
    """One job's dependency graph; arrays, never mutated (transformations return a new Graph).

    Host arrays are sorted by (rank, start); activity arrays by (rank, stream, start), so each
    chain is a contiguous run. Times are µs on a clock shared by the ranks (each rank's ``t0``
    aligned by ``t0_epoch_ns``); ``*_ts``/``*_end`` are the traced times, the rest are weights.
    """

    ranks: tuple[int, ...]
    rank_offset_us: np.ndarray  # per rank: add to the rank's trace times to get the shared clock
    # host calls
    h_rank: np.ndarray  # index into ``ranks``
    h_row: np.ndarray  # row of the rank's ``runtime`` frame
    h_name: np.ndarray  # call name (object)
    h_ts: np.ndarray
    h_end: np.ndarray
    h_first: np.ndarray  # bool: first call of its rank (its start is fixed at the traced time)
    h_gap: np.ndarray  # µs from the previous call's end to this call's start
    h_dur: np.ndarray  # µs the call takes on the host when it does not wait
    h_wait: np.ndarray  # activity it waits for, -1
    h_tail: np.ndarray  # µs from that activity's end to the call's return
    h_events: np.ndarray  # recorded host events (ops, this call) in the gap before it, for deflation
    h_step: np.ndarray  # index of the rank's step (row of ``steps``), -1
    h_bp: np.ndarray  # activity whose end frees this call's slot in a full launch queue, -1
    h_bpw: np.ndarray  # µs from that end to the call's start
    #: bool: an allocation or release call (``ALLOCATOR_CALLS``): its own time is the driver's work
    #: (mapping or unmapping memory, the device synchronisation of a ``cudaFree``), which the
    #: profiler slows only by its fixed cost per call, not as it slows Python and dispatch
    #: (``gpuprof.replay.host.host_speed``)
    h_driver: np.ndarray
    # GPU activities
    a_rank: np.ndarray
    a_kind: np.ndarray  # 0 kernel, 1 memcpy/memset (index into KINDS)
    a_row: np.ndarray  # row of the rank's kernels or memcpys frame
    a_stream: np.ndarray
    a_ts: np.ndarray
    a_end: np.ndarray
    a_first: np.ndarray  # bool: first activity of its stream
    a_launch: np.ndarray  # host call that launched it, -1
    a_lat: np.ndarray
    a_sgap: np.ndarray
    a_dep: np.ndarray  # activity of another stream it waited on, -1
    a_depw: np.ndarray
    a_dur: np.ndarray  # µs it runs (a collective: its transfer time after the last rank arrived)
    a_coll: np.ndarray  # matched collective id across ranks, -1
    a_step: np.ndarray  # index of the rank's step (row of ``steps``), -1
    # steps, per rank and step
    s_rank: np.ndarray
    s_cpu_start: np.ndarray  # the step's CPU start, shared clock
    s_anchor: np.ndarray  # the first host call at or after it (moves it), -1

    @property
    def n_host(self) -> int:
        return len(self.h_ts)

    @property
    def n_acts(self) -> int:
        return len(self.a_ts)


def _activities(t: RankTrace, rank_i: int, offset: float) -> pd.DataFrame:
    cols = ["ts", "end", "stream", "correlation", "step"]
    k = t.kernels[cols].assign(kind=0, row=np.arange(len(t.kernels)), is_comm=t.kernels["is_comm"].to_numpy())
    pageable = (_text(t.memcpys["src"]) == "Pageable") | (_text(t.memcpys["dst"]) == "Pageable")
    m = t.memcpys[cols].assign(kind=1, row=np.arange(len(t.memcpys)), is_comm=False,
                               pageable=pageable)
    a = pd.concat([k, m], ignore_index=True)
    a["ts"] = a["ts"] + offset
    a["end"] = a["end"] + offset
    a["rank_i"] = rank_i
    return a


def _text(col: pd.Series) -> np.ndarray:
    """A text column as an object array, decoded once per distinct value (names are categorical)."""
    codes, uniq = pd.factorize(col, use_na_sentinel=True)
    labels = np.array([str(u) for u in uniq] + ["nan"], dtype=object)
    out: np.ndarray = labels[codes]  # code -1 (missing) picks the trailing "nan"
    return out


def _host(t: RankTrace, rank_i: int, offset: float) -> pd.DataFrame:
    rt = t.runtime
    h = pd.DataFrame({"ts": rt["ts"].to_numpy() + offset, "end": rt["end"].to_numpy() + offset,
                      "name": _text(rt["name"]), "correlation": rt["correlation"].to_numpy(),
                      "row": np.arange(len(rt)), "rank_i": rank_i,
                      "step": rt["step"].to_numpy()})
    h = h.sort_values(["ts", "end"], kind="stable").reset_index(drop=True)
    # Recorded ops starting in the gap before each call (and the call itself): the profiler's cost.
    op_ts = np.sort(t.ops["ts"].to_numpy() + offset)
    prev_end = np.r_[-np.inf, h["end"].to_numpy()[:-1]]
    h["events"] = (np.searchsorted(op_ts, h["ts"].to_numpy(), side="left")
                   - np.searchsorted(op_ts, prev_end, side="left") + 1).clip(min=1)
    return h


def _median_or(x: np.ndarray, fallback: float) -> float:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else fallback


class ReplayError(GpuprofError):
    """A trace whose dependency graph could not be built: the report goes on without a replay
    (no replayed step time or projection; findings keep the time they claim), saying why."""


def build(traces: Sequence[RankTrace]) -> Graph:
    """The dependency graph of one rank's trace (several traces: each one's graph side by side on
    one clock, not coupled; :func:`gpuprof.replay.build` joins the ranks of a job, collectives
    matched across ranks). A trace the graph cannot be built from raises :class:`ReplayError`
    naming what failed, never another exception: a replay is a figure on the report, and one that
    cannot be made is a note on it, not the end of it."""
    try:
        return _build(traces)
    except GpuprofError:
        raise
    except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError) as e:
        where = traceback.extract_tb(e.__traceback__)[-1]
        raise ReplayError(f"the replay's dependency graph could not be built ({type(e).__name__} in "
                          f"{Path(where.filename).name}:{where.lineno}: {e})",
                          traces[0].meta.path if traces else None) from e


def _build(traces: Sequence[RankTrace]) -> Graph:
    ranks = tuple(t.meta.rank for t in traces)
    t0 = np.array([t.meta.t0_epoch_ns for t in traces], dtype=np.int64)
    offset = ((t0 - t0.min()) / 1000.0).astype(float) if len(t0) else np.zeros(0)
    hosts = [_host(t, i, float(offset[i])) for i, t in enumerate(traces)]
    acts = [_activities(t, i, float(offset[i])) for i, t in enumerate(traces)]
    h = pd.concat(hosts, ignore_index=True).sort_values(["rank_i", "ts", "end"], kind="stable").reset_index(drop=True)
    a = pd.concat(acts, ignore_index=True)
    a = a.sort_values(["rank_i", "stream", "ts", "end"], kind="stable").reset_index(drop=True)

    # launch call of each activity: the host call of its rank with the same correlation id
    hk = h["rank_i"].to_numpy().astype(np.int64) * (1 << 40) + h["correlation"].to_numpy().astype(np.int64)
    ak = a["rank_i"].to_numpy().astype(np.int64) * (1 << 40) + a["correlation"].to_numpy().astype(np.int64)
    order = np.argsort(hk, kind="stable")
    pos = np.clip(np.searchsorted(hk[order], ak), 0, max(len(hk) - 1, 0))
    hit = (len(hk) > 0) & (a["correlation"].to_numpy() >= 0)
    if len(hk):
        hit = hit & (hk[order][pos] == ak)
    launch = np.where(hit, order[pos] if len(hk) else -1, -1)

    h_first, h_gap = _host_chain(h)
    h_wait, h_tail, h_dur = _waits(h, a, launch)
    h_bp, h_bpw, h_gap = _queue(h, a, launch, h_gap)
    a_first, lat, sgap, dep, depw = _gpu_edges(a, h, launch)
    coll, dur = np.full(len(a), -1, dtype=np.int64), (a["end"] - a["ts"]).to_numpy()  # coupled by ranks.join
    s_rank, s_cpu, s_anchor = _steps(traces, offset, h)
    return Graph(
        ranks=ranks, rank_offset_us=offset,
        h_rank=h["rank_i"].to_numpy(), h_row=h["row"].to_numpy(), h_name=h["name"].to_numpy(dtype=object),
        h_ts=h["ts"].to_numpy(), h_end=h["end"].to_numpy(), h_first=h_first, h_gap=h_gap, h_dur=h_dur,
        h_wait=h_wait, h_tail=h_tail, h_events=h["events"].to_numpy(), h_step=h["step"].to_numpy(), h_bp=h_bp, h_bpw=h_bpw,
        h_driver=named(h["name"].to_numpy(dtype=object), ALLOCATOR_CALLS),
        a_rank=a["rank_i"].to_numpy(), a_kind=a["kind"].to_numpy(), a_row=a["row"].to_numpy(),
        a_stream=a["stream"].to_numpy(), a_ts=a["ts"].to_numpy(), a_end=a["end"].to_numpy(), a_first=a_first,
        a_launch=launch, a_lat=lat, a_sgap=sgap, a_dep=dep, a_depw=depw, a_dur=dur, a_coll=coll,
        a_step=a["step"].to_numpy(), s_rank=s_rank, s_cpu_start=s_cpu, s_anchor=s_anchor)


def named(names: np.ndarray, among: Iterable[str]) -> np.ndarray:
    """Which of the call names ``names`` are ``among`` the given ones, decided once per distinct
    name (``np.isin`` on the object column sorts every row's string)."""
    codes, uniq = pd.factorize(names)
    wanted = set(among)
    hit = np.array([u in wanted for u in uniq], dtype=bool)
    out: np.ndarray = (hit[codes] & (codes >= 0)) if len(hit) else np.zeros(len(names), dtype=bool)
    return out


def _host_chain(h: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    r = h["rank_i"].to_numpy()
    first = np.r_[True, r[1:] != r[:-1]] if len(r) else np.zeros(0, dtype=bool)
    gap = h["ts"].to_numpy() - np.r_[np.nan, h["end"].to_numpy()[:-1]]
    return first, np.where(first, 0.0, gap)


def _waits(h: pd.DataFrame, a: pd.DataFrame, launch: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each host call, the GPU activity it waited for (-1), the µs from its end to the call's
    return, and the call's own duration when it does not wait.

    A synchronising call waits for the latest-ending activity of its rank launched before it
    started that ended while it ran; a copy call waits for its own copy when the call returned
    only after the copy ended, or when the copy is to or from pageable memory.
    """
    n = len(h)
    wait = np.full(n, -1, dtype=np.int64)
    ts, end, names = h["ts"].to_numpy(), h["end"].to_numpy(), h["name"].to_numpy()
    code, uniq = pd.factorize(names)
    is_sync = np.isin(uniq, list(REPLAY_SYNC_CALLS))[code]
    is_copy_call = np.isin(uniq, list(REPLAY_COPY_CALLS))[code]
    dur = end - ts
    a_end = a["end"].to_numpy()
    # own copy: the call returned after its copy ended
    own = np.flatnonzero(launch >= 0)
    is_copy = is_copy_call[launch[own]] & (a["kind"].to_numpy()[own] == 1)
    own = own[is_copy]
    # CUDA returns from a copy to or from pageable memory only once the last staged chunk is
    # copied: the call waits for its copy even when it returns a few µs before the copy's end.
    pageable = a["pageable"].to_numpy().astype(bool)[own]
    blocking = (a_end[own] > ts[launch[own]]) & ((a_end[own] <= end[launch[own]]) | pageable)
    wait[launch[own[blocking]]] = own[blocking]
    # synchronising calls: the latest activity that ended while the call ran, launched before it
    sync = np.flatnonzero(is_sync & (wait < 0))
    wait[sync] = _latest_done(h, a, launch, sync)
    # A launch that blocks: the launch queue was full (the host ran far ahead of the GPU) and
    # the call returned once the GPU finished something. Taken as such when the call lasted
    # BLOCKED_FACTOR x its name's median and GPU work ended while it ran.
    median = pd.Series(dur).groupby(code).transform("median").to_numpy()
    slow = np.flatnonzero((wait < 0) & (dur >= BLOCKED_FACTOR * np.maximum(median, 1e-3))
                          & ~is_sync)
    wait[slow] = _latest_done(h, a, launch, slow)
    # µs from the awaited activity's end to the call's return (< 0: returned before its copy
    # ended); indexed only where a call waits, so a rank without GPU activities has none to index
    tail = np.zeros(n)
    waits = wait >= 0
    tail[waits] = end[waits] - a_end[wait[waits]]
    # Own duration when not waiting: the median of the same call's non-waiting durations; for a
    # call that waited every time it was made (every cudaMemcpyAsync of a pageable batch), the
    # median of the trace's non-waiting calls. Its waited time is no measure of it: a pageable
    # copy's call returns only after the work queued ahead of its copy and the copy itself ran
    # (ho_unet_pageable: 7.5 ms behind the previous step, then 3.3 ms of copy, in a 10.8 ms call).
    own_dur = dur.copy()
    if (wait >= 0).any():
        free = pd.Series(dur[wait < 0]).groupby(code[wait < 0]).median()
        typical = pd.Series(code[wait >= 0]).map(free).to_numpy(dtype=float)
        waited = dur[wait >= 0]
        any_call = float(np.median(dur[wait < 0])) if (wait < 0).any() else np.nan
        fallback = np.fmin(any_call, waited - tail[wait >= 0]) if np.isfinite(any_call) else waited - tail[wait >= 0]
        own_dur[wait >= 0] = np.fmin(np.where(np.isfinite(typical), typical, fallback), waited)
    return wait, tail, np.maximum(own_dur, 0.0)


def _queue(h: pd.DataFrame, a: pd.DataFrame, launch: np.ndarray, gap: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Launch-queue back-pressure. On a rank whose pending launches reached CUDA's queue depth
    (``QUEUE_MIN`` or more), a host gap that began with the queue nearly full (at least
    ``QUEUE_FULL`` of the most pending seen) and in which GPU work ended was the host waiting for
    a free slot, not working: the host resumed after the last activity that ended in the gap.
    That gap becomes the rank's median gap, and the wait an edge with its measured weight."""
    n = len(h)
    bp, bpw = np.full(n, -1, dtype=np.int64), np.zeros(n)
    gap = gap.copy()
    ts, end, rank = h["ts"].to_numpy(), h["end"].to_numpy(), h["rank_i"].to_numpy()
    a_end = a["end"].to_numpy()
    for r in np.unique(rank):  # ranks are few
        calls = np.flatnonzero(rank == r)
        acts = np.flatnonzero(a["rank_i"].to_numpy() == r)
        l_sorted = np.sort(np.where(launch[acts] >= 0, ts[np.maximum(launch[acts], 0)], -np.inf))
        by_end = acts[np.argsort(a_end[acts], kind="stable")]
        e_sorted = a_end[by_end]
        gap_start = np.r_[-np.inf, end[calls][:-1]]
        pending = np.searchsorted(l_sorted, gap_start, "right") - np.searchsorted(e_sorted, gap_start, "right")
        q = int(pending.max()) if len(calls) else 0
        if q < QUEUE_MIN:
            continue
        k = np.searchsorted(e_sorted, ts[calls], side="right") - 1  # last activity ended by the call
        ended_in_gap = (k >= 0) & (e_sorted[np.maximum(k, 0)] > gap_start)
        held = ended_in_gap & (pending >= QUEUE_FULL * q) & (gap[calls] > 0)
        c = calls[held]
        typical = _median_or(gap[calls][~held & (gap[calls] > 0)], 0.0)
        bp[c] = by_end[k[held]]
        bpw[c] = ts[c] - e_sorted[k[held]]
        gap[c] = np.minimum(gap[c], typical)
    return bp, bpw, gap


def _latest_done(h: pd.DataFrame, a: pd.DataFrame, launch: np.ndarray, calls: np.ndarray) -> np.ndarray:
    """For each of ``calls``: the latest-ending activity of its rank, launched before the call
    began (or before the trace began), that ended while the call ran (-1 if none)."""
    out = np.full(len(calls), -1, dtype=np.int64)
    launched = np.arange(len(a))
    if not len(calls) or not len(launched):
        return out
    ts, end, rank = h["ts"].to_numpy(), h["end"].to_numpy(), h["rank_i"].to_numpy()
    a_end = a["end"].to_numpy()
    # work without a launch record was launched before the trace began: before any call
    l_ts = np.where(launch >= 0, ts[np.maximum(launch, 0)] if len(ts) else 0.0, -np.inf)
    l_rank = a["rank_i"].to_numpy()
    order = np.lexsort((a_end[launched], l_rank))  # per rank, by end
    ids, l_ts, l_rank = launched[order], l_ts[order], l_rank[order]
    ee = a_end[ids]
    c_rank = rank[calls]
    for r in np.unique(c_rank):  # ranks are few; the work per rank is vectorised
        sel = np.flatnonzero(c_rank == r)
        lo, hi = np.searchsorted(l_rank, r, "left"), np.searchsorted(l_rank, r, "right")
        c = calls[sel]
        k = np.searchsorted(ee[lo:hi], end[c], side="right") - 1 + lo
        # step back over activities launched after the call began (other threads): few
        for j in np.flatnonzero((k >= lo) & (l_ts[np.maximum(k, 0)] > ts[c])):
            kk = int(k[j])
            while kk >= lo and l_ts[kk] > ts[c[j]]:
                kk -= 1
            k[j] = kk
        ok = (k >= lo) & (ee[np.maximum(k, 0)] > ts[c])
        out[sel[ok]] = ids[k[ok]]
    return out


def _gpu_edges(a: pd.DataFrame, h: pd.DataFrame, launch: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    n = len(a)
    ts, end = a["ts"].to_numpy(), a["end"].to_numpy()
    rank_i, stream = a["rank_i"].to_numpy(), a["stream"].to_numpy()
    first = np.r_[True, (rank_i[1:] != rank_i[:-1]) | (stream[1:] != stream[:-1])] if n else np.zeros(0, bool)
    prev_end = np.where(first, np.nan, np.r_[np.nan, end[:-1]])
    h_ts = h["ts"].to_numpy()
    l_ts = np.where(launch >= 0, h_ts[np.maximum(launch, 0)] if len(h_ts) else np.nan, np.nan)
    lat_meas = ts - l_ts
    sgap_meas = ts - prev_end
    lat = np.zeros(n)
    sgap = np.zeros(n)
    # launch latency where the stream was idle at the launch (its predecessor known and done):
    # the rank's, else the job's (a host always far ahead never shows it), else 0 (a lower bound)
    idle_all = prev_end <= l_ts
    job_lat = _median_or(lat_meas[idle_all], 0.0)
    for r in np.unique(rank_i):  # typical weights per rank
        m = rank_i == r
        idle = m & idle_all
        lat_typ = _median_or(lat_meas[idle], job_lat)
        queued = m & (l_ts + lat_typ < prev_end)
        sgap_typ = _median_or(sgap_meas[queued], 0.0)
        lat[m] = lat_typ
        sgap[m] = sgap_typ
    lat = np.fmin(np.maximum(lat, 0.0), lat_meas)  # never more than measured
    sgap = np.fmin(np.maximum(sgap, 0.0), sgap_meas)
    bound = np.fmax(l_ts + lat, prev_end + sgap)  # NaN only with neither edge
    dep = np.full(n, -1, dtype=np.int64)
    depw = np.zeros(n)
    # Waited on another stream: the latest-ending activity of another stream of the rank before it.
    late = np.flatnonzero(np.isfinite(bound) & (ts > bound + 1.0) & (a["is_comm"].to_numpy() == False))  # noqa: E712
    for r, s in np.unique(np.c_[rank_i[late], stream[late]], axis=0):  # (rank, stream) pairs are few
        other = np.flatnonzero((rank_i == r) & (stream != s))
        if not len(other):
            continue
        other = other[np.argsort(end[other], kind="stable")]
        sel = late[(rank_i[late] == r) & (stream[late] == s)]
        k = np.searchsorted(end[other], ts[sel], side="right") - 1
        ok = (k >= 0) & (end[other[np.maximum(k, 0)]] > bound[sel])
        dep[sel[ok]] = other[k[ok]]
        depw[sel[ok]] = ts[sel[ok]] - end[other[k[ok]]]
    # The edge that held the activity up gets the measured weight, so the trace replays as recorded.
    held = (dep < 0) & np.isfinite(bound)
    via_launch = held & (np.nan_to_num(l_ts + lat, nan=-np.inf) >= np.nan_to_num(prev_end + sgap, nan=-np.inf))
    lat = np.where(via_launch, lat_meas, lat)
    sgap = np.where(held & ~via_launch, sgap_meas, sgap)
    return first, np.nan_to_num(lat), np.nan_to_num(sgap), dep, depw


def _steps(traces: Sequence[RankTrace], offset: np.ndarray, h: pd.DataFrame
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s_rank, s_cpu, s_anchor = [], [], []
    h_ts, h_rank = h["ts"].to_numpy(), h["rank_i"].to_numpy()
    for i, t in enumerate(traces):
        cpu = t.steps["cpu_start"].to_numpy(dtype=float) + float(offset[i])
        lo, hi = np.searchsorted(h_rank, i, "left"), np.searchsorted(h_rank, i, "right")
        k = np.searchsorted(h_ts[lo:hi], cpu, side="left")
        s_rank.append(np.full(len(cpu), i))
        s_cpu.append(cpu)
        s_anchor.append(np.where(k < hi - lo, k + lo, -1))
    return _cat(s_rank, np.int64), _cat(s_cpu, np.float64), _cat(s_anchor, np.int64)


def _cat(xs: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(xs).astype(dtype) if xs else np.zeros(0, dtype)
