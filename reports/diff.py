"""Renderers of the ``gpuprof diff`` document: terminal text and one offline HTML page."""

from __future__ import annotations

import html
from typing import Any

from gpuprof.reports.html import _ENV, script_json
from gpuprof.reports.text import _safe


def _fmt(d: dict[str, Any], unit: str) -> str:
    if d["before"] is None or d["after"] is None:
        return "n/a"
    pct = f" ({d['change_pct']:+.1f}%)" if d.get("change_pct") is not None else ""
    return f"{d['before']:.2f} → {d['after']:.2f} {unit}{pct}"


def notes(doc: dict[str, Any]) -> list[str]:
    """What the diff's step times mean, in sentences: which step times it leads with, each side
    that is host-bound under the profiler (its traced step is the profiled host's), and what the
    fixes were projected to give beside what the after side shows."""
    out = []
    step = doc.get("step") or {}
    if step.get("basis") == "without the profiler":
        out.append("step times are without the profiler on both sides (run folders of `gpuprof record`, or "
                   "--step-ms-before/--step-ms-after)")
    for side in ("before", "after"):
        hb = doc[side].get("host_bound")
        if hb:
            out.append(f"{side} is host-bound under the profiler: its GPU is idle {hb['idle_pct']:.0f} % of the traced "
                       f"step ({hb['gpu_ms']:.2f} ms of GPU work in {hb['step_time_ms']:.2f} ms), and torch.profiler "
                       f"slows the host 1.5-2.5x, so its traced step time is the profiled host's, not the program's: "
                       f"give --step-ms-{side} MS (from training logs) or diff run folders of `gpuprof record`, which "
                       f"time the steps without the profiler")
    p = doc["before"].get("projection") or {}
    if p.get("projected_step_time_ms") and p.get("projected_from_ms"):
        got = step.get("after")
        out.append(f"before's fixes were projected (replayed) to take its step from {p['projected_from_ms']:.1f} to "
                   f"{p['projected_step_time_ms']:.1f} ms; after's step is {got:.2f} ms {step.get('basis', 'traced')}"
                   + (", host-bound under the profiler" if doc["after"].get("host_bound") else "") if got else "")
    return [n for n in out if n]


def render_diff_text(doc: dict[str, Any]) -> str:
    from gpuprof.reports.text import _wrap

    lines = [f"before: {_safe(', '.join(doc['before']['paths']))}", f"after:  {_safe(', '.join(doc['after']['paths']))}"]
    if (doc.get("step") or {}).get("basis", "traced") != "traced":  # the lead: both sides without the profiler
        lines.append(f"step time (used)        {_fmt(doc['step'], 'ms')}  {doc['step']['basis']}")
    lines += [f"step time (trace)       {_fmt(doc['step_time_ms'], 'ms')}",
             f"step time (no profiler) {_fmt(doc['unprofiled_step_time_ms'], 'ms')}",
             f"MFU (trace)             {_fmt(doc['mfu_pct'], '%')}",
             f"MFU (no profiler)       {_fmt(doc['mfu_unprofiled_pct'], '%')}",
             f"GPU busy                {_fmt(doc['gpu_busy_pct'], '%')}"]
    for n in notes(doc):
        lines += _wrap(_safe(n), 100, "note: ", "      ")
    for side in ("before", "after"):  # e.g. a recorded step time that was impossible and is not used
        lines += [f"note ({side}): {_safe(w)}" for w in doc[side].get("warnings", [])]
    lines += ["", "time by class (ms per step)"]
    for c, d in doc["breakdown_ms"].items():
        if (d["before"] or 0) > 0.005 or (d["after"] or 0) > 0.005:
            lines.append(f"  {c:14s} {_fmt(d, 'ms')}")
    lines += ["", "estimated savings by finding category (ms per step)"]
    for c, d in doc["findings_saving_ms"].items():
        lines.append(f"  {c:22s} {d['before']:.2f} → {d['after']:.2f}")
    lines += ["", "kernels that changed most (ms per step)"]
    for k in doc["kernels_ms_per_step"]:
        lines.append(f"  {k['change']:+9.3f}  {k['before']:8.3f} → {k['after']:8.3f}  {_safe(k['name'], 80)}")
    return "\n".join(lines) + "\n"


def render_diff_html(doc: dict[str, Any]) -> str:
    import plotly.offline

    classes = [c for c, d in doc["breakdown_ms"].items() if (d["before"] or 0) + (d["after"] or 0) > 0]
    chart = {"data": [{"type": "bar", "name": side, "x": classes,
                       "y": [doc["breakdown_ms"][c][side] for c in classes]} for side in ("before", "after")],
             "layout": {"barmode": "group", "height": 320, "yaxis": {"title": {"text": "ms per step"}},
                        "margin": {"l": 60, "r": 20, "t": 10, "b": 40}}}
    kernels = [{**k, "label": html.escape(k["name"])} for k in doc["kernels_ms_per_step"]]
    page: str = _ENV.get_template("diff.html.j2").render(doc=doc, kernels=kernels, notes=notes(doc),
                                                       chart_json=script_json({"classes": chart}),
                                                       plotly_js=plotly.offline.get_plotlyjs(), fmt=_fmt)
    return page
