"""kv_cache and batching: inference that repeats work a KV cache or a batch would not.

kv_cache (``GP-KV-001``) — Why it is bad: a decoder that makes each new token by running the model
over the whole sequence so far (``model(ids)`` in a loop, ``use_cache=False``, no
``past_key_values``) recomputes the keys, values and activations of the whole prefix at every
token: the work per token grows with the sequence, where a cached pass runs over one token and
reads the prefix's keys and values from memory.
Trigger: an inference trace (no backward, no optimizer) whose steps each run at least
``KV_MIN_PASSES`` forward passes whose token input grows by exactly one token per pass: the
token embedding's ids are ``[B, L]``, ``[B, L+1]``, ... (a cached pass takes ``[B, 1]``). The
sequence length shows in the attention and GEMM shapes of each pass as well.
Estimate: every pass after the first (the first is the prefill, which a cache runs too) at the
cached pass's shapes, on the roofline: each op's input dims with the pass's sequence length L (or
B·L, where a GEMM flattens batch and sequence) replaced by one token, the attention's keys and
values kept at L (the cache holds them), priced by the cost model (the ratio of its FLOPs and bytes
at the new shapes to the traced ones, applied to each kernel's share); a kernel the cost model does
not know takes 1/L of its time. No kernel is priced below ``KV_FLOOR_QUANTILE`` of the trace's own
kernel durations (a kernel over a few rows runs as long as the shortest kernels this GPU ran
here). The host keeps its cost per pass (the cached pass launches the same kernels, and a cache
adds its own writes), so where a pass becomes host-bound it saves only its GPU time above its
host's: the replay prices the new kernel times with the host as traced.
Fix: keep a KV cache.

batching (``GP-BATCH-001``) — Why it is bad: serving requests one at a time at batch 1 runs the
whole model once per request: every kernel is launched R times over tiny shapes that leave the
GPU idle between launches, where one forward over the R requests launches each kernel once with R
times the work (weights read once).
Trigger: an inference trace whose steps each run one kernel sequence ``R >= 2`` times back to back
(at least ``BATCH_MIN_KERNELS`` kernels per repeat, the same kernel names in each, together at
least ``BATCH_MIN_COVERAGE`` of the step's kernels), each repeat starting at the same op with the
same input dims, its ops at batch 1 (the leading dim of their first input), and its shapes not
growing by one token per repeat (that is decode, where each token needs the last: no batch of
requests). Where most kernels already replay as CUDA graphs it is not raised.
Estimate: the R repeats as one forward at batch R: each kernel position of a repeat becomes one
kernel at the batched shape on the roofline, R times its batch-1 roofline time (an upper bound:
the weights are read once), never shorter than its batch-1 run (a batch does not run faster than
one request); launched once: the host keeps its cost per launched kernel, so the host work of the
R - 1 other repeats goes with their launches (the replay's regrouping, as for ``compile``).
Fix: batch the requests, then capture the batched forward in a CUDA graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpuprof.analyzers._base import ms, top_names
from gpuprof.claims import Candidate
from gpuprof.costmodel import cost_of
from gpuprof.idle import forward_only, in_graph, name_mask
from gpuprof.trace.load import parse_arg

if TYPE_CHECKING:
    from gpuprof.rank import RankView

#: Passes of one step with the token input one longer each time, before it is decoding without a
#: cache (three: two could be a prompt and its continuation).
KV_MIN_PASSES = 3
#: The quantile of the trace's kernel durations below which no cached-pass kernel is priced.
KV_FLOOR_QUANTILE = 0.05
#: Ops whose later inputs are the keys and values a cache keeps (only the query shrinks).
_ATTENTION = r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention|_attention"
_MATMULS = frozenset({"aten::matmul", "aten::bmm", "aten::baddbmm", "aten::mm", "aten::einsum"})

#: A repeat of fewer kernels than this is a layer or a loop body, not a model's forward pass.
BATCH_MIN_KERNELS = 16
#: The repeats hold at least this share of the step's kernels (the rest: the step's own set-up).
BATCH_MIN_COVERAGE = 0.8
#: How many of a step's first kernels are tried as the start of the first repeat.
_ANCHORS = 8


def _inference(v: RankView) -> bool:
    """No backward and no optimizer in the trace: a forward-only program."""
    return forward_only(v.trace)


def _dims(ops: pd.DataFrame, rows: np.ndarray) -> list[Any]:
    col = ops["input_dims"].to_numpy()
    return [parse_arg(col[r]) if r >= 0 else None for r in rows]


# --- kv_cache ------------------------------------------------------------------------------------

def token_passes(v: RankView) -> pd.DataFrame:
    """:func:`_token_passes` of the view, found once (launch_overhead asks too; read-only)."""
    out: pd.DataFrame = v.shared("token_passes", lambda: _token_passes(v))
    return out


def _token_passes(v: RankView) -> pd.DataFrame:
    """The forward passes of each step whose token input grows by one token per pass: one row per
    pass (``step``, ``index`` in its step, ``start`` and ``end`` on the host, ``length`` L and
    ``batch`` B of its ids, ``op``: the embedding's row), for the steps that have at least
    ``KV_MIN_PASSES`` of them in a row; empty where none does."""
    cols = ["step", "index", "start", "end", "length", "batch", "op"]
    ops = v.trace.ops
    emb = np.flatnonzero(name_mask(ops["name"], among=("aten::embedding",)) & (ops["step"] >= 0).to_numpy())
    if not len(emb) or "input_dims" not in ops.columns:
        return pd.DataFrame(columns=cols)
    dims = _dims(ops, emb)
    ok = [isinstance(d, list) and len(d) >= 2 and isinstance(d[0], list) and isinstance(d[1], list)
          and len(d[1]) == 2 for d in dims]
    emb = emb[np.array(ok, dtype=bool)]
    dims = [d for d, o in zip(dims, ok) if o]
    if not len(emb):
        return pd.DataFrame(columns=cols)
    # the token table: the embedding with the largest weight (GPT-2 also embeds positions)
    table = max({str(d[0]) for d in dims}, key=lambda s: int(np.prod(parse_arg(s) or [0])))
    keep = np.array([str(d[0]) == table for d in dims], dtype=bool)
    emb, dims = emb[keep], [d for d, k in zip(dims, keep) if k]
    steps = v.steps.sort_values("cpu_start", kind="stable")
    nxt = dict(zip(steps["step"].to_numpy()[:-1], steps["cpu_start"].to_numpy(dtype=float)[1:]))
    out = []
    frame = pd.DataFrame({"row": emb, "ts": ops["ts"].to_numpy(dtype=float)[emb],
                          "step": ops["step"].to_numpy()[emb], "batch": [int(d[1][0]) for d in dims],
                          "length": [int(d[1][1]) for d in dims]}).sort_values("ts", kind="stable")
    for step, f in frame.groupby("step", sort=True):  # steps are few
        grow = np.r_[False, np.diff(f["length"].to_numpy()) == 1]
        # the longest run of passes each one token longer than the last
        best, run_start = (0, 0), 0
        for i in range(1, len(f) + 1):
            if i == len(f) or not grow[i]:
                if i - run_start > best[1] - best[0]:
                    best = (run_start, i)
                run_start = i
        a, b = best
        if b - a < KV_MIN_PASSES:
            continue
        sub = f.iloc[a:b]
        ends = np.r_[sub["ts"].to_numpy()[1:], nxt.get(step, np.inf)]
        for j, (r, ts, bt, ln, e) in enumerate(zip(sub["row"], sub["ts"], sub["batch"], sub["length"], ends)):
            out.append((step, j, ts, e, ln, bt, r))
    return pd.DataFrame(out, columns=cols)


def _cached_dims(name: str, dims: Any, length: int, batch: int) -> Any:
    """``dims`` of one op of a pass over ``length`` tokens as a cached pass over one token would
    have them: the first dim equal to the length (or batch × length, flattened) in each input
    becomes one token; an attention keeps its keys and values (inputs after the query), and a
    matmul of two sequence-long operands (scores, attention × values) keeps the second."""
    if not isinstance(dims, list):
        return dims
    flat = batch * length

    def has(d: Any) -> bool:
        return isinstance(d, list) and any(x in (length, flat) for x in d if isinstance(x, int))

    attention = bool(pd.Series([name]).str.contains(_ATTENTION, regex=True).iat[0])
    with_seq = [i for i, d in enumerate(dims) if has(d)]
    only = with_seq[:1] if attention or (name in _MATMULS and len(with_seq) >= 2) else with_seq
    out = []
    for i, d in enumerate(dims):
        if i in only:
            d = list(d)
            j = next(j for j, x in enumerate(d) if x in (length, flat))
            d[j] = 1 if d[j] == length else batch
        out.append(d)
    return out


def _cached_ratios(v: RankView, rows: np.ndarray, lengths: np.ndarray, batches: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per op row (with its pass's length and batch), the ratio of its FLOPs and of its bytes at
    the cached pass's shapes to the traced ones; NaN where the cost model has no rule."""
    ops = v.trace.ops
    rf, rb = np.full(len(rows), np.nan), np.full(len(rows), np.nan)
    memo: dict[tuple[Any, ...], tuple[float, float]] = {}
    cols = [ops[c].to_numpy() for c in ("name", "input_dims", "input_types", "concrete_inputs", "input_strides")]
    for i, (r, ln, bt) in enumerate(zip(rows, lengths, batches)):  # once per distinct signature below
        if r < 0:
            continue
        key = (cols[0][r], cols[1][r], cols[2][r], cols[3][r], cols[4][r], ln, bt)
        if key not in memo:
            name = str(cols[0][r])
            dims, types = parse_arg(cols[1][r]), parse_arg(cols[2][r])
            conc, strd = parse_arg(cols[3][r]), parse_arg(cols[4][r])
            old = cost_of(name, dims, types, conc, strd)
            new = cost_of(name, _cached_dims(name, dims, int(ln), int(bt)), types, conc, None)
            if old is None or new is None or not old.bytes:
                memo[key] = (np.nan, np.nan)
            else:
                memo[key] = (new.flops / old.flops if old.flops else 0.0, new.bytes / old.bytes)
        rf[i], rb[i] = memo[key]
    return rf, rb


def kv_cache(v: RankView) -> list[Candidate]:
    out: list[Candidate] = []
    if v.spec is None or not _inference(v):
        return out
    passes = token_passes(v)
    if passes.empty:
        return out
    k = v.kernels
    lt = k["launch_ts"].to_numpy(dtype=float)
    which = np.full(len(k), -1, dtype=np.int64)
    for i, (s, e) in enumerate(zip(passes["start"].to_numpy(), passes["end"].to_numpy())):  # passes are few
        which[(lt >= s) & (lt < e)] = i
    later = (which >= 0) & (passes["index"].to_numpy()[np.maximum(which, 0)] > 0)
    kk = k[later]
    if kk.empty:
        return out
    p = passes.iloc[which[later]]
    lengths, batches = p["length"].to_numpy(), p["batch"].to_numpy()
    rf, rb = _cached_ratios(v, kk["op"].to_numpy(dtype=np.int64), lengths, batches)
    dur = kk["dur"].to_numpy(dtype=float)
    peak = kk["peak_tflops"].to_numpy(dtype=float)
    t_new = np.maximum(kk["flops"].to_numpy(dtype=float) * rf / (peak * 1e6),
                       kk["bytes"].to_numpy(dtype=float) * rb / (v.spec.hbm_gbps * 1e3))
    t_new = np.where(np.isfinite(t_new), t_new, dur / lengths)  # no cost model: time in proportion to tokens
    floor = float(np.quantile(k["dur"].to_numpy(dtype=float), KV_FLOOR_QUANTILE))
    after = np.minimum(dur, np.maximum(t_new, floor))
    n = v.n_steps
    per_step = passes.groupby("step").size()
    first_len = int(passes.loc[passes["index"] == 0, "length"].median())
    last_len = int(passes.groupby("step")["length"].max().median())
    batch = int(passes["batch"].median())
    gpu_passes = float(dur.sum()) / n
    out.append(Candidate(
        id="GP-KV-001", category="kv_cache",
        title=(f"Decoding without a KV cache: each of {per_step.median():.0f} forward passes per step runs over the "
               f"whole sequence ({first_len} to {last_len} tokens, batch {batch}), the prefix recomputed for every "
               f"new token ({ms(gpu_passes):.1f} ms of GPU work per step after the first pass)"),
        confidence="high",
        recommendation=("Keep a KV cache: call the model with `use_cache=True` and pass `past_key_values` back "
                        "with only the new token (`model(next_ids[:, None], past_key_values=past, use_cache=True)`, "
                        "or `model.generate(...)`, which does), so each token runs over one position against the "
                        "cached keys and values; a hand-written decoder keeps its own preallocated K/V tensors. "
                        "To capture decode in CUDA graphs or `torch.compile(mode='reduce-overhead')`, use a static "
                        "cache (`StaticCache`, `cache_implementation='static'`)."),
        units=v.kernel_units(kk.index, dur - after),
        evidence={
            "rank": v.rank, "passes_per_step": float(per_step.median()), "batch": batch,
            "tokens_first_pass": first_len, "tokens_last_pass": last_len,
            "seen": (f"the token embedding's ids grow by one token per pass ([{batch}, {first_len}], "
                     f"[{batch}, {first_len + 1}], ... [{batch}, {last_len}]): no cache is carried, every pass "
                     "recomputes the prefix"),
            "gpu_ms_per_step_passes_after_first": round(ms(gpu_passes), 3),
            "gpu_ms_per_step_cached": round(ms(float(after.sum())) / n, 3),
            "kernel_floor_us": round(floor, 2),
            "kernels": top_names(kk),
            "estimate": ("every pass after the first at the cached pass's shapes (one new token, the keys and "
                         "values read from the cache) on the roofline, no kernel below the trace's shortest; "
                         "the host keeps its cost per pass (replayed)"),
        }))
    return out


# --- batching ------------------------------------------------------------------------------------

def request_repeats(v: RankView) -> pd.DataFrame:
    """:func:`_request_repeats` of the view, found once (launch_overhead asks too; read-only)."""
    out: pd.DataFrame = v.shared("request_repeats", lambda: _request_repeats(v))
    return out


def _request_repeats(v: RankView) -> pd.DataFrame:
    """The per-request repeats of each step (see the module docstring): one row per kernel of a
    repeat, indexed by kernel row, with ``step``, ``repeat`` (0..R-1) and ``position`` in its
    repeat; empty where no step repeats one forward at batch 1."""
    cols = ["step", "repeat", "position"]
    k = v.kernels
    if k.empty or in_graph(k).mean() >= 0.5:
        return pd.DataFrame(columns=cols)
    ops = v.trace.ops
    name_code = pd.factorize(k["name"])[0]
    op = k["op"].to_numpy(dtype=np.int64)
    sig_col = _signatures(ops)
    sig = np.where(op >= 0, sig_col[np.maximum(op, 0)] if len(sig_col) else -1, -1)
    out: list[tuple[int, Any, int, int]] = []
    for step, kk in k.assign(_n=name_code, _s=sig).sort_values("launch_ts", kind="stable").groupby("step"):
        names, sigs, rows = kk["_n"].to_numpy(), kk["_s"].to_numpy(), kk.index.to_numpy()
        n = len(kk)
        found = _repeats(names, sigs, n)
        if found is None:
            continue
        start, period, reps = found
        block = rows[start:start + period * reps].reshape(reps, period)
        if not _batch_one(ops, op_of(k, block[0])) or _grows(ops, op_of(k, block[0]), op_of(k, block[1])):
            continue
        for r in range(reps):
            out.extend((int(x), step, r, j) for j, x in enumerate(block[r]))
    f = pd.DataFrame(out, columns=["row", *cols])
    return f.set_index("row") if len(f) else pd.DataFrame(columns=cols)


def _text_codes(col: pd.Series) -> np.ndarray:
    """A code per row, equal where the values read alike as text (``astype(str)``), -1 where missing:
    the distinct values converted, not the rows."""
    codes, uniq = pd.factorize(col)
    same_text = pd.factorize(pd.Index(uniq).astype(str))[0] if len(uniq) else np.zeros(0, np.int64)
    return np.where(codes >= 0, same_text[np.maximum(codes, 0)] if len(uniq) else -1, -1)


def _signatures(ops: pd.DataFrame) -> np.ndarray:
    """A code per op row, equal where the op's name and input dims are (``name|dims`` as text), -1
    where either is missing. Input dims are lists of numbers, never holding ``|``, so the pair is
    what that text tells apart."""
    if not len(ops):
        return np.zeros(0, np.int64)
    name, dims = _text_codes(ops["name"]), _text_codes(ops["input_dims"])
    out: np.ndarray = np.where((name >= 0) & (dims >= 0), name * (int(dims.max()) + 1) + dims, -1)
    return out


def op_of(k: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    out: np.ndarray = k.loc[rows, "op"].to_numpy(dtype=np.int64)
    return out


def _repeats(names: np.ndarray, sigs: np.ndarray, n: int) -> tuple[int, int, int] | None:
    """(start, kernels per repeat, repeats) of the step's kernels (``names``, op ``sigs`` in launch
    order): the first kernel of one of the step's first ``_ANCHORS`` kernels whose op signature
    recurs at equal spacing, each repeat the same kernel names, covering ``BATCH_MIN_COVERAGE``."""
    for a in range(min(_ANCHORS, n)):
        if sigs[a] < 0:
            continue
        pos = np.flatnonzero((sigs == sigs[a]) & (names == names[a]))
        pos = pos[pos >= a]
        if len(pos) < 2:
            continue
        period = int(pos[1] - pos[0])
        # consecutive occurrences at one spacing from the anchor on
        d = np.diff(pos)
        reps = 1 + int(np.argmin(np.r_[d == period, False]))
        if reps < 2 or period < BATCH_MIN_KERNELS or a + period * reps > n:
            continue
        blocks = names[a:a + period * reps].reshape(reps, period)
        if not (blocks == blocks[0]).all():
            continue
        if period * reps >= BATCH_MIN_COVERAGE * n:
            return a, period, reps
    return None


def _batch_one(ops: pd.DataFrame, rows: np.ndarray) -> bool:
    """Whether most of a repeat's ops whose first input is a tensor of three or more dims have a
    leading dim of 1 (one request; a GEMM that flattens batch and tokens shows two dims)."""
    lead = []
    for d in _dims(ops, np.unique(rows[rows >= 0])):
        if isinstance(d, list) and d and isinstance(d[0], list) and len(d[0]) >= 3:
            lead.append(d[0][0] == 1)
    return bool(lead) and float(np.mean(lead)) >= 0.5


def _grows(ops: pd.DataFrame, a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the second repeat's shapes are the first's with dims one larger (decode: each token's
    pass reads one more cached position), or the repeats take one token each with a growing cache."""
    da, db = _dims(ops, a), _dims(ops, b)
    grew = False
    for x, y in zip(da, db):
        if x == y:
            continue
        fx = [int(i) for i in _ints(x)]
        fy = [int(i) for i in _ints(y)]
        if len(fx) != len(fy):
            continue
        diff = {q - p for p, q in zip(fx, fy)} - {0}
        if diff == {1}:
            grew = True
    return grew


def _ints(d: Any) -> list[int]:
    if isinstance(d, list):
        return [i for x in d for i in _ints(x)]
    return [d] if isinstance(d, int) and not isinstance(d, bool) else []


def batching(v: RankView) -> list[Candidate]:
    out: list[Candidate] = []
    if v.spec is None or not _inference(v):
        return out
    rep = request_repeats(v)
    if rep.empty:
        return out
    k = v.kernels.loc[rep.index]
    reps = rep.groupby("step")["repeat"].max() + 1
    r_of = rep["step"].map(reps).to_numpy(dtype=float)
    group = pd.factorize(pd.Series(list(zip(rep["step"], rep["position"]))))[0]
    dur = k["dur"].to_numpy(dtype=float)
    roof = k["t_roof_us"].to_numpy(dtype=float)
    med_dur = pd.Series(dur).groupby(group).transform("median").to_numpy()
    med_roof = pd.Series(roof).groupby(group).transform("median").to_numpy()
    # the batched kernel: R x its batch-1 roofline (weights read once would be less), never faster
    # than one request's kernel; a kernel with no cost model runs as one request's
    batched = np.maximum(np.where(np.isfinite(med_roof), r_of * med_roof, med_dur), med_dur)
    after = batched / r_of  # spread over the R kernels it replaces (the replay's regrouping)
    regroup = pd.DataFrame({"group": group, "after_us": after}, index=rep.index)
    later = rep.index[rep["repeat"].to_numpy() > 0]
    units = {**v.kernel_units(rep.index, np.maximum(dur - after, 1e-6)), **v.inner_gap_units(later)}
    n = v.n_steps
    r = int(reps.median())
    period = int(rep.groupby("step")["position"].max().median()) + 1
    gpu_now = float(dur.sum()) / n
    gpu_after = float(pd.Series(batched).groupby(group).first().sum()) / n
    first = op_of(v.kernels, rep.index.to_numpy()[(rep["repeat"] == 0).to_numpy() & (rep["position"] == 0).to_numpy()][:1])
    head = _dims(v.trace.ops, first)[0] if len(first) else None
    entry = f"{v.trace.ops['name'].astype(str).iat[int(first[0])]} {head}" if len(first) and first[0] >= 0 else "?"
    out.append(Candidate(
        id="GP-BATCH-001", category="batching",
        title=(f"Inference runs {r} requests one at a time at batch 1: the same {period} kernels repeated {r} times "
               f"per step, each launched once per request"),
        confidence=v.host_confidence("high"),
        recommendation=("Batch the requests: stack them and run one forward over the batch (a server: dynamic "
                        "batching, e.g. Triton's or TorchServe's, or continuous batching for generation, vLLM/TGI), "
                        "padding or packing sequences of different lengths; each kernel then launches once with R "
                        "times the work. Then capture the batched forward in a CUDA graph "
                        "(`torch.compile(model, mode='reduce-overhead')`) to cut the launches left."),
        units=units, regroup=regroup,
        evidence={
            "rank": v.rank, "requests_per_step": r, "kernels_per_request": period,
            "seen": (f"each step repeats one forward {r} times back to back, each repeat starting at {entry} "
                     "(batch 1) with the same kernels"),
            "gpu_ms_per_step": round(ms(gpu_now), 3), "gpu_ms_per_step_batched": round(ms(gpu_after), 3),
            "kernel_launches_per_step_after": period,
            "kernels": top_names(k),
            "estimate": ("the requests as one forward at batch R: each kernel position at R x its batch-1 roofline "
                         "time, never below its batch-1 run; launched once, the host's cost per launched kernel "
                         "kept (replayed)"),
        }))
    return out
