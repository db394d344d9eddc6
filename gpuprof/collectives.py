"""Each rank's collectives (one row per NCCL/RCCL kernel in its profiled steps) and their match
across ranks by step and order within the step, as the cross-rank findings read them
(``analyzers.distributed``). The replay couples collectives by process group and sequence
instead (:func:`gpuprof.replay.job.match`): it needs every kernel of a job, not only the
profiled steps'.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from gpuprof.rank import RankResult


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
                      "queued_for"]


def collective_table(r: RankResult) -> pd.DataFrame:
    """One rank's collectives in its profiled steps: step, order within the step, duration, the
    part not overlapped by compute on its GPU (``exposed``), start on the common clock, and how
    long before it ended the next GPU work had been queued (``queued_for``)."""
    t = r.trace
    k = t.kernels
    comm = k[k["is_comm"] & (k["step"] >= 0)].sort_values("ts")
    if comm.empty:
        return pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    compute = k[~k["is_comm"]][["ts", "end"]]
    exposed = comm["dur"].to_numpy() - _covered(compute, comm["ts"].to_numpy(), comm["end"].to_numpy())
    # How long before the collective ended was the next non-collective GPU work launched?
    work = pd.concat([k.loc[~k["is_comm"], ["ts", "launch_ts"]], t.memcpys[["ts", "launch_ts"]]]).sort_values("ts")
    j = np.searchsorted(work["ts"].to_numpy(), comm["end"].to_numpy())
    nxt = np.where(j < len(work), work["launch_ts"].to_numpy()[np.minimum(j, len(work) - 1)], np.nan)
    queued_for = np.nan_to_num(comm["end"].to_numpy() - nxt, nan=np.inf)  # no launch record: queued earlier
    queued_for = np.clip(queued_for, 0.0, None)
    step_no = t.steps["step"].to_numpy()[comm["step"].to_numpy()]
    return pd.DataFrame({
        "rank": t.meta.rank, "row": comm.index, "step": step_no, "i": comm.groupby("step").cumcount().to_numpy(),
        "name": comm["name"].astype(str).to_numpy(), "ts": comm["ts"].to_numpy(), "dur": comm["dur"].to_numpy(),
        "exposed": np.maximum(exposed, 0.0), "abs_ts": comm["ts"].to_numpy() + t.meta.t0_epoch_ns / 1000.0,
        "nelems": comm["in_nelems"].to_numpy(), "collective": comm["collective"].astype(object).to_numpy(),
        "queued_for": queued_for,
    })


def match(tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Collectives matched across ranks by step and order within it, kept where every rank has
    it; the shortest duration is the transfer, the rest of each rank's is waiting."""
    tables = [t for t in tables if len(t)]
    if not tables:
        return pd.DataFrame()
    c = pd.concat(tables, ignore_index=True)
    ranks = c["rank"].nunique()
    c["n"] = c.groupby(["step", "i"])["rank"].transform("size")
    c = c[c["n"] == ranks].copy()  # matched on every rank
    c["transfer"] = c.groupby(["step", "i"])["dur"].transform("min")
    c["wait"] = c["dur"] - c["transfer"]
    frac = np.where(c["dur"] > 0, c["transfer"] / c["dur"], 1.0)
    c["exposed_transfer"] = c["exposed"] * frac
    c["exposed_wait"] = c["exposed"] * (1 - frac)
    return c
