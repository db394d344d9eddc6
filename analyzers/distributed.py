"""exposed_communication and rank_imbalance: collectives that stall the step.

Collectives are matched across ranks by step and order within the step (every rank issues the
same collectives in the same order). A collective ends on all ranks together, so the rank whose
kernel is shortest arrived last; on every other rank, the excess duration is *waiting* for it.
Each NCCL kernel's exposed time (not overlapped by compute on its GPU) is split in proportion:
the transfer part belongs to exposed_communication, the waiting part to rank_imbalance.

exposed_communication — Estimate: the exposed transfer time while GPU work was queued behind it,
less the largest single collective per step (the last gradient bucket cannot overlap backward),
plus the host gaps around mostly-exposed collectives.
rank_imbalance — Estimate: the waiting time on each rank that held work up: only the part of a
wait after the GPU work following the collective had been launched (before that, the waiting
rank's own host was the limit and the wait cost nothing), and only on a waiting rank that is held
up: its runtime calls block (launch queue full) for at least ``HELD_FRACTION`` of its waits more
than the slow rank's do; less the profiler's cost of the slow rank's recorded host events
meanwhile. The job saves what the most-waiting rank still waits. Evidence names the slow rank and what it did while the others waited (its CPU ops and GPU
activity in those windows, on the common clock).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
from gpuprof.analyzers._base import HOST_NOTE, Candidate, RankView, ms, top_names, views

if TYPE_CHECKING:
    from gpuprof.api import Analysis, RankResult


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


def _collectives(analysis: Analysis) -> pd.DataFrame:
    rows = []
    for r in analysis.ranks:
        t = r.trace
        k = t.kernels
        comm = k[k["is_comm"] & (k["step"] >= 0)].sort_values("ts")
        if comm.empty:
            continue
        compute = k[~k["is_comm"]][["ts", "end"]]
        exposed = comm["dur"].to_numpy() - _covered(compute, comm["ts"].to_numpy(), comm["end"].to_numpy())
        # How long before the collective ended was the next non-collective GPU work launched?
        work = pd.concat([k.loc[~k["is_comm"], ["ts", "launch_ts"]], t.memcpys[["ts", "launch_ts"]]]).sort_values("ts")
        j = np.searchsorted(work["ts"].to_numpy(), comm["end"].to_numpy())
        nxt = np.where(j < len(work), work["launch_ts"].to_numpy()[np.minimum(j, len(work) - 1)], np.nan)
        queued_for = np.nan_to_num(comm["end"].to_numpy() - nxt, nan=np.inf)  # no launch record: queued earlier
        queued_for = np.clip(queued_for, 0.0, None)
        step_no = t.steps["step"].to_numpy()[comm["step"].to_numpy()]
        rows.append(pd.DataFrame({
            "rank": t.meta.rank, "row": comm.index, "step": step_no, "i": comm.groupby("step").cumcount().to_numpy(),
            "name": comm["name"].astype(str).to_numpy(), "ts": comm["ts"].to_numpy(), "dur": comm["dur"].to_numpy(),
            "exposed": np.maximum(exposed, 0.0), "abs_ts": comm["ts"].to_numpy() + t.meta.t0_epoch_ns / 1000.0,
            "nelems": comm["in_nelems"].to_numpy(), "collective": comm["collective"].astype(object).to_numpy(),
            "queued_for": queued_for,
        }))
    if not rows:
        return pd.DataFrame()
    c = pd.concat(rows, ignore_index=True)
    ranks = c["rank"].nunique()
    c["n"] = c.groupby(["step", "i"])["rank"].transform("size")
    c = c[c["n"] == ranks].copy()  # matched on every rank
    c["transfer"] = c.groupby(["step", "i"])["dur"].transform("min")
    c["wait"] = c["dur"] - c["transfer"]
    frac = np.where(c["dur"] > 0, c["transfer"] / c["dur"], 1.0)
    c["exposed_transfer"] = c["exposed"] * frac
    c["exposed_wait"] = c["exposed"] * (1 - frac)
    return c


def _steps(analysis: Analysis) -> dict[int, int]:
    return {r.trace.meta.rank: max(len(r.trace.steps), 1) for r in analysis.ranks}


def exposed_communication(analysis: Analysis) -> list[Candidate]:
    c = _collectives(analysis)
    if c.empty:
        return []
    steps = _steps(analysis)
    units: dict[tuple[Any, ...], float] = {}
    per_rank: dict[int, float] = {}
    for rank, g in c.groupby("rank"):
        # the largest collective of each step stays exposed even with perfect overlap
        last = g.loc[g.groupby("step")["exposed_transfer"].idxmax()]
        # exposed transfer costs only while GPU work was queued behind it (see rank_imbalance)
        keep = g["exposed_transfer"].clip(upper=g["queued_for"]).astype(float)
        keep.loc[last.index] = 0.0
        for row, v in zip(g["row"], keep):
            if v > 0:
                units[("k", int(cast(int, rank)), int(row))] = float(v)
        per_rank[int(cast(int, rank))] = float(g["exposed_transfer"].sum()) / steps[int(cast(int, rank))]
    exposed_rows = c.loc[c["exposed"] > 0.5 * c["dur"], ["rank", "row"]]
    for v in views(analysis):  # host gaps around exposed collectives go away with them (DDP launches few)
        rows = exposed_rows.loc[exposed_rows["rank"] == v.rank, "row"]
        units.update(v.inner_gap_units(rows, after=True))
    if not units:
        return []
    rank = max(per_rank, key=lambda r: per_rank[r])
    g = c[c["rank"] == rank]
    n_per_step = len(g) / steps[rank]
    small = g[g["nelems"] < 1 << 20]
    return [Candidate(
        id="GP-COMM-001", category="exposed_communication",
        title=f"{n_per_step:.0f} collectives per step leave {ms(g['exposed_transfer'].sum()) / steps[rank]:.2f} ms of "
              "communication exposed (not overlapped with compute)",
        confidence="high" if len(analysis.ranks) > 1 else "medium",
        recommendation="Overlap gradient communication with backward: wrap the model in "
                       "`DistributedDataParallel` (bucketed all-reduce during backward; tune `bucket_cap_mb`) "
                       "instead of all-reducing after `backward()`, or use FSDP with `backward_prefetch`; "
                       "fewer, larger collectives run nearer the link bandwidth.",
        units=units,
        evidence={"rank": rank, "collectives_per_step": round(n_per_step, 1),
                  "small_collectives_per_step": round(len(small) / steps[rank], 1),
                  "exposed_transfer_ms_per_step": round(ms(g["exposed_transfer"].sum()) / steps[rank], 3),
                  "communication_ms_per_step": round(ms(g["dur"].sum()) / steps[rank], 3),
                  "kernels": top_names(g),
                  "estimate": "exposed transfer time (waiting for other ranks excluded) less the largest "
                              "collective of each step, plus the host gaps around each collective"},
    )]


def rank_imbalance(analysis: Analysis) -> list[Candidate]:
    c = _collectives(analysis)
    if c.empty or c["rank"].nunique() < 2:
        return []
    steps = _steps(analysis)
    vs = {v.rank: v for v in views(analysis)}
    wait = c.groupby("rank")["exposed_wait"].sum() / pd.Series(steps)
    slow = int(cast(int, wait.idxmin()))
    waiting = int(cast(int, wait.idxmax()))
    if wait[waiting] <= 0:
        return []
    # A wait spent while the slow rank ran recorded ops is partly the profiler's own host cost there:
    # deflate by that rank's cost per recorded event (known from --step-ms), as for idle gaps.
    s_view = vs[slow]
    c = c.assign(real_wait=c["exposed_wait"])
    waits = c[(c["rank"] != slow) & (c["exposed_wait"] > 0)]
    if s_view.event_cost_us > 0 and len(waits):
        host = np.sort(pd.concat([s_view.trace.ops["ts"], s_view.trace.runtime["ts"]]).to_numpy())
        a = waits["abs_ts"].to_numpy() - s_view.trace.meta.t0_epoch_ns / 1000.0
        n = np.searchsorted(host, a + waits["wait"].to_numpy()) - np.searchsorted(host, a)
        c.loc[waits.index, "real_wait"] = np.maximum(0.0, waits["exposed_wait"].to_numpy() - s_view.event_cost_us * n)
    # A wait costs step time only when work was queued behind it: the GPU work that follows the
    # collective had been launched before the collective ended. If it was launched later, the host
    # was the bottleneck and the wait was hidden behind it (a rank that merely entered the window
    # late, say). Keep only the part of each wait after that next launch.
    c["real_wait"] = np.minimum(c["real_wait"], c["queued_for"])
    # And the waiting rank must be held up as a whole: its host blocks in launch calls (the queue
    # behind the waiting collective fills up), i.e. its runtime calls take noticeably longer per
    # step than the slow rank's, which runs the same program unhindered. A rank whose host is the
    # limit anyway (only out of phase with the others) loses nothing to the waits.
    blocked_us = _runtime_us_per_step(vs[waiting]) - _runtime_us_per_step(vs[slow])
    held = blocked_us >= HELD_FRACTION * float(c.loc[c["rank"] == waiting, "real_wait"].sum()) / steps[waiting]
    if not held:
        c["real_wait"] = 0.0
    real = c.groupby("rank")["real_wait"].sum() / pd.Series(steps)
    units = {("k", int(r), int(row)): float(v) for r, row, v in zip(c["rank"], c["row"], c["real_wait"]) if v > 0}
    if not units:
        return []
    # The slow rank's own idle gaps inside the others' waits are the same lost time: claim them too.
    g = s_view.gaps
    if len(g) and len(waits):
        a = np.sort(waits["abs_ts"].to_numpy() - s_view.trace.meta.t0_epoch_ns / 1000.0)
        b = np.maximum.accumulate(a + waits["wait"].to_numpy()[np.argsort(waits["abs_ts"].to_numpy())])
        i = np.searchsorted(a, g["end"].to_numpy(), side="left") - 1  # last window starting before the gap ends
        overlaps = (i >= 0) & (b[np.maximum(i, 0)] > g["start"].to_numpy())
        units.update({("gap", slow, int(j)): 0.0 for j in g.index[overlaps]})  # same lost time: claimed, no extra saving
    ev: dict[str, Any] = {"slow_rank": slow, "waiting_rank": waiting,
                          "waiting_rank_host_blocked_ms_per_step": round(ms(blocked_us), 3),
                          "wait_ms_per_step_traced": {int(cast(int, r)): round(ms(v), 3) for r, v in wait.items()},
                          "wait_ms_per_step": {int(cast(int, r)): round(ms(v), 3) for r, v in real.items()},
                          "estimate": "time ranks spend in collectives waiting for the last rank while their next "
                                      "GPU work was already queued, less the profiler's cost of the slow rank's "
                                      "recorded host events meanwhile"}
    if not s_view.host_scale_known:
        ev["note"] = HOST_NOTE
    ev.update(_meanwhile(analysis, c, slow, waiting))
    return [Candidate(
        id="GP-RANK-001", category="rank_imbalance",
        title=f"Rank {slow} is slow: rank {waiting} waits {ms(real[waiting]):.1f} ms per step for it in collectives",
        confidence=s_view.host_confidence("high"),
        recommendation=f"Find what rank {slow} does that the others do not ({ev.get('slow_rank_doing', 'see evidence')}): "
                       "balance data loading and preprocessing across ranks (DataLoader workers per rank, same "
                       "sequence lengths or length-bucketed batches), keep logging/checkpointing off the step on "
                       "one rank, and check that rank's GPU for throttling.",
        units=units, evidence=ev)]


HELD_FRACTION = 0.1  # blocked host time, as a share of the waits, that marks a rank as held up


def _runtime_us_per_step(v: RankView) -> float:
    rt = v.trace.runtime
    total = float(rt.loc[rt["step"] >= 0, "dur"].sum())
    return float(total / v.n_steps)


def _meanwhile(analysis: Analysis, c: pd.DataFrame, slow: int, waiting: int) -> dict[str, Any]:
    """What the slow rank did while ``waiting`` waited: its CPU ops and GPU activity, same clock."""
    res: dict[str, RankResult] = {str(r.trace.meta.rank): r for r in analysis.ranks}
    s = res[str(slow)].trace
    w = c[(c["rank"] == waiting) & (c["exposed_wait"] > 0)]
    if w.empty:
        return {}
    a = w["abs_ts"].to_numpy() - s.meta.t0_epoch_ns / 1000.0  # window starts on the slow rank's clock
    b = a + w["wait"].to_numpy()
    total = float((b - a).sum())
    top = s.ops[(s.ops["depth"] == 0)][["name", "ts", "end"]]
    gpu = pd.concat([s.kernels[["ts", "end"]], s.memcpys[["ts", "end"]]])
    gpu_busy = float(_covered(gpu, a, b).sum())
    per_op: dict[str, float] = {}
    for name, grp in top.groupby(top["name"].astype(str)):
        cov = float(_covered(grp[["ts", "end"]], a, b).sum())
        if cov > 0:
            per_op[name] = cov
    cpu_busy = float(_covered(top[["ts", "end"]], a, b).sum())
    doing = ("host work outside any recorded op (Python code such as data loading, logging or a busy loop)"
             if cpu_busy < 0.5 * total else f"CPU op {max(per_op, key=lambda n: per_op[n])}")
    return {"slow_rank_doing": doing,
            "slow_rank_during_waits": {
                "window_ms_per_step": round(ms(total) / max(len(s.steps), 1), 3),
                "gpu_busy_pct": round(100 * gpu_busy / total, 1) if total else None,
                "cpu_in_recorded_ops_pct": round(100 * cpu_busy / total, 1) if total else None,
                "top_cpu_ops_ms": {n: round(ms(v), 3) for n, v in sorted(per_op.items(), key=lambda x: -x[1])[:5]}}}
