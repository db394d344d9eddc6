"""Host-side idle time, one analyzer per cause of the GPU's idle gaps (see ``_base.classify_gaps``).

* ``input_pipeline``: the GPU waits while the training process prepares the next batch
  (a DataLoader span), or while the main thread runs Python or CPU-only ops outside every op
  that drives the GPU (tokenising, image processing, logging: ``host_work``).
* ``host_stall``: one gap holding a large share of its step, inside one op or call (a blocking
  copy, a pause, a checkpoint save), named with its duration; and one-off host work after a step's
  last GPU work, before the next step starts (a checkpoint written to disk after its copies:
  :func:`step_tails`), which no idle gap inside a step window holds.
* ``host_sync``: a call that drains the GPU queue (``.item()``, ``.cpu()``, ``nonzero``,
  ``synchronize``) leaves the GPU idle until the host launches new work.
* ``launch_overhead``: the host cannot launch kernels as fast as the GPU runs them. Never
  recommends CUDA graphs for work that already replays as a graph, and says so instead of
  reporting launch overhead when the trace records graph capture.

Estimate: the gaps of that cause, per step, each less the profiler's own cost for the host
events recorded inside it (``_base``: known when the unprofiled step time is). For launch overhead this is an upper
bound: CUDA graphs still leave about a microsecond between kernels. A *launch-bound* step (under
half its kernels in graph replay, GPU busy under half the real step, launch gaps at least half the
real idle) is set by the host's launch cost per kernel; a graph replays it at the GPU's own time,
so the estimate is the real step less GPU busy time and the idle other causes hold (never more
than real step − GPU busy), claimed before the fusion findings. In an inference trace of a few
rows per GEMM it is named host-bound decode, with static cache + CUDA graphs and batching.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from gpuprof.analyzers._base import HOST_NOTE, ms
from gpuprof.hostops import copy_sync_gaps, pageable_copy_syncs, python_frames
from gpuprof.idle import HOST_WORK_MIN_US, forward_only, graph_capture_calls, in_graph, name_mask, outermost_aten
from gpuprof.trace.names import SYNC_CALLS
from gpuprof.claims import Candidate, gap_units
from gpuprof.rank import RankView



def _common(v: RankView, g: pd.DataFrame) -> dict[str, Any]:
    ev: dict[str, Any] = {"rank": v.rank, "gaps_per_step": round(len(g) / v.n_steps, 1),
                          "idle_ms_per_step_traced": round(ms(g["dur"].sum()) / v.n_steps, 3),
                          "idle_ms_per_step_without_profiler": round(ms(g["real_dur"].sum()) / v.n_steps, 3),
                          "profiler_cost_per_host_event_us": round(v.event_cost_us, 3),
                          "profiler_cost_from": "step times" if v.event_cost_measured else "op brackets (estimate)"}
    if not v.host_scale_known:
        ev["note"] = HOST_NOTE
    return ev


def _name(frame: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """Names of the given rows of ``frame`` (None where the row is -1)."""
    names = frame["name"].astype(object).to_numpy()
    r = np.asarray(rows, dtype=np.int64)
    out = np.full(len(r), None, dtype=object)
    ok = r >= 0
    out[ok] = names[r[ok]]
    return out


def input_pipeline(v: RankView) -> list[Candidate]:
    out: list[Candidate] = []
    g = v.gaps_of("input")
    if g.empty:
        return out
    ev = _common(v, g)
    loads = v.trace.memcpys[v.trace.memcpys["kind"] == "HtoD"]
    ev["host_to_device_mb_per_step"] = round(float(loads["bytes"].sum()) / 1e6 / v.n_steps, 1)
    # The recommendation also pins the batch and copies it non_blocking; that part is not in
    # this estimate: a pageable batch copy is pageable_memcpy's finding, priced apart (a program
    # can move its loading to workers and keep pageable copies; docs/replay.md)
    ev["estimate"] = ("idle gaps while the DataLoader ran in the training process: its host work up to the "
                      "launch that ended each gap; the batch's copy to the GPU is not in it (a pageable "
                      "one is the pageable_memcpy finding's), nor host work outside the DataLoader span")
    out.append(Candidate(
        id="GP-INPUT-001", category="input_pipeline",
        title=f"The GPU waits for the next batch: {ms(g['dur'].sum()) / v.n_steps:.1f} ms idle per step "
              "while the DataLoader runs in the training process",
        confidence=v.host_confidence("high"),
        recommendation="Load and augment batches off the critical path: `DataLoader(..., num_workers=N "
                       "(start with the CPU cores per GPU), pin_memory=True, persistent_workers=True, "
                       "prefetch_factor=2..4)`, move heavy preprocessing offline or to the GPU, and copy "
                       "with `.to('cuda', non_blocking=True)`.",
        units=gap_units(v.rank, g, g["real_dur"]), evidence=ev))
    return out


def _covering_annotation(v: RankView, start: float, end: float) -> str | None:
    """The innermost user annotation (``record_function``) around a host stretch, other than the
    step and optimizer spans the profiler and torch.optim record."""
    a = v.trace.annotations
    a = a[~a["on_gpu"] & (a["ts"] <= start) & (a["end"] >= end)]
    names = a["name"].astype(str)
    a = a[~names.str.match(r"ProfilerStep#|Optimizer\.|## ")]
    return str(a.sort_values("dur")["name"].iloc[0]) if len(a) else None


def host_work(v: RankView) -> list[Candidate]:
    """Idle while the main thread runs Python or CPU-only ops outside every op that drives the GPU."""
    out: list[Candidate] = []
    g = v.gaps_of("host_work")
    if g.empty:
        return out
    ops = v.trace.ops
    prev, nxt = _name(ops, g["prev_op"].to_numpy()), _name(ops, g["next_op"].to_numpy())
    where = pd.DataFrame({"after": pd.Series(prev, dtype=object).fillna("(step start)").to_numpy(),
                          "before": pd.Series(nxt, dtype=object).fillna("(trace end)").to_numpy(),
                          "us": g["longest_us"].to_numpy(), "start": g["hole_start"].to_numpy(),
                          "end": g["hole_end"].to_numpy()})
    by = where.groupby(["after", "before"], sort=False).agg(us=("us", "sum"), n=("us", "size"),
                                                             start=("start", "first"), end=("end", "first"))
    by = by.sort_values("us", ascending=False).head(5)
    # Python frames at the middle of each stretch, on the thread that launched what ended it
    lo = np.maximum(by["start"].to_numpy(dtype=float), g["start"].min())
    hi = np.minimum(by["end"].to_numpy(dtype=float), g["end"].max())
    tids, counts = np.unique(g["launch_tid"].to_numpy(dtype=np.int64), return_counts=True)
    tid = np.full(len(by), int(tids[counts.argmax()]))  # thread ids are large numbers: no bincount
    frames = python_frames(v.trace, tid, (lo + hi) / 2, outer=3)
    py_names = v.trace.python["name"].astype(object).to_numpy()
    stretches = []
    keys = list(by.index)
    us_, n_ = by["us"].to_numpy(dtype=float), by["n"].to_numpy(dtype=np.int64)
    for i in range(len(by)):  # the few distinct stretches, not events
        after, before = keys[i]
        span = _covering_annotation(v, float(lo[i]), float(hi[i]))
        stack = [str(py_names[f]) for f in frames[i] if f >= 0]
        stretches.append({"after_op": str(after), "before_op": str(before),
                          "ms_per_step": round(ms(float(us_[i])) / v.n_steps, 3), "times": int(n_[i]),
                          "inside_annotation": span, "python_frames": stack})
    top = stretches[0]
    what = f"`{top['inside_annotation']}`" if top["inside_annotation"] else \
        f"between `{top['after_op']}` and `{top['before_op']}`"
    if top["python_frames"]:
        what += f" in `{top['python_frames'][0]}`"
    ev = _common(v, g)
    ev["stretches"] = stretches
    ev["host_ms_per_step_outside_gpu_ops"] = round(ms(g["outside_us"].sum()) / v.n_steps, 3)
    ev["estimate"] = ("idle gaps the launching thread spent outside every op that drives the GPU (user "
                      "Python, CPU-only ops), in one stretch of at least 1 ms; host time inside ops is "
                      "dispatch and counts as launch overhead")
    out.append(Candidate(
        id="GP-INPUT-002", category="input_pipeline",
        title=f"The GPU waits for host work on the main thread: {ms(g['dur'].sum()) / v.n_steps:.1f} ms idle "
              f"per step outside any GPU op ({what})",
        confidence=v.host_confidence("high"),
        recommendation=f"Take the Python work {what} off the training loop: tokenise, decode and augment in "
                       "`DataLoader(..., num_workers=N, pin_memory=True)` workers (or offline), run image/video "
                       "processors on the GPU or in the dataset, and move logging/metrics to every N steps or "
                       "a background thread; the GPU then runs while the next batch is prepared.",
        units=gap_units(v.rank, g, g["real_dur"]), evidence=ev))
    return out


def step_tails(v: RankView) -> pd.DataFrame:
    """One-off host work at a step's end: the GPU idle from the step's last GPU work until the next
    step starts, beyond the least any step boundary of the trace takes (the loop's own host work
    there: ``zero_grad``, ``prof.step()``), where that excess lasts ``HOST_WORK_MIN_US`` or more
    at fewer than half of the steps (the rule ``classify_gaps`` applies to host work inside a step:
    a checkpoint every N steps, not work that recurs every step). Step windows end with their last
    GPU work, so this stretch lies in no window and no idle gap holds it, though the step period
    includes it: gpt_checkpoint_every3 writes its checkpoint for 314 ms after the copies' 606 ms of
    stalled gaps. Columns: step (the earlier step), start, end, dur (the excess, µs), events (host
    events recorded in it, pro rata), real_dur (less the profiler's cost for them, within the
    real idle budget the gaps leave)."""
    cols = ["step", "start", "end", "dur", "events", "real_dur"]
    s = v.steps.sort_values("start", kind="stable") if len(v.steps) else v.steps
    if len(s) < 3:  # one boundary: nothing to tell one-off from recurring work by
        return pd.DataFrame(columns=cols)
    lo, hi = s["end"].to_numpy(dtype=float)[:-1], s["start"].to_numpy(dtype=float)[1:]
    hole = np.maximum(hi - lo, 0.0)
    excess = hole - hole.min()
    t = v.trace
    starts = np.sort(np.r_[t.ops["ts"].to_numpy(dtype=float), t.runtime["ts"].to_numpy(dtype=float)])
    n = (np.searchsorted(starts, hi) - np.searchsorted(starts, lo)) * excess / np.maximum(hole, 1e-9)
    real = np.maximum(excess - v.event_cost_us * n, 0.0)
    long = real >= HOST_WORK_MIN_US
    if not long.any() or long.sum() >= 0.5 * len(s):
        return pd.DataFrame(columns=cols)
    if v.host_scale_known:  # the real idle per step cannot exceed real step − GPU busy (as for the gaps)
        idle = (v.unprofiled_or_traced_step_us - v.busy_us) * v.n_steps
        left = max(0.0, idle - float(v.gaps["real_dur"].sum()) if len(v.gaps) else idle)
        total = float(real[long].sum())
        if total > left:
            real = real * (left / total)
    return pd.DataFrame({"step": s["step"].to_numpy()[:-1][long], "start": hi[long] - excess[long], "end": hi[long],
                         "dur": excess[long], "events": n[long], "real_dur": real[long]})


def host_stall(v: RankView) -> list[Candidate]:
    """One long idle gap inside one op or runtime call: named, with its duration."""
    out: list[Candidate] = []
    g = v.gaps_of("stall")
    tails = step_tails(v)
    if g.empty and tails.empty:
        return out
    if g.empty:  # only a step-end stall: the frame may lack the classified columns
        g = pd.DataFrame(columns=["step", "dur", "real_dur"], dtype=float)
    t = v.trace
    rows = _stall_rows(v, g)
    if len(tails):
        tid = np.full(len(tails), _main_tid(v), dtype=np.int64)
        tf = python_frames(t, tid, ((tails["start"] + tails["end"]) / 2).to_numpy(dtype=float))
        after_step = pd.DataFrame({
            "step": tails["step"].to_numpy(), "ms": tails["dur"].to_numpy(dtype=float) / 1000.0, "op": None,
            "call": None, "call_ms": 0.0,
            "python": [f"Python{' in `' + str(f) + '`' if f else ''} after the step's last GPU work, before the "
                       "next step starts" for f in tf]})
        rows = after_step if rows.empty else pd.concat([rows, after_step], ignore_index=True)
    rows = rows.sort_values("ms", ascending=False)
    worst = rows.iloc[0]
    per_step = rows.groupby("step")["ms"].agg(["sum", "size"]).sort_values("sum", ascending=False)
    w_step, w_ms, w_n = int(per_step.index[0]), float(per_step["sum"].iloc[0]), int(per_step["size"].iloc[0])
    worst = rows[rows["step"] == w_step].iloc[0]
    named = " / ".join(f"`{x}`" for x in (worst["op"], worst["call"]) if x) or str(worst["python"])
    blocking = any(x and (x in SYNC_CALLS or "copy" in str(x).lower() or "Memcpy" in str(x))
                   for x in (worst["op"], worst["call"]))
    fix = ("It is a blocking copy: copy from pinned memory with `non_blocking=True`, or move the copy "
           "(and what waits for it) out of the step. " if blocking else "")
    ev = _common(v, g)
    ev["stalls"] = [{"step": int(r["step"]), "ms": round(float(r["ms"]), 3), "op": r["op"], "call": r["call"],
                     "call_ms": round(float(r["call_ms"]), 3), "outside_ops": r["python"]}
                    for _, r in rows.head(5).iterrows()]
    ev["estimate"] = "the stalled gaps themselves: without the stall the GPU would not wait"
    if len(tails):
        ev["after_step_ms"] = {int(st): round(ms(float(d)), 3) for st, d in zip(tails["step"], tails["real_dur"])}
        ev["estimate"] += ("; and the host's one-off work after the step's last GPU work, beyond the least any "
                           "step boundary takes")
    out.append(Candidate(
        id="GP-STALL-001", category="host_stall",
        title=f"A {w_ms:.1f} ms host stall in step {w_step}: the GPU waits while the host is in {named}"
              + (f" ({w_n} gaps)" if w_n > 1 else "")
              + (f"; {len(per_step)} steps stall" if len(per_step) > 1 else ""),
        confidence=v.host_confidence("high"),
        recommendation=fix + "Move one-off host work out of the timed steps: save checkpoints asynchronously "
                             "(`torch.distributed.checkpoint.async_save`) or less often, drop pauses and waits on "
                             "locks/queues from the loop, and profile steady-state steps.",
        units={**gap_units(v.rank, g, g["real_dur"]),
               **{("tail", v.rank, int(st)): float(d) for st, d in zip(tails["step"], tails["real_dur"]) if d > 0}},
        evidence=ev))
    return out


def _stall_rows(v: RankView, g: pd.DataFrame) -> pd.DataFrame:
    """One row per stalled gap: step, ms, the op and call it sat in (None outside any), the call's
    ms, and where it is when outside every op (the ops around it, the user's Python frame)."""
    cols = ["step", "ms", "op", "call", "call_ms", "python"]
    if g.empty:
        return pd.DataFrame(columns=cols)
    t = v.trace
    inside = np.maximum(g["op_us"].to_numpy(), g["call_us"].to_numpy()) >= 0.5 * g["dur"].to_numpy()
    op, call = _name(t.ops, g["op_row"].to_numpy()), _name(t.runtime, g["call_row"].to_numpy())
    op[~inside], call[~inside] = None, None
    # outside any op: name the stretch by the ops around it and the user's Python frame there
    mid = (np.maximum(g["hole_start"].to_numpy(), g["start"].to_numpy())
           + np.minimum(g["hole_end"].to_numpy(), g["end"].to_numpy())) / 2
    frame = python_frames(t, g["launch_tid"].to_numpy(dtype=np.int64), mid)
    after, before = _name(t.ops, g["prev_op"].to_numpy()), _name(t.ops, g["next_op"].to_numpy())
    where = [None if ins else f"Python{' in `' + str(f) + '`' if f else ''} between `{a or '(step start)'}` "
             f"and `{b or '(trace end)'}`"
             for ins, f, a, b in zip(inside, frame, after, before)]  # one per stall: a handful
    # object columns: names beside None would be inferred as pandas' str dtype, whose missing value
    # is NaN, which a title then reads as the text `nan`
    return pd.DataFrame({"step": g["step"].to_numpy(), "ms": g["dur"].to_numpy() / 1000.0,
                         "op": pd.Series(op, dtype=object), "call": pd.Series(call, dtype=object),
                         "call_ms": np.where(inside, g["call_us"].to_numpy() / 1000.0, 0.0),
                         "python": pd.Series(where, dtype=object)})


def _main_tid(v: RankView) -> int:
    """The thread that launches most of the rank's GPU work (the training loop's)."""
    tids, counts = np.unique(v.trace.runtime["tid"].to_numpy(dtype=np.int64), return_counts=True)
    return int(tids[counts.argmax()]) if len(tids) else -1


def _syncing_ops(v: RankView, rt: pd.DataFrame) -> pd.Series:
    """The user-facing op of each sync call (the outermost aten op around it), counted by name."""
    ops = v.trace.ops
    if not len(rt) or not len(ops):
        return pd.Series(dtype="int64")
    ext = ops["external_id"].to_numpy()
    order = np.argsort(ext, kind="stable")
    se = ext[order]
    keys = rt["external_id"].to_numpy()
    pos = np.clip(np.searchsorted(se, keys), 0, max(len(se) - 1, 0))
    hit = (se[pos] == keys) & (keys >= 0)
    rows = outermost_aten(ops, order[pos[hit]])
    return pd.Series(_name(ops, rows), dtype=object).value_counts()


def host_sync(v: RankView) -> list[Candidate]:
    out: list[Candidate] = []
    t = v.trace
    # a blocking copy of pageable memory syncs inside its own op: that wait is the copy's, and
    # pinned memory with non_blocking=True removes it (pageable_memcpy), not keeping a value on the GPU
    g = v.gaps_of("sync")
    g = g[~copy_sync_gaps(t, g)] if len(g) else g
    if g.empty:
        return out
    own = np.zeros(len(t.runtime), dtype=bool)
    own[pageable_copy_syncs(t)] = True
    rt = t.runtime[name_mask(t.runtime["name"], among=SYNC_CALLS) & (t.runtime["step"] >= 0).to_numpy() & ~own]
    ev = _common(v, g)
    ev["sync_calls_per_step"] = round(len(rt) / v.n_steps, 1)
    ev["syncing_ops"] = {str(k): int(n) for k, n in _syncing_ops(v, rt).head(6).items()}
    ev["sync_apis"] = {str(k): int(n) for k, n in rt["name"].astype(object).value_counts().items()}
    sites = pd.Series(python_frames(t, rt["tid"].to_numpy(), rt["ts"].to_numpy()), dtype=object).value_counts()
    ev["call_sites"] = {str(k): int(n) for k, n in sites.head(6).items()}  # with_stack traces only
    top = next(iter(ev["syncing_ops"]), "a synchronising call")
    if ev["call_sites"]:
        top = f"{top} at {next(iter(ev['call_sites']))}"
    out.append(Candidate(
        id="GP-SYNC-001", category="host_sync",
        title=f"{_per_step(len(rt), v.n_steps)} ({top}) drain{'s' if len(rt) == 1 else ''} the GPU queue",
        confidence=v.host_confidence("high"),
        recommendation=f"Remove the per-step synchronisation ({top}): keep values on the GPU (accumulate "
                       "metrics as tensors and call `.item()` once every N steps), avoid data-dependent "
                       "shapes (`nonzero`, boolean indexing) in the step, and drop explicit "
                       "`torch.cuda.synchronize()`."
                       + ("" if ev["call_sites"] else " With `with_stack=True` the trace names the call site."),
        units=gap_units(v.rank, g, g["real_dur"]), evidence=ev))
    return out


def _per_step(n: int, steps: int) -> str:
    """'76 host syncs per step', or '1 host sync in 3 steps' where a sync is rarer than one per step
    (a value read every N steps: '0 per step' would contradict the finding)."""
    if n >= steps:
        return f"{n / steps:.0f} host syncs per step"
    return f"{n} host sync{'s' if n > 1 else ''} in {steps} steps"


def launch_overhead(v: RankView) -> list[Candidate]:
    out: list[Candidate] = []
    captures = graph_capture_calls(v.trace)
    k = v.kernels
    if captures:
        # Capture and warm-up run every kernel eagerly (and slowly) once: the gaps say nothing
        # about the replayed steady state, so no saving is claimed from them.
        out.append(Candidate(
            id="GP-LAUNCH-002", category="launch_overhead",
            title=f"The trace records CUDA-graph capture ({captures} capture calls), not steady-state steps",
            confidence="high",
            recommendation="Profile after capture and warm-up: start the profiler's schedule (`wait=`, "
                           "`warmup=`) past the graph capture so the trace holds replayed steps; launch "
                           "overhead measured during capture does not apply to graph replay.",
            units={}, evidence={"rank": v.rank, "graph_capture_calls": captures}, informational=True))
        return out
    g = v.gaps_of("launch")
    if g.empty:
        return out
    graphed = in_graph(k)
    share = float(graphed.mean()) if len(k) else 0.0
    ev = _common(v, g)
    ev["kernels_per_step"] = round(len(k) / v.n_steps, 1)
    ev["median_kernel_us"] = round(float(k["dur"].median()), 2) if len(k) else None
    ev["kernels_in_graph_replay_pct"] = round(100 * share, 1)
    if share >= 0.5:
        # The step already replays as a graph: what is left is host time between replays.
        ev["estimate"] = "idle gaps where the next work was launched after the GPU ran dry, between graph replays"
        title = (f"The host falls behind between CUDA-graph replays: {ms(g['dur'].sum()) / v.n_steps:.1f} ms idle "
                 f"per step ({100 * share:.0f}% of kernels already run as graph replay)")
        fix = ("The step already runs as CUDA-graph replay, so graphs will not help further: cut the host work "
               "between replays (input preparation, sampling, scheduling), overlap it with the GPU (prepare "
               "step N+1 while step N replays), or capture larger pieces per replay.")
    else:
        ev["estimate"] = "idle gaps where the next kernel was launched after the GPU ran dry; CUDA graphs " \
                         "would remove them (upper bound: graphs keep ~1 us between kernels)"
        title = (f"The host launches too slowly: {ev['kernels_per_step']:.0f} kernels per step of median "
                 f"{ev['median_kernel_us']} µs leave the GPU idle between launches")
        fix = ("Cut launches: capture the step in a CUDA graph (`torch.compile(model, "
               "mode='reduce-overhead')` or `torch.cuda.graphs`), fuse small ops with "
               "`torch.compile`, use fused optimizers, or give each kernel more work (larger batch).")
    units = gap_units(v.rank, g, g["real_dur"])
    # Launch-bound: the host's launch cost per kernel (its runtime calls and the Python and
    # dispatch between them), not the GPU, sets the step. The saving is the replay of the
    # step with that host work gone from the launch gaps (gpuprof.replay.fixes).
    idle_real = max(0.0, v.unprofiled_or_traced_step_us - v.busy_us)
    launch_real = float(g["real_dur"].sum()) / v.n_steps
    bound = share < 0.5 and v.busy_us < 0.5 * v.unprofiled_or_traced_step_us and launch_real >= 0.5 * idle_real
    # Requests served one at a time, or decode recomputing its prefix: batching them (a KV cache)
    # is the first fix and removes most launches itself; graphs then claim only what it leaves.
    # (both rules read forward-only traces with a GPU spec: elsewhere neither fires, so nothing to defer to)
    from gpuprof.analyzers.inference import request_repeats, token_passes

    first_fix = (bound and v.spec is not None and forward_only(v.trace)
                 and (not token_passes(v).empty or not request_repeats(v).empty))
    if first_fix:
        bound = False
        ev["first_fix"] = "batching or a KV cache (GP-BATCH-001, GP-KV-001): CUDA graphs claim what it leaves"
    if bound:
        ev["host_us_per_kernel"] = round(v.unprofiled_or_traced_step_us / max(ev["kernels_per_step"], 1), 2)
        ev["gpu_busy_ms_per_step"] = round(ms(v.busy_us), 3)
        ev["estimate"] = "launch-bound: a CUDA graph replays the step at the GPU's own time"
    decode = _decode_tokens(v)
    if bound and decode is not None:
        busy_pct = 100 * v.busy_us / v.unprofiled_or_traced_step_us
        title = (f"Decode is bound by the host: the GPU is busy {busy_pct:.0f}% of the "
                 f"step; {ev['kernels_per_step']:.0f} tiny kernels per step (median {ev['median_kernel_us']} µs, "
                 f"{decode} row(s) per GEMM) wait for the Python generate loop to launch them")
        fix = ("Take the host out of the decode loop: use a static KV cache and compile the decode step with "
               "CUDA graphs (`model.generation_config.cache_implementation = 'static'` with "
               "`torch.compile(model.forward, mode='reduce-overhead')`, or `torch.cuda.graphs`), or serve with "
               "an engine that replays graphs (vLLM, SGLang, TensorRT-LLM); batch more sequences per step, "
               "which costs the GPU almost nothing while the host bounds it.")
        ev["rows_per_gemm"] = decode
    out.append(Candidate(
        id="GP-LAUNCH-001", category="launch_overhead", title=title,
        confidence=v.host_confidence("medium"), recommendation=fix,
        units=units, evidence=ev, generic=not bound))
    return out


def _decode_tokens(v: RankView) -> int | None:
    """Rows per GEMM of an inference trace that decodes a few tokens at a time (no backward, most
    GEMM time on ``GEMV_ROWS`` rows or fewer), else None."""
    from gpuprof.analyzers.transfers import decode_gemvs

    gemv, rows = decode_gemvs(v)
    return int(rows) if gemv is not None else None
