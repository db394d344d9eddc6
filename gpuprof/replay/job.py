"""Cross-rank replay: every rank's graph in one job, collectives matched across ranks (issue #13).

Each rank's graph is built on its own, as for one rank (:func:`gpuprof.replay.graph.build`), and
:func:`join` puts them on one clock (each trace's ``t0_epoch_ns``) and couples their collectives:
a matched collective's transfer starts when the last rank's kernel starts and lasts its measured
transfer time, so a slow rank's extra host time shows up as wait in the other ranks' kernels and
as back-pressure on their hosts, and a transformation on one rank moves the others.

**Matching** (:func:`match`): NCCL/RCCL kernels (``kernels.is_comm``) are keyed as the
cross-rank findings key them (:func:`gpuprof.collectives.match_ids`: process group and sequence
number where the kernel has them, else order within the group, aligned across ranks).
A key is coupled only where every rank
that has it ended after the last one arrived (what a synchronising collective does; a small
broadcast's root may finish alone, NCCL's LL protocol buffers its send): a wrong match or a rank
missing from the trace cannot make a collective end before the trace says it did.

**Transfer time.** A coupled collective ends ``transfer`` after its last rank's kernel starts,
``transfer`` being each rank's own end less that last arrival on the shared clock. On the last
rank to arrive this is the shortest instance, the kernel's own duration: the time the collective
took once everyone was there. On the others it differs from the shortest by how far apart the
ranks ended (a few µs: ring protocols finish together) and by the clocks' offset; taking each
rank's own end keeps the unchanged replay exact whatever that offset, while the shortest
instance on every rank would move each trace's ends by the clocks' error. Ranks absent from the
trace (2 of a job's 8 files, say) are not seen: their wait stays inside the transfer time.

**Cross-rank transformations**: :func:`rebalance` (rank_imbalance: a slow rank's stretches of host
work longer than any of the median rank's become a typical gap of it) and :func:`overlap`
(exposed_communication: collectives run behind compute, issued from C++, as DDP's bucketed
all-reduce is), applied by :func:`cross_fix`; :func:`fix_steps` prices them on the job, the
slowest rank's replayed step before and after (docs/replay.md, "Cross-rank replay").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from gpuprof.collectives import MAX_SHIFT, labels, match_ids
from gpuprof.replay.graph import Graph, build
from gpuprof.replay.transforms import shrink_host, trim_host
from gpuprof.trace.model import RankTrace

#: Clock slack (µs) allowed between ranks' traces when deciding that a collective synchronised.
SYNC_SLACK_US = 1.0


def build_job(traces: Sequence[RankTrace]) -> Graph:
    """The job's graph: each rank's graph built alone (:func:`rank_graph`), then joined."""
    return join([rank_graph(t) for t in traces])


@dataclass(frozen=True)
class RankGraph:
    """One rank's graph as built alone, with what joining it to the others needs: its clock's
    origin, its communication kernels (:func:`comm_rows`) and the host calls that issued them
    (:func:`issuing_calls`). Plain arrays and one small frame: what a worker sends back."""

    graph: Graph
    t0_epoch_ns: int
    comm: pd.DataFrame
    issue_calls: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # see issuing_calls


def rank_graph(t: RankTrace, g: Graph | None = None) -> RankGraph:
    """Rank ``t``'s graph (``g`` if already built from ``t`` alone) ready to be joined."""
    g = build([t]) if g is None else g
    comm = comm_rows(g, t)
    return RankGraph(g, int(t.meta.t0_epoch_ns), comm, issuing_calls(g, t, comm))


#: Op names of the communication layer (a collective's own op and those it calls): how far up
#: from a collective's launch the op that issued it reaches.
COMM_OPS = ("c10d::", "record_param_comms", "nccl:", "gloo:", "ProcessGroup")


def issuing_calls(g: Graph, t: RankTrace, comm: pd.DataFrame) -> np.ndarray:
    """Host calls (indices into a one-rank graph) made inside the ops that issued the rank's
    collectives: the op of each collective's launch call, walked up through its parents while
    they are communication ops (``COMM_OPS``: ``c10d::allreduce_`` around ``record_param_comms``),
    not into what called them (a DDP hook's autograd node, a Python loop), i.e. the host cost of
    issuing each collective."""
    from gpuprof.replay.transforms import calls_within

    launch = g.a_launch[comm["a"].to_numpy(dtype=np.int64)]
    launch = launch[launch >= 0]
    ops = t.ops
    if not len(launch) or not len(ops) or "op" not in t.runtime:
        return np.zeros(0, dtype=np.int64)
    rows = t.runtime["op"].to_numpy()[g.h_row[launch]]
    rows = np.unique(rows[rows >= 0])
    parent = ops["parent"].to_numpy()
    names = ops["name"]
    codes, uniq = pd.factorize(names)
    is_comm = np.array([str(u).startswith(COMM_OPS) for u in uniq], dtype=bool)[codes] if len(ops) else np.zeros(0, bool)
    for _ in range(int(ops["depth"].max()) + 1 if len(ops) else 0):  # one step up per nesting level
        up = parent[rows]
        rows = np.unique(np.where((up >= 0) & is_comm[np.maximum(up, 0)], up, rows))
    spans = list(zip(ops["ts"].to_numpy(dtype=float)[rows], ops["end"].to_numpy(dtype=float)[rows],
                     ops["tid"].to_numpy()[rows].astype(int)))
    out: np.ndarray = np.flatnonzero(calls_within(g, g.ranks[0], t.runtime["tid"].to_numpy(), spans))
    return out


def join(parts: Sequence[RankGraph]) -> Graph:
    """One job's graph from its ranks' one-rank graphs: node indices shifted, times put on the
    clock shared by the ranks (aligned by ``t0_epoch_ns``), collectives matched and coupled
    (:func:`match`)."""
    graphs = [p.graph for p in parts]
    if len(graphs) == 1:
        return graphs[0]
    t0 = np.array([p.t0_epoch_ns for p in parts], dtype=np.int64)
    offset = ((t0 - t0.min()) / 1000.0).astype(float)
    nh = np.cumsum([0] + [g.n_host for g in graphs])
    na = np.cumsum([0] + [g.n_acts for g in graphs])

    def cat(name: str, shift: np.ndarray | None = None) -> np.ndarray:
        xs = [getattr(g, name) for g in graphs]
        if shift is not None:
            xs = [np.where(x >= 0, x + shift[i], x) for i, x in enumerate(xs)]
        return np.concatenate(xs)

    def timed(name: str) -> np.ndarray:
        return np.concatenate([getattr(g, name) + offset[i] for i, g in enumerate(graphs)])

    def index(n: Callable[[Graph], int]) -> np.ndarray:
        return np.concatenate([np.full(n(g), i, dtype=np.int64) for i, g in enumerate(graphs)])

    g = Graph(
        ranks=tuple(r for g in graphs for r in g.ranks), rank_offset_us=offset,
        h_rank=index(lambda x: x.n_host), h_row=cat("h_row"), h_name=cat("h_name"), h_ts=timed("h_ts"),
        h_end=timed("h_end"), h_first=cat("h_first"), h_gap=cat("h_gap"), h_dur=cat("h_dur"),
        h_wait=cat("h_wait", na), h_tail=cat("h_tail"), h_events=cat("h_events"), h_step=cat("h_step"),
        h_bp=cat("h_bp", na), h_bpw=cat("h_bpw"), h_driver=cat("h_driver"),
        a_rank=index(lambda x: x.n_acts), a_kind=cat("a_kind"), a_row=cat("a_row"), a_stream=cat("a_stream"),
        a_ts=timed("a_ts"), a_end=timed("a_end"), a_first=cat("a_first"), a_launch=cat("a_launch", nh),
        a_lat=cat("a_lat"), a_sgap=cat("a_sgap"), a_dep=cat("a_dep", na), a_depw=cat("a_depw"),
        a_dur=cat("a_dur"), a_coll=np.full(int(na[-1]), -1, dtype=np.int64), a_step=cat("a_step"),
        s_rank=index(lambda x: len(x.s_rank)), s_cpu_start=timed("s_cpu_start"), s_anchor=cat("s_anchor", nh))
    comm = pd.concat([p.comm.assign(a=p.comm["a"] + na[i], rank_i=i, ts=p.comm["ts"] + offset[i],
                                    end=p.comm["end"] + offset[i]) for i, p in enumerate(parts)], ignore_index=True)
    coll, dur = match(g, comm)
    return replace(g, a_coll=coll, a_dur=dur)


def comm_rows(g: Graph, t: RankTrace) -> pd.DataFrame:
    """One row per communication kernel of a one-rank graph: its activity index, stream, times
    and the group, kind, size, sequence number and profiled step (-1 outside them) it is matched by."""
    kernel = np.flatnonzero(g.a_kind == 0)
    k = t.kernels
    idx = kernel[k["is_comm"].to_numpy(dtype=bool)[g.a_row[kernel]]] if len(k) else kernel
    r = g.a_row[idx]

    def col(name: str) -> np.ndarray:
        if name not in k:
            return np.full(len(r), "", dtype=object)
        return labels(k[name], r)

    seq = k["coll_seq"].to_numpy(dtype=float)[r] if "coll_seq" in k else np.full(len(r), np.nan)
    seq = np.where(seq >= 0, seq, np.nan)  # -1: none recorded
    nel = k["in_nelems"].to_numpy(dtype=float)[r] if "in_nelems" in k else np.full(len(r), np.nan)
    srow = g.a_step[idx]
    numbers = t.steps["step"].to_numpy() if len(t.steps) else np.zeros(0, dtype=np.int64)
    step = np.where(srow >= 0, numbers[np.clip(srow, 0, max(len(numbers) - 1, 0))] if len(numbers) else -1, -1)
    return pd.DataFrame({"a": idx, "stream": g.a_stream[idx], "ts": g.a_ts[idx], "end": g.a_end[idx], "step": step,
                         "pg": col("process_group"), "coll": col("collective"), "name": col("name"),
                         "seq": seq, "nelems": np.nan_to_num(nel, nan=-1.0)})


def match(g: Graph, c: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each activity's matched collective id across ranks (-1) and its duration for the replay
    (a coupled collective: its transfer time after the last arrival; see the module docstring),
    from the job's communication kernels ``c`` (:func:`comm_rows` of every rank, on the shared
    clock, with ``rank_i``), keyed as the cross-rank findings key them
    (:func:`gpuprof.collectives.match_ids`)."""
    dur = g.a_dur.copy()
    coll = np.full(g.n_acts, -1, dtype=np.int64)
    if c.empty or c["rank_i"].nunique() < 2:
        return coll, dur
    c = c.sort_values(["rank_i", "stream", "ts"], kind="stable").reset_index(drop=True)
    ids = match_ids(c)
    nranks = pd.Series(c["rank_i"].to_numpy()).groupby(ids).transform("nunique").to_numpy()
    last = pd.Series(c["ts"].to_numpy()).groupby(ids).transform("max").to_numpy()
    first_end = pd.Series(c["end"].to_numpy()).groupby(ids).transform("min").to_numpy()
    ok = (nranks > 1) & (first_end >= last - SYNC_SLACK_US)
    a = c["a"].to_numpy()
    _, dense = np.unique(ids[ok], return_inverse=True)
    coll[a[ok]] = dense
    dur[a[ok]] = np.maximum(c["end"].to_numpy()[ok] - last[ok], 0.0)
    return coll, dur


# --- cross-rank transformations ------------------------------------------------------------------
def host_per_step(g: Graph) -> np.ndarray:
    """Each rank's host time between calls (positive gaps) per profiled step, µs."""
    inside = (g.h_step >= 0) & (g.h_gap > 0)
    total = np.bincount(g.h_rank[inside], weights=g.h_gap[inside], minlength=len(g.ranks))
    steps = np.bincount(g.s_rank, minlength=len(g.ranks))
    out: np.ndarray = total / np.maximum(steps, 1)
    return out


def rebalance(g: Graph, ranks: Sequence[int] | None = None) -> Graph:
    """rank_imbalance's fix: each slow rank's extra host time is cut to the median rank's (the
    lower median, so with two ranks the faster one's). The ranks of one data-parallel job run the
    same program, so a stretch of host work longer than any the median rank has in its profiled
    steps (a busy loop, a straggler's data loading, logging, a checkpoint) is extra: each such gap
    between the slow rank's calls becomes the median rank's typical (median) gap, the time between
    two calls where no extra work runs. Not its longest: that is the largest legitimate host
    stretch of the step, and a stretch split by another thread's call (the NCCL watchdog's
    ``cudaEventQuery`` in the middle of a busy loop) would keep it once per piece. If the slow
    rank's host time per step (its gaps) still exceeds the median rank's, the rest is cut from
    its longest gaps, all to one level (:func:`~gpuprof.replay.transforms.trim_host`: a uniformly
    slower host). The per-step totals alone are not the measure: a rank held up by the slow one
    spends part of its own gaps blocked behind it (launch back-pressure the trace does not mark),
    which inflates the median. ``ranks``: only these (by rank number) are cut; by default every
    rank above the median."""
    per = host_per_step(g)
    if len(per) < 2:
        return g
    level = float(np.percentile(per, 50, method="lower"))
    ref = int(np.flatnonzero(per == level)[0])
    inside = (g.h_step >= 0) & (g.h_gap > 0)
    ref_gaps = g.h_gap[inside & (g.h_rank == ref)]
    longest = float(ref_gaps.max(initial=0.0))
    typical = float(np.median(ref_gaps)) if len(ref_gaps) else 0.0
    steps = np.bincount(g.s_rank, minlength=len(g.ranks))
    gap = g.h_gap.copy()
    for i, r in enumerate(g.ranks):
        if (ranks is not None and r not in ranks) or per[i] <= level:
            continue
        extra = inside & (g.h_rank == i) & (gap > longest)
        gap[extra] = typical
    g = replace(g, h_gap=gap)
    rest = host_per_step(g)
    for i, r in enumerate(g.ranks):
        if (ranks is not None and r not in ranks) or per[i] <= level or rest[i] <= level:
            continue
        g = trim_host(g, np.flatnonzero(inside & (g.h_rank == i)), (rest[i] - level) * max(int(steps[i]), 1))
    return g


def overlap(g: Graph, sel: np.ndarray, keep_last: bool = True, issue: np.ndarray | None = None) -> Graph:
    """exposed_communication's fix: the selected collectives (a mask over activities) run behind
    compute, as DDP's bucketed all-reduce runs during backward on its own stream: they no longer
    hold their stream up (no duration, no gap before them), and the host calls that launched them
    cost nothing, as do the calls of ``issue`` (a mask over host calls: the ops that issued them,
    :func:`issuing_calls`; DDP's reducer issues its buckets from C++ autograd hooks, not a Python
    loop). With ``keep_last``, the largest selected collective of each step stays as it is, on
    every rank: the last bucket has no backward left to hide behind."""
    sel = sel.copy()
    if keep_last and sel.any():
        # The largest by transfer time (not the kernel's duration, which includes waiting for the
        # others), the same collective on every rank: a matched one's ranks keep it together.
        idx = np.flatnonzero(sel & (g.a_step >= 0))
        ident = np.where(g.a_coll[idx] >= 0, g.a_coll[idx], -1 - idx)
        d = pd.DataFrame({"i": idx, "id": ident, "rank": g.a_rank[idx], "step": g.a_step[idx], "dur": g.a_dur[idx]})
        per = d.groupby("id").agg(step=("step", "first"), rank=("rank", "min"), dur=("dur", "min"))
        per = per.assign(key=np.where(per.index >= 0, -1, per["rank"]))  # unmatched: per rank
        keep_ids = per.groupby(["key", "step"])["dur"].idxmax().to_numpy()
        sel[d.loc[d["id"].isin(keep_ids), "i"].to_numpy()] = False
    g = replace(g, a_dur=np.where(sel, 0.0, g.a_dur), a_sgap=np.where(sel, 0.0, g.a_sgap),
                a_coll=np.where(sel, -1, g.a_coll))
    calls = np.zeros(g.n_host, dtype=bool) if issue is None else issue.copy()
    calls[g.a_launch[sel & (g.a_launch >= 0)]] = True
    kept = np.zeros(g.n_host, dtype=bool)
    # launches of work that stays (the kept collective, copies or kernels inside the issuing ops)
    # cost what they did
    kept[g.a_launch[~sel & (g.a_launch >= 0)]] = True
    return shrink_host(g, calls & ~kept, 0.0)


# --- the job's replay, as the analysis uses it -------------------------------------------------
def comm_in_steps(g: Graph, parts: Sequence[RankGraph]) -> np.ndarray:
    """Mask of the job graph's communication kernels inside profiled steps."""
    na = np.cumsum([0] + [p.graph.n_acts for p in parts])
    out = np.zeros(g.n_acts, dtype=bool)
    for i, p in enumerate(parts):
        out[p.comm["a"].to_numpy(dtype=np.int64) + na[i]] = True
    out &= g.a_step >= 0
    return out


def slowest_ms(g: Graph) -> float:
    """The job's replayed step: the slowest rank's steady-state step time (ms)."""
    from gpuprof.replay.run import run

    p = [x for x in run(g).rank_period_ms if np.isfinite(x)]
    return float(max(p)) if p else float("nan")


def host_free_ms(parts: Sequence[RankGraph]) -> float | None:
    """The job's least step: its joined graph replayed with every rank's host time taken out, the
    slowest rank's step (ms); None where it does not replay. A rank's own graph cannot give it:
    its collectives last as long as it waited for the other ranks (a rank waiting 50 ms a step for
    a host-bound peer replays 63 ms without any host of its own; joined, the job's GPU work takes
    11 ms)."""
    from gpuprof.replay.fixes import host_free

    ms = slowest_ms(host_free(join(parts)))
    return ms if np.isfinite(ms) else None


def cross_fix(category: str, g: Graph, parts: Sequence[RankGraph]) -> Graph:
    """The job graph with a cross-rank finding's fix applied: ``rank_imbalance`` →
    :func:`rebalance`, ``exposed_communication`` → :func:`overlap` of the collectives in the
    profiled steps (the last of each step kept)."""
    if category == "rank_imbalance":
        return rebalance(g)
    if category == "exposed_communication":
        nh = np.cumsum([0] + [p.graph.n_host for p in parts])
        issue = np.zeros(g.n_host, dtype=bool)
        for i, p in enumerate(parts):
            issue[p.issue_calls + nh[i]] = True
        return overlap(g, comm_in_steps(g, parts), issue=issue & (g.h_step >= 0))
    raise ValueError(f"no cross-rank transformation for {category}")


def fix_steps(parts: Sequence[RankGraph], unprofiled_step_ms: float | None, categories: Sequence[str],
              cost_us: float | None = None, joined: Graph | None = None) -> dict[str, list[float]]:
    """Per cross-rank category, the job's replayed step (the slowest rank's, ms) before and after
    its fix (:func:`cross_fix`) on the joined graph, deflated when ``unprofiled_step_ms`` is known (by
    ``cost_us`` per recorded host event, :func:`job_cost`'s, found here when not given). Plain
    lists: the analysis files them in its results cache. ``joined``: that graph where it was made
    already (:func:`joined_job`)."""
    g = job(parts, unprofiled_step_ms, cost_us) if joined is None else joined
    before = slowest_ms(g)
    return {c: [before, slowest_ms(cross_fix(c, g, parts))] for c in categories}


def job_cost(parts: Sequence[RankGraph], unprofiled_step_ms: float | None) -> float:
    """The profiler's cost per recorded host event that takes the joined job to ``unprofiled_step_ms``
    (one cost for all ranks: :func:`gpuprof.replay.calibrate`); 0 without it. The search replays
    the coupled job a dozen times or more, so the pipeline finds it once per job and hands it to
    the cross-rank findings, the projection and ``what_if`` alike."""
    from gpuprof.replay.host import calibrate

    return calibrate(join(parts), unprofiled_step_ms) if unprofiled_step_ms else 0.0


def joined_job(parts: Sequence[RankGraph], unprofiled_step_ms: float | None) -> tuple[Graph, float]:
    """:func:`job` with :func:`job_cost`'s cost, and that cost, the ranks joined once for both."""
    from gpuprof.replay.host import calibrate
    from gpuprof.replay.transforms import deflate

    g = join(parts)
    if not unprofiled_step_ms:
        return g, 0.0
    cost = calibrate(g, unprofiled_step_ms)
    return deflate(g, cost), cost


def job(parts: Sequence[RankGraph], unprofiled_step_ms: float | None, cost_us: float | None = None) -> Graph:
    """The joined job graph, the profiler's host cost taken out when the unprofiled step time is
    known: ``cost_us`` per recorded host event (:func:`job_cost`, found here when not given)."""
    from gpuprof.replay.host import calibrate
    from gpuprof.replay.transforms import deflate

    g = join(parts)
    if not unprofiled_step_ms:
        return g
    return deflate(g, calibrate(g, unprofiled_step_ms) if cost_us is None else cost_us)


__all__ = ["COMM_OPS", "MAX_SHIFT", "SYNC_SLACK_US", "RankGraph", "build_job", "comm_in_steps", "comm_rows", "cross_fix",
           "fix_steps", "host_free_ms", "host_per_step", "job", "job_cost", "join", "joined_job", "match", "overlap", "rank_graph",
           "rebalance", "slowest_ms"]
