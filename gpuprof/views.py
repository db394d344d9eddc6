"""Plain data for the views beyond the ranked findings, computed here so that reports only format:

* :func:`claims`: the kernels, copies and idle gaps each reported finding owns after claims
  (the units :func:`gpuprof.claims.claim` counted for it, kept with the result), with their times;
* :func:`timeline`: one step's lanes (host threads, GPU streams, idle stretches), decimated for
  big traces while keeping every item a finding claims;
* :func:`operators`: one row per CPU op name (aten and ``record_function`` spans);
* :func:`annotation_data`: what ``gpuprof annotate`` adds to a trace.

Each takes the :class:`~gpuprof.analysis.Result` and the ranks' frames (``ranks``, in its parts'
order). Times are µs on each rank's own time origin (:mod:`gpuprof.trace.model`) unless said
otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analysis import Result
from gpuprof.claims import owned_units
from gpuprof.idle import classify_gaps
from gpuprof.rank import RankResult
from gpuprof.trace.model import RankTrace
from gpuprof.trace.names import ALLOCATOR_CALLS

CLAIM_COLUMNS = ["finding", "rank", "kind", "row", "ts", "end", "saved_us", "name", "stream"]
_KINDS = {"k": "kernel", "m": "memcpy", "gap": "gap"}


def claims(result: Result, ranks: Sequence[RankResult]) -> pd.DataFrame:
    """Every unit a reported finding keeps after claims, one row each.

    Columns: finding (id), rank, kind (kernel, memcpy, gap), row (of the rank's kernels or
    memcpys; for gaps, of the rank's classified gaps), ts, end (µs), saved_us (what the finding
    counts there, over all profiled steps), name (kernel or copy name; ``idle`` for gaps),
    stream (-1 for gaps). The claims are those the analysis settled (``result.claims``), so the
    times here sum to each finding's counted saving on that rank (a replayed finding's saving
    spread over its claims in proportion to what each claimed)."""
    reported = {f.id for f in result.findings}
    if not reported:
        return pd.DataFrame(columns=CLAIM_COLUMNS)
    frames: list[pd.DataFrame] = []
    for part, r, rank_claims in zip(result.parts, ranks, result.claims):
        t = r.trace
        gaps: pd.DataFrame | None = None
        for fid, units in owned_units(rank_claims).items():
            if fid not in reported or not units:
                continue
            keys = list(units)
            kinds = np.array([u[0] for u in keys], dtype=object)
            rows = np.array([int(u[2]) for u in keys], dtype=np.int64)
            saved = np.array([units[u] for u in keys], dtype=float)
            for kind, src in (("k", t.kernels), ("m", t.memcpys)):
                m = kinds == kind
                if m.any():
                    sel = src.loc[rows[m]]
                    frames.append(pd.DataFrame({
                        "finding": fid, "rank": part.rank, "kind": _KINDS[kind], "row": rows[m],
                        "ts": sel["ts"].to_numpy(), "end": sel["end"].to_numpy(), "saved_us": saved[m],
                        "name": sel["name"].astype(str).to_numpy(), "stream": sel["stream"].to_numpy()}))
            m = kinds == "gap"
            if m.any():
                gaps = classify_gaps(t) if gaps is None else gaps
                g = gaps.loc[rows[m]]
                frames.append(pd.DataFrame({
                    "finding": fid, "rank": part.rank, "kind": "gap", "row": rows[m],
                    "ts": g["start"].to_numpy(), "end": g["end"].to_numpy(), "saved_us": saved[m],
                    "name": "idle (" + g["cause"].astype(str) + ")", "stream": -1}))
    if not frames:
        return pd.DataFrame(columns=CLAIM_COLUMNS)
    out = pd.concat(frames, ignore_index=True)[CLAIM_COLUMNS]
    # A replayed finding's saving is its fix replayed, not its claims added up: its claims carry
    # that saving in proportion to what each claimed (gpuprof.pricing).
    steps = {p.rank: p.n_steps for p in result.parts}
    for f in result.findings:
        if f.evidence.get("estimate") != "replay":
            continue
        for rank in out.loc[out["finding"] == f.id, "rank"].unique():
            m = ((out["finding"] == f.id) & (out["rank"] == rank)).to_numpy()
            total = float(out.loc[m, "saved_us"].sum())
            if total > 0:
                out.loc[m, "saved_us"] *= f.estimated_savings_ms * 1000.0 * steps[int(rank)] / total
    return out.sort_values(["rank", "ts"], kind="stable", ignore_index=True)


def annotation_data(result: Result, ranks: Sequence[RankResult]) -> list[dict[str, Any]]:
    """Per rank, what ``gpuprof annotate`` writes into its trace: the file, its time origin
    (``t0_epoch_ns``, :class:`gpuprof.trace.model.TraceMeta`), each
    kernel's roofline class, and each finding's claimed items with the finding's headline.

    ``kernels`` holds columns ts, dur, stream, device, step (-1 outside the profiled steps), cls
    (compute, memory, latency, unknown, communication), bound, roofline_pct, achieved_tflops,
    achieved_gbps; ``claims`` is
    :func:`claims` for that rank."""
    c = claims(result, ranks)
    findings = {f.id: {"id": f.id, "category": f.category, "title": f.title,
                       "saving_ms": f.estimated_savings_ms, "saving_pct": f.estimated_savings_pct,
                       "confidence": f.confidence, "order": i + 1}
                for i, f in enumerate(result.findings)}
    out = []
    for r in ranks:
        meta = r.trace.meta
        k = pd.concat([r.trace.kernels[["ts", "dur", "stream", "device", "step"]],
                       r.roofline[["cls", "bound", "roofline_pct", "achieved_tflops", "achieved_gbps"]]], axis=1)
        mine = c[c["rank"] == meta.rank]
        out.append({"path": meta.path, "rank": meta.rank, "t0_epoch_ns": meta.t0_epoch_ns, "kernels": k,
                    "claims": mine.reset_index(drop=True),
                    "findings": [findings[f] for f in findings if f in set(mine["finding"])]})
    return out


def _dims_text(values: pd.Series) -> np.ndarray:
    """Recorded input dims as short text, parsed once per distinct value."""
    from gpuprof.trace.load import parse_arg

    codes, uniq = pd.factorize(values, use_na_sentinel=True)
    texts = np.array([_short(parse_arg(u)) for u in uniq] + [""], dtype=object)
    return texts[codes]  # code -1 (not recorded) picks the trailing ""


def _short(dims: Any, width: int = 160) -> str:
    if dims is None:
        return ""
    t = str(dims).replace(" ", "")
    return t if len(t) <= width else t[: width - 1] + "…"


def _pick_step(steps: pd.DataFrame) -> int | None:
    """The step whose GPU time is the median one: a typical step, not the first (warm-up shows
    there) nor an outlier."""
    s = steps.dropna(subset=["time"]) if "time" in steps else steps.iloc[0:0]
    s = s[s["time"] > 0]
    if s.empty:
        return None
    order = s.sort_values("time", kind="stable")
    return int(order["step"].iloc[(len(order) - 1) // 2])


#: What one page can show of a step: past these, the least busy host threads (by their ops' and
#: runtime calls' time in the step) share one lane per level, the least busy GPU streams one lane,
#: and of many ranks the slowest and fastest are drawn. At 34 px a lane, 12 threads (3 lanes
#: each), 24 streams and the idle lane are a page of about 2,100 px.
MAX_HOST_THREADS = 12
MAX_STREAMS = 24
MAX_RANKS = 16

_ITEM_COLUMNS = ["start", "dur", "name", "cls", "shapes", "detail", "kind", "rank", "row"]
_HOST_LEVELS = ("ops", "ops, level 2", "runtime")


def _ordered(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes and uniques of ``values``, uniques sorted where they compare (thread ids are numbers
    or, in old traces, strings)."""
    try:
        codes, uniq = pd.factorize(values, sort=True)
    except TypeError:
        codes, uniq = pd.factorize(values.astype(str), sort=True)
    return codes, np.asarray(uniq, dtype=object)


def _host_lanes(t: RankTrace, pos: int, origin: float, shapes_of_op: np.ndarray, rk: int
                ) -> tuple[pd.DataFrame, list[str], int]:
    """The step's host items (top-level and second-level ops, runtime calls) with a ``lane`` code
    each, the lanes' names, and how many threads were summarised: all threads at once, the
    ``MAX_HOST_THREADS`` busiest with lanes of their own (in thread order), the rest sharing one
    lane per level."""
    ops = t.ops[(t.ops["step"].to_numpy() == pos) & (t.ops["depth"].to_numpy() <= 1)]
    rt = t.runtime[t.runtime["step"].to_numpy() == pos]
    if not len(ops) and not len(rt):
        return pd.DataFrame(columns=[*_ITEM_COLUMNS, "lane"]), [], 0
    oi = ops.index.to_numpy()
    h = pd.concat([
        pd.DataFrame({"start": ops["ts"].to_numpy() - origin, "dur": ops["dur"].to_numpy(),
                      "name": ops["name"].astype(str).to_numpy(), "cls": "cpu_op",
                      "shapes": shapes_of_op[oi] if len(shapes_of_op) else "", "detail": "", "kind": "op",
                      "rank": rk, "row": oi, "tid": ops["tid"].to_numpy(), "level": ops["depth"].to_numpy()}),
        pd.DataFrame({"start": rt["ts"].to_numpy() - origin, "dur": rt["dur"].to_numpy(),
                      "name": rt["name"].astype(str).to_numpy(), "cls": "runtime", "shapes": "", "detail": "",
                      "kind": "runtime", "rank": rk, "row": rt.index.to_numpy(), "tid": rt["tid"].to_numpy(),
                      "level": 2})], ignore_index=True)
    codes, tids = _ordered(h["tid"].to_numpy())
    level = h["level"].to_numpy().astype(np.int64)
    busy = np.bincount(codes, weights=np.where(level != 1, h["dur"].to_numpy(dtype=float), 0.0), minlength=len(tids))
    kept = np.sort(np.argsort(-busy, kind="stable")[:MAX_HOST_THREADS])  # thread order among the busiest
    slot = np.full(len(tids), len(kept), dtype=np.int64)  # the shared lane's slot unless kept
    slot[kept] = np.arange(len(kept))
    lane_key = slot[codes] * 3 + level
    present, lane = np.unique(lane_key, return_inverse=True)
    more = len(tids) - len(kept)
    names = [f"CPU thread {tids[kept[k // 3]]} · {_HOST_LEVELS[k % 3]}" if k // 3 < len(kept)
             else f"CPU: {more:,} more threads · {_HOST_LEVELS[k % 3]}" for k in present]
    return h[_ITEM_COLUMNS].assign(lane=lane), names, more


def _gpu_lanes(streams_of: np.ndarray, device_of: np.ndarray, busy_us: np.ndarray, first: np.ndarray, pre: str
               ) -> tuple[np.ndarray, list[str], int]:
    """A lane code for each GPU item from its stream: streams with kernels first (in stream
    order), then copy-only ones; past ``MAX_STREAMS`` the least busy share one lane."""
    codes, streams = _ordered(streams_of)
    busy = np.bincount(codes, weights=busy_us, minlength=len(streams))
    dev = np.zeros(len(streams), dtype=np.int64)
    dev[codes[::-1]] = device_of[::-1]  # the first item's device of each stream
    kernel_stream = np.zeros(len(streams), dtype=bool)
    kernel_stream[codes[first]] = True
    kept = np.sort(np.argsort(-busy, kind="stable")[:MAX_STREAMS])
    order = kept[np.lexsort((kept, ~kernel_stream[kept]))]  # kernel streams, then copy-only streams
    slot = np.full(len(streams), len(order), dtype=np.int64)
    slot[order] = np.arange(len(order))
    present, lane = np.unique(slot[codes], return_inverse=True)
    more = len(streams) - len(order)
    names = [f"{pre}GPU {dev[order[s]]} stream {streams[order[s]]}" if s < len(order)
             else f"{pre}GPU: {more:,} more streams" for s in present]
    return lane, names, more


def _pick_ranks(ranks: Sequence[RankResult], step: int) -> list[RankResult]:
    """Of more than ``MAX_RANKS`` ranks, the half slowest and half fastest in ``step`` (the slow
    rank and those that wait for it), in rank order."""
    if len(ranks) <= MAX_RANKS:
        return list(ranks)
    times = []
    for r in ranks:
        s = r.trace.steps[r.trace.steps["step"] == step]
        times.append(float((s["end"] - s["start"]).iloc[0]) if len(s) else -np.inf)
    order = np.argsort(times, kind="stable")
    pick = set(order[: MAX_RANKS // 2]) | set(order[-(MAX_RANKS - MAX_RANKS // 2):])
    return [r for i, r in enumerate(ranks) if i in pick]


def timeline(result: Result, ranks: Sequence[RankResult], max_items: int = 30000,
             claims_frame: pd.DataFrame | None = None) -> dict[str, Any]:
    """One step on the GPU timeline, as lanes of items, for the HTML timeline.

    Single rank: host threads (top-level and second-level ops, runtime calls per thread), one
    lane per GPU stream (kernels with their class, copies) and the GPU's idle stretches with
    their cause. Several ranks: one lane per rank's compute stream (the stream with most
    non-collective kernel time), its busiest collective stream, and its idle stretches, each
    rank's step starting at 0 so the ranks line up. A page shows at most ``MAX_HOST_THREADS``
    threads and ``MAX_STREAMS`` streams with lanes of their own (the busiest; the rest share one
    lane, ``threads_summarised`` and ``streams_summarised`` say how many) and ``MAX_RANKS`` ranks
    (the slowest and fastest; ``ranks_left_out`` lists the others). Lanes are built for all
    threads and streams at once, never one at a time.

    The step is the one of median GPU time (first rank's numbering). Times are µs from the
    step's start (single rank: its first host event; ``gpu_start_us`` is where its GPU window
    opens). Past ``max_items`` the shortest items are dropped (they are below a pixel at any zoom
    that shows the whole step) but never one a finding claims nor a call that causes it;
    ``dropped`` counts them.

    Returns ``{"step", "rank", "ranks", "window_us", "gpu_start_us", "lanes": [{"name", "kind"}],
    "items": columns (lane, start, dur, name, cls, shapes, detail), "findings": {id: [item index]}
    (the items each finding claims), "causes": {id: [item index]} (host calls that cause what it
    claims: an allocator finding's cudaMalloc/cudaFree), "dropped", "total", "threads_summarised",
    "streams_summarised", "ranks_left_out"}``; names and shapes are interned in ``strings``
    (items hold codes)."""
    c = claims(result, ranks) if claims_frame is None else claims_frame
    first = ranks[0]
    step = _pick_step(first.trace.steps)
    if step is None:
        return {}
    multi = len(ranks) > 1
    shown = _pick_ranks(ranks, step) if multi else list(ranks)
    lanes: list[dict[str, str]] = []
    parts: list[pd.DataFrame] = []
    threads_more = streams_more = 0

    def add(names: list[str], kind: str, df: pd.DataFrame) -> None:
        if len(df):
            parts.append(df.assign(lane=df["lane"].to_numpy() + len(lanes)))
            lanes.extend({"name": n, "kind": kind} for n in names)

    window, gpu_start = 0.0, 0.0
    for r in shown:
        t = r.trace
        srow = t.steps[t.steps["step"] == step]
        if srow.empty:
            continue
        lo, hi = float(srow["start"].iloc[0]), float(srow["end"].iloc[0])
        # Single rank: from the step's first host event, so the host's lead over the GPU shows.
        origin = lo if multi else min(lo, float(srow["cpu_start"].iloc[0]))
        window = max(window, hi - origin)
        if r is first:
            gpu_start = lo - origin
        rk = t.meta.rank
        pre = f"rank {rk} · " if multi else ""

        def inside(df: pd.DataFrame, s: str = "ts", e: str = "end") -> pd.DataFrame:
            return df[(df[e].to_numpy() > lo) & (df[s].to_numpy() < hi)]

        k = pd.concat([t.kernels[["ts", "end", "dur", "name", "stream", "device", "op"]], r.roofline[["cls"]]], axis=1)
        k = inside(k)
        shapes_of_op = _dims_text(t.ops["input_dims"]) if len(t.ops) else np.array([], dtype=object)
        opn = t.ops["name"].astype(str).to_numpy() if len(t.ops) else np.array([], dtype=object)

        def gpu_items(df: pd.DataFrame, cls: Any, kind: str) -> pd.DataFrame:
            op = df["op"].to_numpy() if "op" in df else np.full(len(df), -1)
            has = op >= 0
            shapes = np.where(has, shapes_of_op[np.where(has, op, 0)] if len(shapes_of_op) else "", "")
            detail = np.where(has, opn[np.where(has, op, 0)] if len(opn) else "", "")
            return pd.DataFrame({"start": df["ts"].to_numpy() - origin, "dur": df["dur"].to_numpy(),
                                 "name": df["name"].astype(str).to_numpy(), "cls": cls, "shapes": shapes,
                                 "detail": detail, "kind": kind, "rank": rk, "row": df.index.to_numpy()})

        if multi:
            comm = (k["cls"] == "communication").to_numpy()
            busy = k[~comm].groupby("stream")["dur"].sum().sort_values(ascending=False)
            comm_busy = k[comm].groupby("stream")["dur"].sum().sort_values(ascending=False)
            # each rank's compute stream (most non-collective kernel time) and its busiest
            # collective stream, so waits and overlap line up across ranks
            streams = list(dict.fromkeys([*busy.index[:1], *comm_busy.index[:1]]))
            for s in streams:
                ks = k[k["stream"] == s]
                add([f"{pre}GPU {int(ks['device'].iloc[0])} stream {int(s)}"], "gpu",
                    gpu_items(ks, ks["cls"].astype(str).to_numpy(), "kernel").assign(lane=0))
        else:
            host, names, threads_more = _host_lanes(t, int(srow.index[0]), origin, shapes_of_op, rk)
            add(names, "host", host)  # events carry the step's position in ``steps``, not its number
            m = inside(t.memcpys)
            g_items = pd.concat([gpu_items(k, k["cls"].astype(str).to_numpy(), "kernel"),
                                 gpu_items(m, "memcpy", "memcpy")], ignore_index=True)
            if len(g_items):
                lane, names, streams_more = _gpu_lanes(
                    np.r_[k["stream"].to_numpy(), m["stream"].to_numpy()],
                    np.r_[k["device"].to_numpy(), m["device"].to_numpy()].astype(np.int64),
                    g_items["dur"].to_numpy(dtype=float), np.arange(len(g_items)) < len(k), pre)
                add(names, "gpu", g_items.assign(lane=lane))
        g = classify_gaps(r.trace)
        g = g[g["step"] == step]
        add([f"{pre}GPU idle"], "idle", pd.DataFrame({
            "start": g["start"].to_numpy() - origin, "dur": g["dur"].to_numpy(),
            "name": "idle (" + g["cause"].astype(str) + ")", "cls": "idle", "shapes": "", "detail": "",
            "kind": "gap", "rank": rk, "row": g.index.to_numpy(), "lane": 0}))
    if not parts:
        return {}
    items = pd.concat(parts, ignore_index=True)
    items["dur"] = items["dur"].clip(lower=0.0)
    # Which items each finding claims, by (rank, kind, row): gaps are numbered as in claims().
    key_items = items["kind"].astype(str) + ":" + items["rank"].astype(str) + ":" + items["row"].astype(str)
    cl = c[c["kind"].isin(["kernel", "memcpy", "gap"])] if len(c) else c
    key_claims = (cl["kind"].astype(str) + ":" + cl["rank"].astype(str) + ":" + cl["row"].astype(str)
                  if len(cl) else pd.Series([], dtype=object))
    claimed = key_items.isin(set(key_claims)).to_numpy()
    # An allocator finding claims the idle its calls leave; the calls themselves are what to see.
    alloc_ids = [f.id for f in result.findings if f.category == "allocator_churn"]
    causing = ((items["kind"] == "runtime").to_numpy() & items["name"].isin(ALLOCATOR_CALLS).to_numpy()
               if alloc_ids else np.zeros(len(items), dtype=bool))
    total = len(items)
    keep = np.ones(total, dtype=bool)
    if total > max_items:
        protected = claimed | causing
        budget = max(max_items - int(protected.sum()), 0)
        rest = np.flatnonzero(~protected)
        longest = rest[np.argsort(-items["dur"].to_numpy()[rest], kind="stable")[:budget]]
        keep = protected.copy()
        keep[longest] = True
    items = items[keep].reset_index(drop=True)
    key_items = key_items[keep].reset_index(drop=True)
    causing = causing[keep]
    where = pd.Series(np.arange(len(items)), index=key_items.to_numpy())
    findings: dict[str, list[int]] = {}
    if len(cl):
        keyed = cl.assign(key=key_claims.to_numpy())
        for fid in pd.unique(keyed["finding"]):
            hit = where.reindex(keyed.loc[keyed["finding"] == fid, "key"].to_numpy()).dropna()
            findings[str(fid)] = [int(x) for x in hit.to_numpy()]
    by_rank = {f.id: {int(x) for x in c.loc[c["finding"] == f.id, "rank"]} for f in result.findings
               if f.id in alloc_ids} if len(c) else {}
    causes = {fid: [int(i) for i in np.flatnonzero(causing & items["rank"].isin(by_rank.get(fid, set())).to_numpy())]
              for fid in alloc_ids}
    causes = {fid: rows for fid, rows in causes.items() if rows}
    strings: dict[str, int] = {}

    def intern(col: pd.Series) -> list[int]:
        codes, uniq = pd.factorize(col.astype(str))
        remap = np.array([strings.setdefault(u, len(strings)) for u in uniq], dtype=np.int64)
        return [int(x) for x in remap[codes]] if len(codes) else []

    shown_ranks = [r.trace.meta.rank for r in shown]
    return {
        "step": step, "rank": first.trace.meta.rank, "ranks": shown_ranks,
        "ranks_left_out": [r.trace.meta.rank for r in ranks if r.trace.meta.rank not in set(shown_ranks)],
        "window_us": window, "gpu_start_us": gpu_start, "lanes": lanes, "total": total,
        "dropped": int(total - len(items)), "threads_summarised": int(threads_more),
        "streams_summarised": int(streams_more),
        "items": {"lane": [int(x) for x in items["lane"]], "start": [round(float(x), 3) for x in items["start"]],
                  "dur": [round(float(x), 3) for x in items["dur"]], "name": intern(items["name"]),
                  "cls": [str(x) for x in items["cls"]], "shapes": intern(items["shapes"]),
                  "detail": intern(items["detail"])},
        "strings": list(strings), "findings": findings, "causes": causes,
    }


OPERATOR_COLUMNS = ["name", "kind", "count", "host_us", "host_self_us", "gpu_us", "gpu_self_us", "kernels",
                    "flops", "bytes", "shapes", "n_shapes"]


def _inside_sums(spans: pd.DataFrame, k: pd.DataFrame, cols: list[str]) -> dict[str, np.ndarray]:
    """For each span (tid, ts, end), the sums of ``cols`` over kernels launched from that thread
    inside it (nested spans each count the kernels of their children): prefix sums over the
    kernels sorted by (thread, launch time), two binary searches per span."""
    out = {c: np.zeros(len(spans)) for c in cols}
    n = np.zeros(len(spans))
    if not len(spans) or not len(k):
        return {**out, "n": n}
    k = k.sort_values(["launch_tid", "launch_ts"], kind="stable")
    tids, lts = k["launch_tid"].to_numpy(), k["launch_ts"].to_numpy()
    # one sorted key: thread id, then time; threads ranked so the key stays numeric
    order_t = {t: i for i, t in enumerate(pd.unique(tids))}
    span_rank = spans["tid"].map(order_t)
    valid = span_rank.notna().to_numpy()
    big = float(np.nanmax(np.abs(lts))) + float(np.nanmax(spans["end"].to_numpy())) + 1.0
    kkey = np.array([order_t[t] for t in pd.unique(tids)], dtype=float)[pd.factorize(tids)[0]] * big * 4 + lts
    sr = span_rank.fillna(0).to_numpy(dtype=float)
    lo = np.searchsorted(kkey, sr * big * 4 + spans["ts"].to_numpy(), side="left")
    hi = np.searchsorted(kkey, sr * big * 4 + spans["end"].to_numpy(), side="left")
    for c in cols:
        cs = np.r_[0.0, np.cumsum(np.nan_to_num(k[c].to_numpy(dtype=float)))]
        out[c] = np.where(valid, cs[hi] - cs[lo], 0.0)
    n = np.where(valid, hi - lo, 0).astype(float)
    return {**out, "n": n}


def operators(ranks: Sequence[RankResult], top: int | None = 2000) -> pd.DataFrame:
    """One row per CPU op name (``aten::…``) and per ``record_function`` span name, over the
    profiled steps of every rank.

    Columns: name, kind (op, annotation), count, host_us (inclusive host time), host_self_us
    (less its child ops; NaN for annotations, whose nesting the trace does not record), gpu_us
    (kernels launched from the op's thread while it ran, children included), gpu_self_us
    (kernels linked to the op itself), kernels (how many, inclusive), flops and bytes (of those
    kernels, from the roofline), shapes (the most frequent recorded input dims) and n_shapes
    (distinct ones). Heaviest GPU time first; at most ``top`` rows. ``ProfilerStep#N`` spans
    are the steps themselves and left out."""
    rows: list[pd.DataFrame] = []
    for r in ranks:
        t = r.trace
        k = pd.concat([t.kernels[["dur", "op", "launch_tid", "launch_ts", "step"]], r.roofline[["flops", "bytes"]]],
                      axis=1)
        k = k[k["step"] >= 0]
        ops = t.ops[t.ops["step"] >= 0]
        if len(ops):
            child = t.ops.loc[t.ops["parent"] >= 0].groupby("parent")["dur"].sum()
            self_us = ops["dur"].to_numpy() - child.reindex(ops.index).fillna(0.0).to_numpy()
            direct = k[k["op"] >= 0].groupby("op")["dur"].sum().reindex(ops.index).fillna(0.0).to_numpy()
            sums = _inside_sums(ops[["tid", "ts", "end"]], k, ["dur", "flops", "bytes"])
            rows.append(pd.DataFrame({
                "name": ops["name"].astype(str).to_numpy(), "kind": "op", "host_us": ops["dur"].to_numpy(),
                "host_self_us": np.maximum(self_us, 0.0), "gpu_us": sums["dur"], "gpu_self_us": direct,
                "kernels": sums["n"], "flops": sums["flops"], "bytes": sums["bytes"],
                "dims": ops["input_dims"].to_numpy()}))
        a = t.annotations
        a = a[~a["on_gpu"].to_numpy() & ~a["name"].astype(str).str.startswith("ProfilerStep#").to_numpy()]
        if len(t.steps) and len(a):
            a = a[(a["end"] > float(t.steps["start"].min())) & (a["ts"] < float(t.steps["end"].max()))]
        if len(a):
            sums = _inside_sums(a[["tid", "ts", "end"]], k, ["dur", "flops", "bytes"])
            rows.append(pd.DataFrame({
                "name": a["name"].astype(str).to_numpy(), "kind": "annotation", "host_us": a["dur"].to_numpy(),
                "host_self_us": np.nan, "gpu_us": sums["dur"], "gpu_self_us": np.nan, "kernels": sums["n"],
                "flops": sums["flops"], "bytes": sums["bytes"], "dims": None}))
    if not rows:
        return pd.DataFrame(columns=OPERATOR_COLUMNS)
    allr = pd.concat(rows, ignore_index=True)
    g = allr.groupby(["name", "kind"], sort=False)
    out = g.agg(count=("host_us", "size"), host_us=("host_us", "sum"), host_self_us=("host_self_us", "sum"),
                gpu_us=("gpu_us", "sum"), gpu_self_us=("gpu_self_us", "sum"), kernels=("kernels", "sum"),
                flops=("flops", "sum"), bytes=("bytes", "sum")).reset_index()
    out.loc[out["kind"] == "annotation", ["host_self_us", "gpu_self_us"]] = np.nan
    dims = allr[allr["dims"].notna()]
    if len(dims):
        counts = dims.groupby(["name", "kind", "dims"], sort=False).size().rename("n").reset_index()
        counts = counts.sort_values("n", ascending=False, kind="stable")
        topd = counts.drop_duplicates(["name", "kind"])
        nd = counts.groupby(["name", "kind"]).size().rename("n_shapes").reset_index()
        topd = topd.assign(shapes=_dims_text(topd["dims"])).drop(columns=["dims", "n"])
        out = out.merge(topd, on=["name", "kind"], how="left").merge(nd, on=["name", "kind"], how="left")
    else:
        out = out.assign(shapes="", n_shapes=0)
    out["shapes"] = out["shapes"].fillna("")
    out["n_shapes"] = out["n_shapes"].fillna(0).astype(int)
    out["kernels"] = out["kernels"].astype(int)
    out = out.sort_values(["gpu_us", "host_us"], ascending=False, kind="stable", ignore_index=True)
    return out[OPERATOR_COLUMNS].head(top) if top else out[OPERATOR_COLUMNS]


def memory(ranks: Sequence[RankResult], max_points: int = 4000, top: int = 15) -> dict[str, Any]:
    """GPU memory over the profiled steps from ``profile_memory=True`` events (the first rank
    that has them, its GPU with most events): allocated and reserved bytes after each event (µs
    from the first step's start, down-sampled to about ``max_points`` with the peak always kept),
    the peak and the step it fell in, and the ops whose allocations add up to most (the innermost
    CPU op on the allocating thread when it ran: bytes, count, largest one). Empty when no rank
    has them.

    torch 1.9 and older record each allocation's bytes but no totals: ``allocated`` is then the
    running sum of the bytes allocated and freed since the trace began (``relative``: True, what
    the trace held before its first event unknown) and ``reserved`` None."""
    for r in ranks:
        t = r.trace
        every = t.memory[t.memory["device_type"].to_numpy() == 1]
        if every.empty or not (every["step"].to_numpy() >= 0).any():
            continue
        device = int(every.loc[every["step"] >= 0, "device"].value_counts().index[0])
        every = every[every["device"].to_numpy() == device].sort_values("ts", kind="stable")
        relative = bool(every["total_allocated"].isna().all())
        if relative:  # no totals recorded: the running sum of what was allocated and freed
            every = every.assign(total_allocated=every["bytes"].astype(float).cumsum())
        m = every[every["step"].to_numpy() >= 0]
        t0 = float(t.steps["start"].min()) if len(t.steps) else 0.0
        t0 = min(t0, float(m["ts"].iloc[0]))
        alloc = m["total_allocated"].to_numpy(dtype=float)
        reserved = m["total_reserved"].to_numpy(dtype=float)
        known = np.isfinite(alloc)
        peak_i = int(np.flatnonzero(known)[np.argmax(alloc[known])]) if known.any() else len(m) - 1
        stride = max(1, len(m) // max_points)
        keep = np.zeros(len(m), dtype=bool)
        keep[::stride] = True
        keep[[peak_i, len(m) - 1]] = True
        owner = _owner_ops(t.ops, m)
        allocs = m.assign(op=owner)[m["bytes"].to_numpy() > 0]
        names = np.where(allocs["op"].to_numpy() >= 0,
                         t.ops["name"].astype(str).to_numpy()[np.maximum(allocs["op"].to_numpy(), 0)]
                         if len(t.ops) else "", "(no op)")
        by = (allocs.assign(op_name=names).groupby("op_name")["bytes"].agg(["sum", "size", "max"])
              .sort_values("sum", ascending=False).head(top))
        steps = t.steps.reset_index(drop=True)
        has_reserved = bool(np.isfinite(reserved).any())
        return {
            "rank": t.meta.rank, "device": device, "events": int(len(m)), "relative": relative,
            "t_ms": [round((float(x) - t0) / 1000.0, 4) for x in m["ts"].to_numpy()[keep]],
            "allocated": [float(x) for x in alloc[keep]],
            "reserved": [float(x) for x in reserved[keep]] if has_reserved else None,
            "peak_bytes": float(alloc[peak_i]), "peak_t_ms": (float(m["ts"].iloc[peak_i]) - t0) / 1000.0,
            "peak_step": int(steps["step"].iloc[int(m["step"].iloc[peak_i])]),
            "reserved_peak_bytes": float(np.nanmax(reserved)) if has_reserved else None,
            "steps": [{"step": int(s), "start_ms": (float(a) - t0) / 1000.0, "end_ms": (float(b) - t0) / 1000.0}
                      for s, a, b in zip(steps["step"], steps["start"], steps["end"])],
            "top_ops": [{"op": str(name), "bytes": float(row["sum"]), "count": int(row["size"]),
                         "largest": float(row["max"])} for name, row in by.iterrows()],
        }
    return {}


def _owner_ops(ops: pd.DataFrame, m: pd.DataFrame) -> np.ndarray:
    """Row of the innermost op on each event's thread whose span holds its time, or -1: one
    binary search per nesting level and thread (ops of one level on one thread never overlap)."""
    out = np.full(len(m), -1, dtype=np.int64)
    if ops.empty:
        return out
    ts, tids = m["ts"].to_numpy(), m["tid"].to_numpy()
    for (tid, _depth), o in ops.sort_values("ts", kind="stable").groupby(["tid", "depth"], sort=True):
        sel = np.flatnonzero(tids == tid)
        if not len(sel):
            continue
        st, en = o["ts"].to_numpy(), o["end"].to_numpy()
        i = np.searchsorted(st, ts[sel], side="right") - 1
        inside = (i >= 0) & (en[np.maximum(i, 0)] > ts[sel])
        out[sel[inside]] = o.index.to_numpy()[i[inside]]  # deeper levels come later and win
    return out
