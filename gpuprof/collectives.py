"""Each rank's collectives (one row per NCCL/RCCL kernel in its profiled steps) and the one way
collectives are matched across ranks (:func:`match_ids`), which the cross-rank findings
(``analyzers.distributed``, over the profiled steps: :func:`match`) and the job's replay
(:func:`gpuprof.replay.job.match`, over every kernel) both use.

**Keys.** Where a kernel carries the collective's ``Seq`` (Kineto since 2026; the ``coll_seq``
column), the key is (process group, collective or point-to-point, Seq): ProcessGroupNCCL numbers
the two kinds apart. Otherwise the n-th collective of a group on a rank is matched with the n-th
on the others, per group in the order they ran on their stream; the group is the ``Process Group
Name``/``ID`` and the ``Collective name`` where the kernel has them, else the kernel's name on the
rank's n-th communication stream (kernels launched before the profiler started carry no
metadata). Inside a profiled step the order counts within the step (every rank numbers its steps
alike: the step's n-th of a group on one rank is the step's n-th on the others). Outside the steps
a rank's recorded sequence may start a few collectives earlier or later than another's (its
window opened earlier): each rank's sequence is aligned to the longest one by the shift
(``MAX_SHIFT`` either way) whose collectives agree in kind and message size, the nearest in time
among equals (a rank running more than half a step behind makes the nearest the wrong one, which
is why the steps come first).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from gpuprof.rank import RankResult
from gpuprof.trace.names import text_values

#: How many collectives one rank's recorded sequence of a group may start before or after another's.
MAX_SHIFT = 8
#: ``Collective name`` values of point-to-point ops, which ProcessGroupNCCL numbers apart from collectives.
P2P_NAMES = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv", "sendrecv"})


def _covered(intervals: pd.DataFrame, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Length of [a, b) covered by the union of ``intervals`` (ts, end), vectorised."""
    if intervals.empty:
        return np.zeros(len(a))
    iv = intervals.sort_values("ts")
    s, e = iv["ts"].to_numpy(), np.maximum.accumulate(iv["end"].to_numpy())
    new = np.r_[True, s[1:] > e[:-1]]
    ms_, me = s[new], np.r_[e[np.flatnonzero(new)[1:] - 1], e[-1]]
    cum = np.r_[0.0, np.cumsum(me - ms_)]

    def upto(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(ms_, t, side="right") - 1
        ii = np.maximum(i, 0)
        inside = np.clip(t - ms_[ii], 0, me[ii] - ms_[ii])
        return np.where(i >= 0, cum[ii] + inside, 0.0)

    covered: np.ndarray = upto(b) - upto(a)
    return covered


COLLECTIVE_COLUMNS = ["rank", "row", "step", "i", "name", "ts", "dur", "exposed", "abs_ts", "nelems", "collective",
                      "queued_for", "stream", "pg", "seq"]


def collective_table(r: RankResult) -> pd.DataFrame:
    """One rank's collectives in its profiled steps: step, order within the step, duration, the
    part not overlapped by compute on its GPU (``exposed``), start on the common clock, and how
    long before it ended the next GPU work had been queued (``queued_for``)."""
    t = r.trace
    k = t.kernels
    is_comm = k["is_comm"].to_numpy(dtype=bool)
    step_of = k["step"].to_numpy()
    sel = np.flatnonzero(is_comm & (step_of >= 0))
    if not len(sel):
        return pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    # the columns read below, as arrays of the selected rows: a row filter of the whole frame would
    # copy every column
    ts_all, end_all = k["ts"].to_numpy(), k["end"].to_numpy()
    sel = sel[np.argsort(ts_all[sel], kind="quicksort")]  # as ``sort_values("ts")``
    ts, end, dur = ts_all[sel], end_all[sel], k["dur"].to_numpy()[sel]
    steps = step_of[sel]
    other = ~is_comm
    compute = pd.DataFrame({"ts": ts_all[other], "end": end_all[other]})
    exposed = dur - _covered(compute, ts, end)
    # How long before the collective ended was the next non-collective GPU work launched?
    work_ts = np.concatenate([ts_all[other], t.memcpys["ts"].to_numpy()])
    work_launch = np.concatenate([k["launch_ts"].to_numpy()[other], t.memcpys["launch_ts"].to_numpy()])
    o = np.argsort(work_ts, kind="quicksort")  # as ``sort_values("ts")``
    work_ts, work_launch = work_ts[o], work_launch[o]
    j = np.searchsorted(work_ts, end)
    nxt = np.where(j < len(work_ts), work_launch[np.minimum(j, len(work_ts) - 1)], np.nan)
    queued_for = np.nan_to_num(end - nxt, nan=np.inf)  # no launch record: queued earlier
    queued_for = np.clip(queued_for, 0.0, None)
    seq = k["coll_seq"].to_numpy(dtype=float)[sel] if "coll_seq" in k else np.full(len(sel), np.nan)
    step_no = t.steps["step"].to_numpy()[steps]
    # order within the step (``groupby("step").cumcount()``)
    by_step = np.argsort(steps, kind="stable")
    first = np.r_[True, steps[by_step][1:] != steps[by_step][:-1]]
    run_start = np.maximum.accumulate(np.where(first, np.arange(len(sel)), 0))
    i = np.empty(len(sel), dtype=np.int64)
    i[by_step] = np.arange(len(sel)) - run_start
    rows = k.index[sel]
    return pd.DataFrame({
        "rank": t.meta.rank, "row": rows, "step": step_no, "i": i,
        "name": text_values(k["name"])[sel], "ts": ts, "dur": dur,
        "exposed": np.maximum(exposed, 0.0), "abs_ts": ts + t.meta.t0_epoch_ns / 1000.0,
        "nelems": k["in_nelems"].to_numpy()[sel], "collective": k["collective"].astype(object).to_numpy()[sel],
        "queued_for": queued_for, "stream": k["stream"].to_numpy()[sel],
        "pg": labels(k["process_group"], sel) if "process_group" in k else "",
        "seq": np.where(seq >= 0, seq, np.nan),
    })


def labels(x: pd.Series, rows: np.ndarray | None = None) -> np.ndarray:
    """A column's values (at positions ``rows``, else all) as strings, "" where missing: how the
    matcher (:func:`match_ids`) reads process groups, collective and kernel names."""
    codes, uniq = pd.factorize(x, use_na_sentinel=True)
    text = np.array([str(u) for u in uniq] + [""], dtype=object)
    out: np.ndarray = text[codes if rows is None else codes[rows]]
    return out


def match(tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Collectives matched across ranks (:func:`match_ids`; ``key``), kept where every rank has
    it; the shortest duration is the transfer, the rest of each rank's is waiting."""
    tables = [t for t in tables if len(t)]
    if not tables:
        return pd.DataFrame()
    c = pd.concat(tables, ignore_index=True)
    ranks = c["rank"].nunique()
    nel = pd.to_numeric(c["nelems"], errors="coerce").to_numpy(dtype=float)
    c["key"] = match_ids(pd.DataFrame({"rank_i": c["rank"].to_numpy(), "stream": c["stream"].to_numpy(),
                                       "ts": c["abs_ts"].to_numpy(), "pg": c["pg"].to_numpy(),
                                       "coll": labels(c["collective"]),
                                       "name": c["name"].to_numpy(), "seq": c["seq"].to_numpy(dtype=float),
                                       "nelems": np.nan_to_num(nel, nan=-1.0),
                                       "step": c["step"].to_numpy()}))
    c["n"] = c.groupby("key")["rank"].transform("nunique")
    c = c[c["n"] == ranks].copy()  # matched on every rank
    c["transfer"] = c.groupby("key")["dur"].transform("min")
    c["wait"] = c["dur"] - c["transfer"]
    frac = np.where(c["dur"] > 0, c["transfer"] / c["dur"], 1.0)
    c["exposed_transfer"] = c["exposed"] * frac
    c["exposed_wait"] = c["exposed"] * (1 - frac)
    return c


def match_ids(c: pd.DataFrame) -> np.ndarray:
    """One id per row of ``c`` (the ranks' communication kernels: ``rank_i``, ``stream``, ``ts`` on
    a clock shared by the ranks, ``pg``, ``coll``, ``name`` as strings, "" where missing; ``seq``,
    NaN where none; ``nelems``; optionally ``step``, the profiled step or -1), equal on the rows
    that are one collective on several ranks (see the module docstring)."""
    order = np.lexsort((c["ts"].to_numpy(), c["stream"].to_numpy(), c["rank_i"].to_numpy()))
    c = c.iloc[order].reset_index(drop=True)
    meta = c["pg"] != ""
    # Without metadata: the rank's n-th communication stream (by first use) stands for the group.
    first_use = c.groupby(["rank_i", "stream"])["ts"].transform("min")
    nth = first_use.groupby(c["rank_i"]).rank(method="dense").astype(int).astype(str)
    has_seq = meta & np.isfinite(c["seq"].to_numpy())
    # ProcessGroupNCCL numbers collectives and point-to-point ops apart: one sequence each per group
    p2p = c["coll"].str.lower().isin(P2P_NAMES).map({True: "/p2p", False: "/coll"})
    c["group"] = np.where(has_seq, "pg:" + c["pg"] + p2p,
                          np.where(meta, "pg:" + c["pg"] + "/" + c["coll"], "stream:" + nth + "/" + c["name"]))
    # Without a sequence number, inside a profiled step: the n-th of its group in that step (every
    # rank numbers its steps alike); outside the steps: the n-th of the group, aligned by shifts.
    step = c["step"].to_numpy() if "step" in c else np.full(len(c), -1)
    in_step = ~has_seq.to_numpy() & (step >= 0)
    c["kstep"] = np.where(in_step, step, -1)
    c["ord"] = c.groupby(["rank_i", "group", "kstep"]).cumcount().to_numpy()
    loose = ~has_seq.to_numpy() & ~in_step
    c["ord"] = np.where(has_seq, c["seq"].to_numpy(), c["ord"] + _shifts(c[loose]).reindex(c.index).fillna(0))
    key = pd.MultiIndex.from_arrays([c["group"].to_numpy(), c["kstep"].to_numpy(), c["ord"].to_numpy()])
    ids, _ = pd.factorize(key)
    out = np.empty(len(ids), dtype=np.int64)
    out[order] = ids
    return out


def _shifts(c: pd.DataFrame) -> pd.Series:
    """Per row, the shift of its rank's sequence of its group onto the longest rank's: the one of
    ``-MAX_SHIFT..MAX_SHIFT`` under which most collectives agree in kind and size, the nearest in
    time among equals (the median start difference)."""
    out = pd.Series(0, index=c.index, dtype=np.int64)
    for _, grp in c.groupby("group", sort=False):  # groups are few
        by_rank = dict(list(grp.groupby("rank_i")))
        if len(by_rank) < 2:
            continue
        ref = max(by_rank.values(), key=len)
        sig_ref = (ref["coll"] + "|" + ref["name"] + "|" + ref["nelems"].astype(str)).to_numpy()
        ts_ref = ref["ts"].to_numpy()
        for x in by_rank.values():
            if x is ref:
                continue
            sig = (x["coll"] + "|" + x["name"] + "|" + x["nelems"].astype(str)).to_numpy()
            ts = x["ts"].to_numpy()
            best: tuple[float, float, int] = (-1.0, 0.0, 0)
            for d in range(-MAX_SHIFT, MAX_SHIFT + 1):
                lo, hi = max(0, -d), min(len(sig), len(sig_ref) - d)
                if hi <= lo:
                    continue
                agree = float(np.mean(sig[lo:hi] == sig_ref[lo + d:hi + d]))
                near = -float(np.median(np.abs(ts[lo:hi] - ts_ref[lo + d:hi + d])))
                if (agree, near) > best[:2]:
                    best = (agree, near, d)
            out.loc[x.index] = best[2]
    return out
