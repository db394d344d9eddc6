"""exposed_communication and rank_imbalance: collectives that stall the step.

Collectives are matched across ranks by step and order within the step (every rank issues the
same collectives in the same order). A collective ends on all ranks together, so the rank whose
kernel is shortest arrived last; on every other rank, the excess duration is *waiting* for it.
Each NCCL kernel's exposed time (not overlapped by compute on its GPU) is split in proportion:
the transfer part belongs to exposed_communication, the waiting part to rank_imbalance.

exposed_communication — Estimate, two or more ranks: the job's replay across ranks
(:mod:`gpuprof.replay.job`) with the collectives run behind compute, the largest of each step
kept (the last gradient bucket cannot overlap backward), and the host work of issuing them gone
(the slowest rank's step before − after). One rank (no collective can be matched, so transfer and
waiting cannot be told apart): the exposed transfer time while GPU work was queued behind it,
less the largest single collective per step, plus the host gaps around mostly-exposed collectives.
rank_imbalance — Every rank that waits little (within ``SLOW_SHARE`` of the way from the slowest
to the most-waiting rank) is slow: one slow node is several slow ranks, and all their idle time
inside the others' waits is the same lost time, claimed by this finding alone. Estimate: the
waiting time on each rank that held work up: only the part of a
wait after the GPU work following the collective had been launched (before that, the waiting
rank's own host was the limit and the wait cost nothing), and only on a waiting rank that is held
up: its runtime calls block (launch queue full) for at least ``HELD_FRACTION`` of its waits more
than the slow rank's do; less the profiler's cost of the slow rank's recorded host events
meanwhile: what the most-waiting rank still waits. That arithmetic is the estimate only where the
job is not replayed (too big for one process); otherwise it is the job's replay across ranks with
each slow rank's extra host stretches cut (:func:`gpuprof.replay.job.rebalance`): the slowest
rank's step before - after. Evidence names the slow rank and
what it did while the others waited (its CPU ops and GPU activity in those windows, on the common
clock).

Both work from small per-rank tables (:func:`gpuprof.collectives.collective_table`, one row per NCCL kernel in the
profiled steps) gathered into the driver; :func:`plan` decides each rank's share, and the slow
rank alone is asked for detail (:func:`slow_detail`). Each rank then claims its share among its
own findings (:class:`CrossCandidate` -> :func:`to_candidate`), so no rank's frames ever leave it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
from gpuprof.analyzers._base import HOST_NOTE, ms, top_names
from gpuprof.claims import Candidate, Contribution, Described, units_of
from gpuprof.collectives import _covered, match
from gpuprof.rank import RankView

if TYPE_CHECKING:
    from gpuprof.parts import RankPart
    from gpuprof.rank import RankResult


@dataclass(frozen=True)
class CrossCandidate(Described):
    """A cross-rank finding's share on one rank, decided from all ranks' collective tables."""

    priority_ms: float  # the finding's saving per step for the job: its claim order on every rank
    kernel_units: dict[int, float]  # kernel row -> µs saved on this rank
    gap_after_rows: tuple[int, ...] = ()  # kernels whose surrounding launch gaps go too
    zero_gap_windows: tuple[tuple[float, ...], tuple[float, ...]] | None = None  # (start, end) on this rank's clock


def to_candidate(cc: CrossCandidate, v: RankView) -> Candidate:
    """The rank's share as a Candidate with units, its gaps found in the rank's own view."""
    units: dict[tuple[Any, ...], float] = units_of("k", v.rank, np.fromiter(cc.kernel_units, np.int64,
                                                                            len(cc.kernel_units)),
                                                    np.fromiter(cc.kernel_units.values(), float, len(cc.kernel_units)))
    if cc.gap_after_rows:
        units.update(v.inner_gap_units(cc.gap_after_rows, after=True))
    g = v.gaps
    if cc.zero_gap_windows is not None and len(g):
        a, b = np.asarray(cc.zero_gap_windows[0]), np.asarray(cc.zero_gap_windows[1])
        i = np.searchsorted(a, g["end"].to_numpy(), side="left") - 1  # last window starting before the gap ends
        overlaps = (i >= 0) & (b[np.maximum(i, 0)] > g["start"].to_numpy())
        # the same lost time: taken from other findings, with no extra saving
        units.update(dict.fromkeys(zip(repeat("gap"), repeat(v.rank), g.index[overlaps].tolist()), 0.0))
    return Candidate(cc.id, cc.category, cc.title, cc.confidence, cc.recommendation, units, cc.evidence,
                     priority_ms=cc.priority_ms)


SlowDetail = Callable[[int, pd.DataFrame, int], dict[str, Any]]


def plan(parts: Sequence[RankPart], detail: SlowDetail, active: Sequence[str] = ("exposed_communication",
                                                                                    "rank_imbalance")
         ) -> dict[int, list[CrossCandidate]]:
    """Each rank's share of the cross-rank findings named in ``active``, by this module's own
    arithmetic (the job's replay then prices them: :func:`gpuprof.pricing.price_cross`).
    ``detail(slow, waits, waiting)`` runs :func:`slow_detail` on the slow rank, wherever that rank
    can be loaded."""
    return _plan(parts, detail, active)


def _plan(parts: Sequence[RankPart], detail: SlowDetail, active: Sequence[str]) -> dict[int, list[CrossCandidate]]:
    c = match([p.collectives for p in parts])
    out: dict[int, list[CrossCandidate]] = {}
    if c.empty:
        return out
    by_rank = {p.rank: p for p in parts}
    if "exposed_communication" in active:
        for rank, cc in _plan_comm(c, by_rank).items():
            out.setdefault(rank, []).append(cc)
    if "rank_imbalance" in active and len(parts) > 1:
        for rank, cc in _plan_imbalance(c, by_rank, detail).items():
            out.setdefault(rank, []).append(cc)
    return out


def _row_units(rows: pd.Series, saved: pd.Series) -> dict[int, float]:
    """``{kernel row: µs}`` where something is saved, from whole columns."""
    m = (saved > 0).to_numpy()
    return dict(zip(rows.to_numpy()[m].astype(np.int64).tolist(), saved.to_numpy()[m].astype(float).tolist()))


def _plan_comm(c: pd.DataFrame, parts: dict[int, RankPart]) -> dict[int, CrossCandidate]:
    steps = {r: p.n_steps for r, p in parts.items()}
    kernel_units: dict[int, dict[int, float]] = {}
    per_rank: dict[int, float] = {}
    for rank, g in c.groupby("rank"):
        r = int(cast(int, rank))
        # the largest collective of each step stays exposed even with perfect overlap
        last = g.loc[g.groupby("step")["exposed_transfer"].idxmax()]
        # exposed transfer costs only while GPU work was queued behind it (see rank_imbalance)
        keep = g["exposed_transfer"].clip(upper=g["queued_for"]).astype(float)
        keep.loc[last.index] = 0.0
        kernel_units[r] = _row_units(g["row"], keep)
        per_rank[r] = float(g["exposed_transfer"].sum()) / steps[r]
    # host gaps around mostly-exposed collectives go away with them (DDP launches few)
    exposed = c[c["exposed"] > 0.5 * c["dur"]]
    gap_rows = {int(cast(int, r)): tuple(g["row"].tolist()) for r, g in exposed.groupby("rank")}
    if not any(kernel_units.values()) and not gap_rows:
        return {}
    rank = max(per_rank, key=lambda r: per_rank[r])
    g = c[c["rank"] == rank]
    n_per_step = len(g) / steps[rank]
    small = g[g["nelems"] < 1 << 20]
    priority = max(sum(u.values()) / steps[r] for r, u in kernel_units.items()) / 1000.0
    common = dict(
        id="GP-COMM-001", category="exposed_communication",
        title=f"{n_per_step:.0f} collectives per step leave {ms(g['exposed_transfer'].sum()) / steps[rank]:.2f} ms of "
              "communication exposed (not overlapped with compute)",
        confidence="high" if len(parts) > 1 else "medium",
        recommendation="Overlap gradient communication with backward: wrap the model in "
                       "`DistributedDataParallel` (bucketed all-reduce during backward; tune `bucket_cap_mb`) "
                       "instead of all-reducing after `backward()`, or use FSDP with `backward_prefetch`; "
                       "fewer, larger collectives run nearer the link bandwidth.",
        evidence={"rank": rank, "collectives_per_step": round(n_per_step, 1),
                  "small_collectives_per_step": round(len(small) / steps[rank], 1),
                  "exposed_transfer_ms_per_step": round(ms(g["exposed_transfer"].sum()) / steps[rank], 3),
                  "communication_ms_per_step": round(ms(g["dur"].sum()) / steps[rank], 3),
                  "kernels": top_names(g),
                  "estimate": "exposed transfer time (waiting for other ranks excluded) less the largest "
                              "collective of each step, plus the host gaps around each collective"},
        priority_ms=priority)
    return {r: CrossCandidate(**common, kernel_units=kernel_units.get(r, {}),  # type: ignore[arg-type]
                              gap_after_rows=gap_rows.get(r, ()))
            for r in sorted(set(kernel_units) | set(gap_rows))}


def _plan_imbalance(c: pd.DataFrame, parts: dict[int, RankPart], detail: SlowDetail) -> dict[int, CrossCandidate]:
    if c["rank"].nunique() < 2:
        return {}
    steps = pd.Series({r: p.n_steps for r, p in parts.items()})
    wait = c.groupby("rank")["exposed_wait"].sum() / steps.reindex(c["rank"].unique())
    slow = int(cast(int, wait.idxmin()))
    waiting = int(cast(int, wait.idxmax()))
    if wait[waiting] <= 0:
        return {}
    sp = parts[slow]
    # Every rank that barely waits is as slow as the slowest (one slow node is several slow ranks):
    # their idle time inside the others' waits is the same lost time.
    slow_set = sorted(int(cast(int, r)) for r in wait.index
                      if wait[r] <= wait[slow] + SLOW_SHARE * (wait[waiting] - wait[slow]))
    c = c.assign(real_wait=c["exposed_wait"])
    waits = c[~c["rank"].isin(slow_set) & (c["exposed_wait"] > 0)]
    info = detail(slow, waits[["rank", "abs_ts", "wait"]], waiting) if len(waits) else {}
    # A wait spent while the slow rank ran recorded ops is partly the profiler's own host cost there:
    # deflate by that rank's cost per recorded event (known from --step-ms), as for idle gaps.
    if sp.event_cost_us > 0 and len(waits):
        n = np.asarray(info["events"])
        c.loc[waits.index, "real_wait"] = np.maximum(0.0, waits["exposed_wait"].to_numpy() - sp.event_cost_us * n)
    # A wait costs step time only when work was queued behind it: the GPU work that follows the
    # collective had been launched before the collective ended. If it was launched later, the host
    # was the bottleneck and the wait was hidden behind it (a rank that merely entered the window
    # late, say). Keep only the part of each wait after that next launch.
    c["real_wait"] = np.minimum(c["real_wait"], c["queued_for"])
    # And the waiting rank must be held up as a whole: its host blocks in launch calls (the queue
    # behind the waiting collective fills up), i.e. its runtime calls take noticeably longer per
    # step than the slow rank's, which runs the same program unhindered. A rank whose host is the
    # limit anyway (only out of phase with the others) loses nothing to the waits.
    blocked_us = parts[waiting].runtime_us_per_step - sp.runtime_us_per_step
    held = blocked_us >= HELD_FRACTION * float(c.loc[c["rank"] == waiting, "real_wait"].sum()) / steps[waiting]
    if not held:
        c["real_wait"] = 0.0
    real = c.groupby("rank")["real_wait"].sum() / steps.reindex(c["rank"].unique())
    kernel_units = {int(cast(int, r)): _row_units(g["row"], g["real_wait"]) for r, g in c.groupby("rank")}
    kernel_units = {r: u for r, u in kernel_units.items() if u}
    if not kernel_units:
        return {}
    skew = c.groupby("key")["wait"].max()  # per collective: how far apart the ranks arrived
    ev: dict[str, Any] = {"slow_rank": slow, "waiting_rank": waiting,
                          "collective_skew_ms": {"median": round(ms(float(skew.median())), 3),
                                                 "p95": round(ms(float(skew.quantile(0.95))), 3),
                                                 "max": round(ms(float(skew.max())), 3), "collectives": len(skew)},
                          "waiting_rank_host_blocked_ms_per_step": round(ms(blocked_us), 3),
                          "wait_ms_per_step_traced": {int(cast(int, r)): round(ms(v), 3) for r, v in wait.items()},
                          "wait_ms_per_step": {int(cast(int, r)): round(ms(v), 3) for r, v in real.items()},
                          "estimate": "time ranks spend in collectives waiting for the last rank while their next "
                                      "GPU work was already queued, less the profiler's cost of the slow rank's "
                                      "recorded host events meanwhile"}
    if not sp.unprofiled_step_ms:
        ev["note"] = HOST_NOTE
    ev.update(info.get("meanwhile", {}))
    if len(slow_set) > 1:
        ev["slow_ranks"] = slow_set
    # The slow ranks' own idle gaps inside the others' waits are the same lost time: they claim them.
    order = np.argsort(waits["abs_ts"].to_numpy())
    starts = waits["abs_ts"].to_numpy()[order]
    ends = np.maximum.accumulate(starts + waits["wait"].to_numpy()[order])
    priority = max(sum(u.values()) / parts[r].n_steps for r, u in kernel_units.items()) / 1000.0
    common = dict(
        id="GP-RANK-001", category="rank_imbalance",
        title=(f"Rank {slow} is slow" if len(slow_set) == 1 else f"{len(slow_set)} ranks are slow ({_ranks(slow_set)})")
              + f": rank {waiting} waits {ms(real[waiting]):.1f} ms per step for "
              + ("it" if len(slow_set) == 1 else "them") + " in collectives",
        confidence="high" if sp.unprofiled_step_ms else "low",
        recommendation=f"Find what rank {slow} does that the others do not ({ev.get('slow_rank_doing', 'see evidence')}): "
                       "balance data loading and preprocessing across ranks (DataLoader workers per rank, same "
                       "sequence lengths or length-bucketed batches), keep logging/checkpointing off the step on "
                       "one rank, and check that rank's GPU for throttling.",
        evidence=ev, priority_ms=priority)
    out = {r: CrossCandidate(**common, kernel_units=u) for r, u in kernel_units.items()}  # type: ignore[arg-type]
    for r in slow_set:  # windows on each slow rank's own clock
        t0 = parts[r].meta.t0_epoch_ns / 1000.0
        out[r] = CrossCandidate(**common, kernel_units=kernel_units.get(r, {}),  # type: ignore[arg-type]
                                zero_gap_windows=(tuple((starts - t0).tolist()), tuple((ends - t0).tolist())))
    return out


def _ranks(ranks: list[int], most: int = 6) -> str:
    shown = ", ".join(str(r) for r in ranks[:most])
    return shown + (f" and {len(ranks) - most} more" if len(ranks) > most else "")


HELD_FRACTION = 0.1  # blocked host time, as a share of the waits, that marks a rank as held up
SLOW_SHARE = 0.1  # a rank waiting less than this share of the way from the slowest to the most-waiting is slow too


def slow_detail(r: RankResult, waits: pd.DataFrame, waiting: int) -> dict[str, Any]:
    """On the slow rank: its recorded host events inside each wait window (rows of ``waits``:
    abs_ts, wait), and what it did while ``waiting`` waited."""
    from gpuprof.hostcost import event_cost_us

    t = r.trace
    out: dict[str, Any] = {}
    if event_cost_us(r)[0] > 0:
        host = np.sort(pd.concat([t.ops["ts"], t.runtime["ts"]]).to_numpy())
        a = waits["abs_ts"].to_numpy() - t.meta.t0_epoch_ns / 1000.0
        out["events"] = (np.searchsorted(host, a + waits["wait"].to_numpy()) - np.searchsorted(host, a)).tolist()
    out["meanwhile"] = _meanwhile(r, waits[waits["rank"] == waiting])
    return out


def _meanwhile(r: RankResult, w: pd.DataFrame) -> dict[str, Any]:
    """What the slow rank did during the windows ``w`` (abs_ts, wait): its CPU ops and GPU activity."""
    s = r.trace
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
             if cpu_busy < 0.5 * total or not per_op else f"CPU op {max(per_op, key=lambda n: per_op[n])}")
    return {"slow_rank_doing": doing,
            "slow_rank_during_waits": {
                "window_ms_per_step": round(ms(total) / max(len(s.steps), 1), 3),
                "gpu_busy_pct": round(100 * gpu_busy / total, 1) if total else None,
                "cpu_in_recorded_ops_pct": round(100 * cpu_busy / total, 1) if total else None,
                "top_cpu_ops_ms": {n: round(ms(v), 3) for n, v in sorted(per_op.items(), key=lambda x: -x[1])[:5]}}}
