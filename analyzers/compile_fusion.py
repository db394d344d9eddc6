"""compile_fusion: what ``torch.compile`` (Inductor) would realise on an eager program: the runs of
memory-bound kernels it fuses between GEMMs, attention and convolutions (norms incl. RMSNorm as
pow/mean/rsqrt/mul, rotary mul/neg/cat/add, gated and plain activations, residual adds, dtype casts,
dropout, softmax, cross-entropy, pooling; forward and backward), and the host work of every
launch it removes. Eager programs of small kernels are bound by their host (an eager HF Llama
step: 36 ms for 18 ms of GPU work), so the launches Inductor removes are most of what it saves.

Trigger: an eager trace (no Inductor ``triton_*`` kernels, no ``CompiledFunction`` /
``Torch-Compiled Region`` spans, no CUDA-graph capture) with runs of two or more consecutive
fusible kernels on one stream inside one step, outside the optimizer (``torch.compile(model)``
does not compile ``optimizer.step()``) and outside CUDA-graph replays.

What Inductor makes of a run, as modelled (checked against the compiled twins'
kernels in sample_traces/h200):

* one kernel per iteration space: kernels over the same number of elements fuse (the op's largest
  input sets it), so a weight's cast beside an activation's norm stays its own kernel;
* a reduction into few outputs over a long extent (bias and norm-weight gradients, batch-norm
  statistics: ``SPLIT_MIN_EXTENT``) runs as a partial pass plus one final pass per output
  (Inductor's split reductions), so those add kernels.

The fix is a replay transformation (gpuprof.replay.fixes, ``REGROUPING``; its replayed saving is
the estimate, with the host floor and bounds every replayed fix gets):

* GPU: each group becomes one kernel that moves the bytes of its largest member at the roofline
  efficiency the run's kernels reach (time-weighted), where its first member ran; a split pass
  takes the place of a kernel that would go and runs as long as the trace's median small fusible
  kernel (:func:`inductor_plan`);
* host: the kernels that go leave the host chain with their launches and the host work before
  each, and the rest of the steps' host work outside the optimizer shrinks to the eager step's
  host cost per launched kernel times the kernels kept (on the real H200 pairs compiled code
  launched at 0.91-1.09x the eager cost per kernel: the Python and the ops that launch no kernel
  go with the graph). Launches alone priced llama_bf16 at 13.5 ms of the realised 23.4
  (docs/replay.md).

The finding claims after the specific fusions (``priority_ms`` 0); a pair realises compile
applied alone, which the replay prices on all its units (``estimated_saving_alone_ms``). Where
syncs idle the GPU for a tenth of the step or more (``SYNC_SHARE``) host and GPU take turns and the
estimate is low confidence.
"""

from __future__ import annotations

import json
import re
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from gpuprof.claims import Candidate, Unit
from gpuprof.rank import RankView
from gpuprof.idle import graph_capture_calls, in_graph, name_mask
from gpuprof.analyzers._base import ms, shape_codes, top_names


FUSIBLE = ("elementwise", "norm", "reduction", "softmax", "loss", "copy", "embedding")
#: Ops Inductor fuses whose kernels the roofline leaves without a family (pooling, index
#: arithmetic, in-place counters such as batch norm's ``num_batches_tracked += 1``, the random
#: masks of dropout and stochastic depth, which Inductor draws inside the fused kernel).
FUSIBLE_OPS = (r"pool|aten::arange|aten::add_$|aten::fill_$|aten::zero_$|aten::dropout|aten::native_dropout"
               r"|aten::bernoulli")
#: A trace that already ran Inductor code: its kernels or its dispatch spans say so.
COMPILED_KERNELS = r"^triton_"
COMPILED_SPANS = r"CompiledFunction|Torch-Compiled Region|CompiledFxGraph|TorchDynamo"
#: Reductions over at least this many elements into few outputs are split by Inductor into a
#: partial and a final pass (the compiled twins show it from 3,136 elements per output on).
SPLIT_MIN_EXTENT = 1024
#: Ops whose reduced outputs are per channel or per feature (few outputs, long extent), with how
#: many such outputs each has: batch-norm statistics (mean, var) and gradients (weight, bias).
_PER_CHANNEL = {r"batch_norm": 2, r"group_norm_backward": 2}
_REDUCE_OPS = ("aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::var", "aten::var_mean", "aten::std")
MIN_RUN = 2
#: Idle after host syncs above this share of the step: host and GPU take turns, and when the host
#: gets ahead again after each depends on the profiled host's timing: the estimate is low confidence.
SYNC_SHARE = 0.1


def already_compiled(v: RankView) -> bool:
    """True when the trace already ran Inductor-generated code (its kernels or its spans)."""
    if bool(name_mask(v.kernels["name"], COMPILED_KERNELS).any()):
        return True
    t = v.trace
    for frame in (t.ops, t.annotations):
        if len(frame) and bool(name_mask(frame["name"], COMPILED_SPANS).any()):
            return True
    return False


def _numel(dims: object) -> int:
    """Elements of an op's largest input tensor: Inductor fuses pointwise work over one iteration
    space, so a run's kernels over the same number of elements become one kernel."""
    best = 0
    for d in dims if isinstance(dims, list) else []:
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            best = max(best, int(np.prod(np.asarray(d, dtype=np.float64))))
    return best


def split_passes(name: str, dims: Any, concrete: Any) -> int:
    """Kernels Inductor adds for one op's reductions into few outputs (a final pass per output):
    0 for pointwise ops and for reductions along the last dimension (norms over features, softmax)."""
    first = dims[0] if isinstance(dims, list) and dims and isinstance(dims[0], list) else []
    if not first or not all(isinstance(x, int) for x in first):
        return 0
    for pat, outs in _PER_CHANNEL.items():
        # batch norm in eval mode (training=False) normalises with its running statistics
        if re.search(pat, name) and ("backward" in name or "True" in str(concrete)):
            extent = int(np.prod(first)) // max(int(first[1]) if len(first) > 1 else 1, 1)
            return outs if extent >= SPLIT_MIN_EXTENT else 0
    if "layer_norm_backward" in name:
        mask = str(concrete[-1]) if isinstance(concrete, list) and concrete else ""
        # one final pass per parameter gradient asked for (weight, bias); the input gradient is a
        # reduction along the features, fused into the pointwise kernel
        return max(0, mask.count("True") - 1) if int(np.prod(first[:-1])) >= SPLIT_MIN_EXTENT else 0
    if name in _REDUCE_OPS:
        raw = concrete[1] if isinstance(concrete, list) and len(concrete) > 1 else ""
        try:
            red = json.loads(raw) if raw else None
        except (TypeError, ValueError):
            red = None
        nd = len(first)
        dims_r = [int(x) % nd for x in (red if isinstance(red, list) else [red])] if red is not None else \
            list(range(nd))
        if nd - 1 in dims_r and len(dims_r) < nd:  # along the last dimension: one pass per row
            return 0
        return 1 if int(np.prod([first[i] for i in dims_r])) >= SPLIT_MIN_EXTENT else 0
    return 0


def _str_codes(values: np.ndarray) -> tuple[np.ndarray, int]:
    """A code per value, equal where ``str`` of the values is (each distinct value converted once),
    and how many codes there are."""
    codes, uniq = pd.factorize(values, use_na_sentinel=False)
    same, text = pd.factorize(np.array([str(u) for u in uniq], dtype=object))
    return same[codes], max(len(text), 1)


def _split_kernels(ops: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """``split_passes`` of each distinct op row in ``rows``, computed once per distinct (name,
    dims, concrete inputs): a step repeats the same ops thousands of times."""
    from gpuprof.trace.load import parse_arg

    r = np.unique(rows[(rows >= 0) & (rows < len(ops))])
    if not len(r):
        return np.zeros(0)
    # the rows' columns alone: a row selection of the whole frame would copy its wide object columns
    name, dims, concrete = (ops[c].iloc[r].astype(object).to_numpy() for c in ("name", "input_dims", "concrete_inputs"))
    key = np.zeros(len(r), dtype=np.int64)
    for col in (name, dims, concrete):  # the three read as text, as one key
        c, n = _str_codes(col)
        key = key * n + c
    codes, _ = pd.factorize(key)
    first = np.unique(codes, return_index=True)[1]
    per = np.array([split_passes(str(name[i]), parse_arg(dims[i]), parse_arg(concrete[i])) for i in first],
                   dtype=np.float64)
    return per[codes]


def _runs(v: RankView) -> pd.DataFrame:
    """The fusible kernels of one rank in runs (column ``run``) of ``MIN_RUN`` or more, with the
    iteration space of each (``numel``) and the roofline time used for fusion (``t_fuse_us``)."""
    k = v.in_stream_order(("device", "stream", "ts", "step", "op", "op_name", "family", "bound", "dur", "t_roof_us",
                           "model_error", "issue_bound", "is_comm", "in_graph", "launch_api"))
    if k.empty:
        none: pd.DataFrame = k.assign(run=pd.Series(dtype=np.int64), numel=pd.Series(dtype=np.float64),
                                      t_fuse_us=pd.Series(dtype=np.float64))
        return none
    err = k["model_error"].to_numpy(dtype=bool)
    t_roof = k["t_roof_us"].to_numpy(dtype=float)
    # above its HBM roofline (data in L2) or without bytes: it runs at its own time once fused
    t_fuse = np.where(err | ~np.isfinite(t_roof), k["dur"].to_numpy(dtype=float), t_roof)
    fam = k["family"].astype(str)
    by_op = name_mask(k["op_name"], FUSIBLE_OPS) & ~fam.isin(["gemm", "conv", "attention", "layout"]).to_numpy()
    # issue-bound scalar-path elementwise kernels (roofline's issue_bound: compute-bound on their
    # index arithmetic) fuse like the rest: Inductor's kernel drops those loads, stores and indexing
    issue = k["issue_bound"].to_numpy(dtype=bool) if "issue_bound" in k else np.zeros(len(k), dtype=bool)
    ok = ((fam.isin(FUSIBLE).to_numpy() | by_op) & (~k["bound"].isin(["compute"]).to_numpy() | issue)
          & ~k["is_comm"].fillna(False).to_numpy(dtype=bool) & ~in_graph(k)
          & ~_outside_model(v).reindex(k.index).to_numpy())
    lane = (k["device"].astype(np.int64) * 100_003 + k["stream"] * 101 + k["step"]).to_numpy()
    brk = np.r_[True, (~ok[1:]) | (~ok[:-1]) | (lane[1:] != lane[:-1])]
    run = np.where(ok, np.cumsum(brk), -1)
    kk = k.assign(run=run, t_fuse_us=t_fuse)[ok]
    kk = kk[kk.groupby("run")["dur"].transform("size").to_numpy() >= MIN_RUN]
    codes, numels = shape_codes(v.trace.ops, kk["op"].to_numpy(), _numel)
    el = np.array([*numels, 0], dtype=np.float64)[codes]
    # a kernel without an op is its own iteration space
    el = np.where(codes < 0, -1.0 - np.arange(len(kk)), el)
    out: pd.DataFrame = kk.assign(numel=el)
    return out


def _host_gap_units(v: RankView, share: float) -> dict[Unit, float]:
    """The launch gaps of the steps outside the optimizer, each at ``share`` of its real length:
    the host work the compiled model no longer does (its host chain shrinks by the share of
    launches that go, gpuprof.replay.fixes), claimed so that no later finding counts it again."""
    g = v.gaps
    if g.empty or share <= 0:
        return {}
    opt = _outside_model(v)
    nxt = g["next_row"].to_numpy()
    in_opt = (g["next_kind"] == "kernel").to_numpy() & opt.reindex(nxt).fillna(False).to_numpy(dtype=bool)
    m = (g["cause"].isin(["launch", "other"]).to_numpy() & (g["step"] >= 0).to_numpy() & ~in_opt
         & (g["real_dur"] > 0).to_numpy())
    sel = g[m]
    return dict(zip(zip(repeat("gap"), repeat(v.rank), sel.index.tolist()), (sel["real_dur"] * share).tolist()))


def _outside_model(v: RankView) -> pd.Series:
    """Kernels launched by the optimizer (its own work in ``Optimizer.step#``/``zero_grad#``
    spans, :func:`gpuprof.idle.optimizer_spans`) or by a per-parameter update loop no optimizer
    annotated (:func:`gpuprof.hostops.update_loops`): ``torch.compile(model)`` leaves them as they are."""
    spans = v.optimizer_spans(zero_grad=True)
    k = v.kernels
    loop = v.in_update_loop()  # an unannotated per-parameter update loop stays eager as well
    if spans.empty:
        return loop
    st, en = spans["ts"].to_numpy(), spans["end"].to_numpy()
    i = np.searchsorted(st, k["launch_ts"].to_numpy(), side="right") - 1
    inside = (i >= 0) & (k["launch_ts"].to_numpy() < en[np.maximum(i, 0)])
    return pd.Series(inside, index=k.index) | loop


def inductor_plan(v: RankView) -> pd.DataFrame:
    """What Inductor makes of the rank's fusible runs, per kernel (indexed by kernel row, in
    stream order): ``run``; ``group``, the kernel it fuses into (one per iteration space in its
    run, -1 for a kernel that stays a kernel: a group of one, or a slot for a split-reduction
    pass); ``after_us``, its share of the fused kernel's time (the group's time spread over its
    members by duration; a slot's time is the pass's, a group of one keeps its own); and
    ``first``, whether it is the kernel its group's fused kernel takes the place of. The fix's
    replay (gpuprof.replay.fixes) runs each group as one kernel of its members' ``after_us``,
    drops the other members' launches and the host work before them, and keeps the slots'."""
    kk = _runs(v)
    cols = {"run": np.int64, "group": np.int64, "after_us": np.float64, "first": bool, "numel": np.float64,
            "dur": np.float64}
    if kk.empty:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in cols.items()})
    dur = kk["dur"].to_numpy(dtype=float)
    g = kk.groupby(["run", "numel"], sort=False)
    group = g.ngroup().to_numpy()
    size = np.bincount(group)[group]
    run_g = kk.groupby("run")
    eff = (run_g["t_fuse_us"].transform("sum") / run_g["dur"].transform("sum")).clip(1e-3, 1.0).to_numpy()
    fused = g["t_fuse_us"].transform("max").to_numpy() / eff
    first = ~pd.Series(group).duplicated().to_numpy()
    # Inductor's split reductions add a final pass per output of a long reduction: each op's
    # passes (counted once per op) take the place of the run's last kernels that would go, which
    # keep their launch and run as long as a small fusible kernel of this trace (the graph has no
    # primitive that adds a kernel: passes beyond the run's kernels that go are not modelled)
    passes = _split_kernels(v.trace.ops, kk["op"].to_numpy())
    op = kk["op"].to_numpy()
    uniq = np.unique(op[(op >= 0) & (op < len(v.trace.ops))])
    per_op = pd.Series(passes, index=uniq) if len(uniq) else pd.Series(dtype=np.float64)
    once = (op >= 0) & ~pd.Series(op).duplicated().to_numpy()
    extra = np.where(once, per_op.reindex(op).fillna(0.0).to_numpy(), 0.0)
    run = kk["run"].to_numpy()
    want = pd.Series(extra).groupby(run).transform("sum").to_numpy()
    goes = (size > 1) & ~first
    # rank of each kernel that would go among its run's, counted from the run's end
    from_end = pd.Series(goes[::-1].astype(np.int64)).groupby(run[::-1]).cumsum().to_numpy()[::-1]
    slot = goes & (from_end <= want)
    small = kk.loc[kk["bound"].astype(str) == "latency", "dur"]
    small_us = float(small.median()) if len(small) else float(kk["dur"].min())
    member = (size > 1) & ~slot
    member_dur = pd.Series(np.where(member, dur, 0.0)).groupby(group).transform("sum").to_numpy()
    after = np.where(member, fused * dur / np.maximum(member_dur, 1e-9), np.where(slot, small_us, dur))
    out = pd.DataFrame({"run": run, "group": np.where(member, group, -1), "after_us": after, "first": first & member,
                        "numel": kk["numel"].to_numpy(dtype=float), "dur": dur}, index=kk.index)
    return out


def run(v: RankView) -> list[Candidate]:
    out: list[Candidate] = []
    # a trace that records graph capture is not a steady state: its host time is capture's
    if v.kernels.empty or already_compiled(v) or graph_capture_calls(v.trace):
        return out
    plan = inductor_plan(v)
    if plan.empty:
        return out
    kk = v.kernels.loc[plan.index]
    n = v.n_steps
    member = (plan["group"] >= 0).to_numpy()
    slot = (plan["group"] < 0).to_numpy() & (plan["after_us"] != plan["dur"]).to_numpy()
    goes = member & ~plan["first"].to_numpy()
    touched = member | slot
    dur, after = plan["dur"].to_numpy(), plan["after_us"].to_numpy()
    removed = float(goes.sum()) / n
    kernels = float((~in_graph(v.kernels)).sum()) / n
    gpu_us = float((dur - after)[touched].sum()) / n
    if gpu_us <= 0 and removed <= 0:
        return out
    # the fix's units: every kernel it changes (0 µs where the GPU gains nothing: the
    # kernel still changes, its launch goes) and the launch gaps before the kernels that go;
    # the replay of the Inductor kernels (gpuprof.replay.fixes) is the estimate
    rows = plan.index[touched]
    units: dict[Unit, float] = dict(zip(zip(repeat("k"), repeat(v.rank), rows.tolist()),
                                        np.maximum(dur - after, 0.0)[touched].tolist()))
    units.update(_host_gap_units(v, 1.0 - (kernels - removed) / kernels if kernels else 0.0))
    n_runs = plan["run"].nunique() / n
    gaps = v.gaps
    sync_idle = float(gaps.loc[(gaps["cause"] == "sync").to_numpy(), "real_dur"].sum()) / n if len(gaps) else 0.0
    out.append(Candidate(
        id="GP-COMPILE-001", category="compile",
        title=f"torch.compile would fuse {n_runs:.0f} kernel runs per step and remove {removed:.0f} of "
              f"{kernels:.0f} kernel launches, with the host work before each",
        # syncs serialise host and GPU: what the launches removed save depends on when the
        # host gets ahead again, which the profiled host's timing decides
        confidence="low" if sync_idle >= SYNC_SHARE * v.unprofiled_or_traced_step_us else v.host_confidence("medium"),
        recommendation="Compile the model: `model = torch.compile(model)` (train step unchanged; the optimizer "
                       "stays eager, `AdamW(fused=True)` covers it). Inductor fuses norms, activations, residual "
                       "adds, casts, rotary, dropout and the loss into a few kernels and removes their launches "
                       "and Python dispatch. Warm up before timing (the first steps compile), check "
                       "`TORCH_LOGS=graph_breaks` for breaks, and keep shapes static (or `dynamic=False`).",
        units=units, regroup=plan,
        priority_ms=0.0,  # claims after the specific fusions: its saving alone is priced on all its units
        evidence={
            "rank": v.rank, "runs_per_step": round(n_runs, 1),
            "fusible_kernels_per_step": round(len(plan) / n, 1),
            "kernels_per_step": round(kernels, 1), "kernels_after_per_step": round(kernels - removed, 1),
            "split_reduction_kernels_per_step": round(float(slot.sum()) / n, 1),
            "fusible_ms_per_step": round(ms(float(dur.sum())) / n, 3),
            "gpu_ms_saved_per_step": round(ms(gpu_us), 3),
            "sync_idle_ms_per_step": round(ms(sync_idle), 3),
            "ops": kk["op_name"].astype(str).value_counts().head(8).to_dict(), "kernels": top_names(kk),
            "estimate": "Inductor's kernels per run: one per iteration space, plus a pass per output of a "
                        "split reduction (in place of kernels that would go); a fused kernel moves its largest "
                        "member's bytes at the run's achieved roofline efficiency; the launches of the kernels "
                        "that go and the host work before each leave the host chain",
        },
    ))
    return out
