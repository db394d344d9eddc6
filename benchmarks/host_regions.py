"""The deflated host against the host measured without the profiler, region by region.

sample_traces/regions/ holds, for programs of the lent H200, the host wall time of each region of
a training step (forward, backward, the ``.item()`` syncs, the optimizer) measured without the
profiler and with it in the same process, and six of those processes' traces (README.md there).
This replays each kept trace after the profiler's cost is taken out by a host model calibrated to
the process's own unprofiled step time, maps the regions onto the trace (below) and compares the
replayed time of each region with the measured unprofiled one. It tests the deflation model
itself, whatever fix is priced on it afterwards.

Regions in the trace (host timestamps; each region is replayed as the time between the replayed
starts of the first host calls at or after its two boundaries):

* forward: the step window's start to the first ``autograd::engine`` op (the input batch, where
  the program marks it apart, counts to forward: both happen before ``backward()``);
* backward: from there to the end of the last ``autograd::engine`` op of the step;
* syncs (``--host-sync`` programs: gpt.py's norm ``.item()`` loop, hf.py's ``clip_grad_norm_``
  and two ``.item()``): the end of backward to the optimizer's start; first_item, gpt.py's first
  ``g.norm().item()`` (mostly its wait for backward's GPU work), is compared as the replayed wait
  of the first synchronising call after backward (``first_wait``);
* optimizer: the ``Optimizer.step#`` span.

A boundary is the replayed start of the first host call at or after it, so the regions tile the
step; a region's end that no next region starts (the optimizer's, the first ``.item()``'s) is the
replayed end of the last host call that ended before it (after the optimizer comes ``zero_grad``,
which calls nothing on the GPU, then the next step's input).

The host models compared (each calibrated so the replayed steady step is the unprofiled one):

* ``per_event``: one profiler cost per recorded host event (``calibrate``/``deflate`` until
  this session's change);
* ``speed``: every host span (gaps, calls, a waiting call's return) × one host-speed factor;
* ``bracket+speed``: the trace's bracket cost per event (``bracket_cost_us``) first, then one
  speed factor on what is left (side branch wk/s3-wt-depthh-speedcal);
* ``model``: what :func:`gpuprof.replay.host_bounds` gives the replay of fixes now.

    python -m benchmarks.host_regions
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gpuprof.replay import Graph, build, calibrate, deflate, host_speed, largest_speed, run, steady_ms
from gpuprof.trace.load import load_trace
from gpuprof.trace.model import RankTrace

REGIONS = Path(__file__).resolve().parents[1] / "sample_traces" / "regions"
#: Regions compared: every region the programs mark that the trace bounds by ops or annotations.
NAMES = ("forward", "backward", "syncs", "first_item", "optimizer")
#: Regions in the tables; first_item is read by its wait (:func:`first_wait_ms`)
SHOWN = ("forward", "backward", "syncs", "optimizer")


def kept() -> list[str]:
    """The region processes whose trace is kept (``NAME.rR`` stems)."""
    return sorted(p.name[: -len(".json.gz")] for p in REGIONS.glob("*.json.gz"))


def measured(stem: str) -> dict[str, dict[str, float]]:
    """Per bucket ("timed": unprofiled, "profiled"), ms per step per region, folded onto
    :data:`NAMES` (hf.py's ``input`` counts to forward; its ``host_sync``, gpt.py's ``first_item``
    and ``other_items`` are the syncs)."""
    doc = json.loads((REGIONS / f"{stem}.regions.json").read_text())["ms_per_step"]
    out: dict[str, dict[str, float]] = {}
    for b, d in doc.items():
        r = {k: float(d[k]) for k in NAMES if k in d}
        if "input" in d:
            r["forward"] += float(d["input"])
        if any(k in d for k in ("host_sync", "first_item", "other_items")):
            r["syncs"] = sum(float(d.get(k, 0.0)) for k in ("host_sync", "first_item", "other_items"))
        out[b] = r
    return out


def step_ms(stem: str) -> float:
    return float(json.loads((REGIONS / f"{stem}.timing.json").read_text())["step_ms"])


def boundaries(t: RankTrace) -> dict[str, np.ndarray]:
    """Per region, an array (steps, 2) of its start and end on the trace's host clock (NaN where
    the step has no such region); :data:`BY_END` regions' ends are read by the calls before them."""
    ops, steps = t.ops, t.steps.sort_values("start")
    name = ops["name"].astype(str)
    out: dict[str, np.ndarray] = {k: np.full((len(steps), 2), np.nan) for k in NAMES}
    ann = t.annotations
    opt = ann[~ann["on_gpu"] & ann["name"].astype(str).str.startswith("Optimizer.step#")]
    for i, (st, en) in enumerate(zip(steps["start"].to_numpy(), steps["end"].to_numpy())):
        inside = (ops["ts"] >= st) & (ops["ts"] < en)
        eng = ops[inside & name.str.startswith("autograd::engine")]
        o = opt[(opt["ts"] >= st) & (opt["ts"] < en)]
        if eng.empty:
            continue
        b0, b1 = float(eng["ts"].min()), float(eng["end"].max())
        out["forward"][i] = (st, b0)
        out["backward"][i] = (b0, b1)
        o0 = float(o["ts"].min()) if len(o) else float("nan")
        items = ops[inside & (name == "aten::item") & (ops["ts"] >= b1)]
        if len(o):
            items = items[items["ts"] < o0]
            out["optimizer"][i] = (o0, float(o["end"].max()))
        if len(items):
            out["first_item"][i] = (b1, float(items["end"].iloc[0]))
            out["syncs"][i] = (b1, o0)
    return out


#: Regions whose end is the end of the last host call before it (no region starts there).
BY_END = frozenset({"first_item", "optimizer"})


def first_wait_ms(g: Graph, bounds: dict[str, np.ndarray]) -> float:
    """ms per step the first waiting host call after backward's end waits in the replay of ``g``
    (its replayed duration): how far the replayed host ran ahead of the GPU there."""
    times = run(g).times
    ends = bounds["backward"][:, 1]
    w = np.flatnonzero(g.h_wait >= 0)
    w = w[np.argsort(g.h_ts[w], kind="stable")]
    got = []
    for e in ends[np.isfinite(ends)]:
        j = np.searchsorted(g.h_ts[w], e)
        if j < len(w):
            got.append(float(times.h_end[w[j]] - times.h_start[w[j]]) / 1000.0)
    return float(np.mean(got)) if got else float("nan")


def replayed_regions(g: Graph, bounds: dict[str, np.ndarray]) -> dict[str, float]:
    """ms per step of each region in the replay of ``g``: the replayed start of the first host call
    at or after each boundary, differenced (one rank)."""
    times = run(g).times
    order = np.argsort(g.h_ts, kind="stable")
    ts, start = g.h_ts[order], times.h_start[order]

    end_order = np.argsort(g.h_end, kind="stable")
    ends, end = g.h_end[end_order], times.h_end[end_order]

    def at(x: np.ndarray) -> np.ndarray:
        j = np.searchsorted(ts, x, side="left")
        ok = np.isfinite(x) & (j < len(ts))
        return np.where(ok, start[np.minimum(j, len(ts) - 1)], np.nan)

    def before(x: np.ndarray) -> np.ndarray:
        j = np.searchsorted(ends, x, side="right") - 1
        ok = np.isfinite(x) & (j >= 0)
        return np.where(ok, end[np.maximum(j, 0)], np.nan)

    out = {}
    for k, b in bounds.items():
        d = ((before(b[:, 1]) if k in BY_END else at(b[:, 1])) - at(b[:, 0])) / 1000.0
        d = d[np.isfinite(d)]
        if len(d):
            out[k] = float(d.mean())
    return out


def _fit_speed(g: Graph, real_ms: float) -> Graph:
    """``g`` at the largest host-speed factor that replays ``real_ms`` (the search the replay's host
    model uses)."""
    return host_speed(g, largest_speed(g, real_ms))


def models(t: RankTrace) -> dict[str, Callable[[Graph, float], Graph]]:
    from gpuprof.hostcost import bracket_cost_us
    from gpuprof.replay import host_bounds

    br = bracket_cost_us(t)
    return {
        "per_event": lambda g, real: deflate(g, calibrate(g, real)),
        "speed": _fit_speed,
        "bracket+speed": lambda g, real: _fit_speed(deflate(g, br), real),
        "model": lambda g, real: host_bounds(g, real, br).apply(g),
    }


def evaluate() -> list[dict[str, Any]]:
    rows = []
    for stem in kept():
        t = load_trace(REGIONS / f"{stem}.json.gz")
        g, real, meas = build([t]), step_ms(stem), measured(stem)
        b = boundaries(t)
        rows.append({"stem": stem, "model": "traced", "real_step_ms": real, "step_ms": steady_ms(g),
                     "regions": replayed_regions(g, b), "measured": meas["profiled"], "first_wait": first_wait_ms(g, b)})
        for name, f in models(t).items():
            d = f(g, real)
            rows.append({"stem": stem, "model": name, "real_step_ms": real, "step_ms": steady_ms(d),
                         "regions": replayed_regions(d, b), "measured": meas["timed"], "first_wait": first_wait_ms(d, b)})
    return rows


def host_bound(stem: str) -> bool:
    """Whether the process's step is set by its host (the CNNs' by the GPU: README.md there)."""
    return not stem.startswith(("resnet", "convnext"))


def errors(rows: list[dict[str, Any]], model: str, host_bound_only: bool = True) -> list[float]:
    """Per region of ``model`` that lasts at least 0.3 ms unprofiled, on the host-bound processes
    (a GPU-bound one's regions include the host's waits for a full launch queue): how much the
    model shrank the region against how much the profiler had grown it, ``(replayed / traced
    replay) / (unprofiled / profiled) − 1``. Dividing by the traced replay's region takes out
    what the mapping of regions onto host calls itself misses (``traced`` rows: a region's
    Python before its first call and after its last); the first ``.item()`` is its own check."""
    traced = {r["stem"]: r for r in rows if r["model"] == "traced"}
    out = []
    for r in rows:
        if r["model"] != model or (host_bound_only and not host_bound(r["stem"])):
            continue
        t = traced[r["stem"]]
        for k, v in r["regions"].items():
            m, tv, tm = r["measured"].get(k, 0.0), t["regions"].get(k, 0.0), t["measured"].get(k, 0.0)
            if m >= 0.3 and tv > 0 and tm > 0 and k != "first_item":
                out.append((v / tv) / (m / tm) - 1.0 if model != "traced" else tv / tm - 1.0)
    return out


def main() -> None:
    rows = evaluate()
    print("| process | host model | replayed step (real) ms | " + " | ".join(SHOWN) + " |")
    print("|---|---|---|" + "---|" * len(SHOWN))
    for r in rows:
        cells = []
        for k in SHOWN:
            m, v = r["measured"].get(k), r["regions"].get(k)
            cells.append("–" if m is None or v is None else f"{v:.2f} / {m:.2f} ({100 * (v / m - 1):+.0f}%)"
                         if m > 0 else f"{v:.2f} / {m:.2f}")
        print(f"| {r['stem']} | {r['model']} | {r['step_ms']:.2f} ({r['real_step_ms']:.2f}) | " + " | ".join(cells) + " |")
    print("\nShrink of each region by the host model against the measured one (``errors``; traced: the"
          " traced replay against the profiled region), host-bound processes, regions ≥ 0.3 ms:\n")
    print("| host model | regions | mean abs error | max abs error | within ±20 % |\n|---|---|---|---|---|")
    for m in dict.fromkeys(r["model"] for r in rows):
        e = np.abs(errors(rows, m))
        print(f"| {m} | {len(e)} | {100 * e.mean():.0f}% | {100 * e.max():.0f}% | {int((e <= 0.2).sum())} |")
    print("\nThe first synchronising call after backward, replayed wait (ms per step) against the whole unprofiled "
          "first `g.norm().item()` region (its launch and its wait):\n")
    for r in rows:
        if "first_item" in r["measured"]:
            print(f"- {r['stem']} {r['model']}: {r['first_wait']:.2f} (region {r['measured']['first_item']:.2f})")

if __name__ == "__main__":
    main()
