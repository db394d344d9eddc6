"""The HTML report: one self-contained offline file a user reads first.

It formats the JSON document (``Analysis.to_dict()``) and the plain detail data
(``Analysis.detail()``) and computes nothing new. plotly.js is embedded once; there are no
network fetches. Everything that comes from traces (kernel, op and annotation names, commands)
is escaped by jinja2's autoescaping in HTML, escaped for plotly's pseudo-HTML in chart labels,
and embedded JSON has ``<``, ``>`` and ``&`` written as ``\\u003c`` etc., so ``</script>`` in a
name cannot end a script block.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import jinja2

CLASS_COLORS = {"compute": "#2b6cb0", "memory": "#dd6b20", "latency": "#d69e2e", "unknown": "#a0aec0",
                "memcpy": "#805ad5", "communication": "#e53e3e", "idle": "#e2e8f0"}
BOUND_COLORS = {"compute": "#2b6cb0", "memory": "#dd6b20", "latency": "#d69e2e", "unknown": "#a0aec0"}
THROTTLE = 0x4 | 0x8 | 0x20 | 0x40 | 0x80

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
                          autoescape=True, trim_blocks=True, lstrip_blocks=True)


def script_json(obj: Any) -> str:
    """JSON safe inside a <script> element: no '<', '>' or '&' survive literally."""
    text = json.dumps(obj, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _label(s: Any, width: int = 90) -> str:
    """Text for plotly labels, which interpret a subset of HTML: escaped, shortened."""
    t = str(s)
    return html.escape(t if len(t) <= width else t[: width - 1] + "…")


def _breakdown_figure(per_step: list[dict[str, Any]]) -> dict[str, Any]:
    names = [f"rank {p['rank']} · step {p['step']}" for p in per_step]
    traces = [{"type": "bar", "orientation": "h", "name": c, "y": names, "x": [p.get(c, 0.0) for p in per_step],
               "marker": {"color": color}, "hovertemplate": f"{c}: %{{x:.2f}} ms<extra></extra>"}
              for c, color in CLASS_COLORS.items()]
    # the legend above the bars: below them plotly lays it over the x axis's title
    return {"data": traces, "layout": {"barmode": "stack", "height": 150 + 28 * len(names),
                                       "xaxis": {"title": {"text": "ms"}, "automargin": True},
                                       "yaxis": {"automargin": True},
                                       "margin": {"l": 140, "r": 20, "t": 40, "b": 50},
                                       "legend": {"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"}}}


def _roofline_figure(kernels: list[dict[str, Any]], roofs: dict[str, Any]) -> dict[str, Any]:
    pts = [k for k in kernels if k.get("flops") and k.get("bytes") and k.get("achieved_tflops")]
    data: list[dict[str, Any]] = []
    if roofs and pts:
        ai = [k["flops"] / k["bytes"] for k in pts]
        lo, hi = max(min(ai) / 4, 1e-3), max(ai) * 4
        xs = [10 ** (math.log10(lo) + i * (math.log10(hi) - math.log10(lo)) / 60) for i in range(61)]
        bw = roofs["hbm_gbps"] * 1e9
        for dtype in ("fp32", "tf32", "bf16", "fp8"):
            peak = roofs["peaks_tflops"].get(dtype)
            if peak:
                data.append({"type": "scatter", "mode": "lines", "name": f"{dtype} roof", "x": xs,
                             "y": [min(peak, x * bw / 1e12) for x in xs], "line": {"width": 1, "dash": "dot"},
                             "hoverinfo": "skip"})
    total = max((k["total_us"] for k in pts), default=1.0)
    for bound, color in BOUND_COLORS.items():
        sel = [k for k in pts if k["bound"] == bound]
        if not sel:
            continue
        data.append({
            "type": "scatter", "mode": "markers", "name": bound,
            "x": [k["flops"] / k["bytes"] for k in sel], "y": [k["achieved_tflops"] for k in sel],
            "marker": {"color": color, "size": [6 + 30 * math.sqrt(k["total_us"] / total) for k in sel], "opacity": 0.75},
            "text": [f"{_label(k['name'])}<br>{k['count']} × · {k.get('ms_per_step') or 0:.3f} ms per step · "
                     f"{k['achieved_tflops']:.1f} TFLOP/s · {k['achieved_gbps'] or 0:.0f} GB/s<br>"
                     f"{_label(k.get('op') or '')} {_label(k.get('shapes') or '', 120)}<br>"
                     f"{k.get('math_dtype') or ''} · {k['bound']} · {k['roofline_pct'] or 0:.0f}% of roofline"
                     for k in sel],
            "hovertemplate": "%{text}<extra></extra>",
        })
    return {"data": data, "layout": {"height": 460, "margin": {"l": 60, "r": 20, "t": 10, "b": 50},
                                     "xaxis": {"type": "log", "title": {"text": "arithmetic intensity (FLOP/byte)"}},
                                     "yaxis": {"type": "log", "title": {"text": "achieved TFLOP/s"}}}}


def _nvml_figures(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not series:
        return []
    figs = []
    gpus = sorted({s["gpu"] for s in series if s.get("gpu") is not None})
    held = [s for s in series if int(s.get("clock_event_reasons") or 0) & THROTTLE]
    shapes = [{"type": "rect", "xref": "x", "yref": "paper", "x0": s["t_s"] - 0.025, "x1": s["t_s"] + 0.025,
               "y0": 0, "y1": 1, "fillcolor": "#fed7d7", "opacity": 0.5, "line": {"width": 0}, "layer": "below"}
              for s in held[:2000]]
    window = [s["t_s"] for s in series if s.get("in_window")]
    if window:
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": min(window), "x1": max(window), "y0": 0,
                       "y1": 1, "fillcolor": "#c6f6d5", "opacity": 0.5, "line": {"width": 0}, "layer": "below"})
    for metric, unit in (("util_gpu_pct", "%"), ("sm_clock_mhz", "MHz"), ("power_w", "W"), ("mem_used_mb", "MB")):
        data = [{"type": "scatter", "mode": "lines", "name": f"GPU {g}", "connectgaps": True,
                 "x": [s["t_s"] for s in series if s.get("gpu") == g],
                 "y": [s.get(metric) for s in series if s.get("gpu") == g]} for g in gpus]
        figs.append({"title": f"{metric.replace('_', ' ')} ({unit})", "figure": {
            "data": data, "layout": {"height": 200, "shapes": shapes, "showlegend": len(gpus) > 1,
                                     "margin": {"l": 60, "r": 20, "t": 10, "b": 35},
                                     "xaxis": {"title": {"text": "s since recording began"}}}}})
    return figs


def _ranks_figure(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Step time (left axis) and exposed communication (right axis) per rank. Bars on two
    overlaid axes are not grouped by ``barmode`` (each would hide the other): ``offsetgroup``
    puts them side by side, and ``automargin`` keeps both axes' ticks and titles inside the plot."""
    ranks = [f"rank {r['rank']}" for r in per_rank]
    return {"data": [
        {"type": "bar", "name": "step time (ms)", "x": ranks, "y": [r["step_time_ms"] for r in per_rank],
         "offsetgroup": "step", "marker": {"color": "#2b6cb0"},
         "hovertemplate": "%{x}: %{y:.2f} ms per step<extra></extra>"},
        {"type": "bar", "name": "exposed communication (% of step)", "x": ranks,
         "y": [r["communication_pct"] for r in per_rank], "yaxis": "y2", "offsetgroup": "comm",
         "marker": {"color": "#e53e3e"}, "hovertemplate": "%{x}: %{y:.1f} % of the step<extra></extra>"}],
        "layout": {"height": 320, "barmode": "group", "margin": {"l": 70, "r": 70, "t": 10, "b": 40},
                   "legend": {"orientation": "h", "y": -0.2},
                   "yaxis": {"title": {"text": "step time (ms)"}, "automargin": True, "rangemode": "tozero"},
                   "yaxis2": {"title": {"text": "exposed communication (%)"}, "overlaying": "y", "side": "right",
                              "automargin": True, "rangemode": "tozero", "showgrid": False}}}


def subject(doc: dict[str, Any]) -> str:
    """What the report is of, in a few words: the run folder's name, or the trace file names."""
    src = doc["source"]
    if src.get("run_folder"):
        return f"run {Path(src['run_folder']).name}"
    paths = [Path(p) for p in src["paths"]]
    if len(paths) == 1:
        return paths[0].name
    if len({p.parent for p in paths}) == 1:  # a folder of rank traces
        return f"{paths[0].parent.name}/ ({len(paths)} traces)"
    return f"{paths[0].name} and {len(paths) - 1} more"


from gpuprof.reports.text import projection_line  # noqa: E402  (the one wording of the projection)


def render_html(doc: dict[str, Any], detail: dict[str, Any]) -> str:
    import plotly.offline

    from gpuprof.reports.names import op_label, short_name

    summary = doc["summary"]
    step = summary.get("unprofiled_step_time_ms") or summary["step_time_ms"]
    findings = []
    for f in doc["findings"]:
        left = step - f["estimated_savings_ms"]
        speedup = step / left if left > 0 else None
        findings.append({**f, "throughput_gain_pct": 100 * (speedup - 1) if speedup else None,
                         "evidence_json": json.dumps(f["evidence"], indent=1, default=str)})
    charts: dict[str, Any] = {"breakdown": _breakdown_figure(detail["per_step"]),
                              "roofline": _roofline_figure(doc["kernels"], detail["roofs"])}
    nvml = _nvml_figures(detail["nvml_series"])
    for i, n in enumerate(nvml):
        charts[f"nvml{i}"] = n["figure"]
    if summary.get("per_rank"):
        charts["ranks"] = _ranks_figure(summary["per_rank"])
    kernels = [{**k, "short": short_name(str(k["name"]), 64)} for k in doc["kernels"][:300]]  # ~460 px
    timeline, claims = _timeline_figure(detail.get("timeline") or {})
    if timeline:
        charts["timeline"] = timeline
    mem = _memory_figure(detail.get("memory") or {})
    if mem:
        charts["memory"] = mem
    operators = [{**o, "short": op_label(str(o["name"]), 64)} for o in detail.get("operators") or []]
    gaps = missing(doc, detail)
    if gaps["roofline"]:
        charts.pop("roofline")
    return _ENV.get_template("report.html.j2").render(
        doc=doc, s=summary, step_ms=step, findings=findings, kernels=kernels, subject=subject(doc),
        more_kernels=max(0, len(doc["kernels"]) - 300), nvml=[{"id": f"nvml{i}", "title": n["title"]} for i, n in
                                                              enumerate(nvml)],
        run=detail.get("run") or {}, charts_json=script_json(charts), claims_json=script_json(claims),
        timeline=detail.get("timeline") or {}, claimed=set(claims), operators=operators,
        memory=detail.get("memory") or {}, missing=gaps, detail_steps=bool(detail["per_step"]),
        plotly_js=plotly.offline.get_plotlyjs(), classes=CLASS_COLORS,
        projection=projection_line(summary, doc.get("findings", []), len(doc["source"]["ranks"])),
    )


def missing(doc: dict[str, Any], detail: dict[str, Any]) -> dict[str, str | None]:
    """For each view the report has no data for, the sentence it shows instead (what is missing,
    and how to record it); None where the view has its data. No view is ever an empty chart."""
    s, gpu = doc["summary"], doc["gpu"]
    gpu_work = bool(doc["kernels"]) or (s.get("gpu_busy_pct") or 0) > 0
    record = ("record with `torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], "
              "record_shapes=True)`")
    out: dict[str, str | None] = dict.fromkeys(("timeline", "breakdown", "roofline", "operators", "memory",
                                                "kernels"))
    if not doc["kernels"]:
        out["kernels"] = ("No kernels in the profiled steps" + ("." if gpu_work else ": this trace has no GPU events; "
                                                                 + record + " to trace the GPU too."))
    if not (detail.get("timeline") or {}).get("lanes"):
        out["timeline"] = ("No timeline: this trace has no GPU events (kernels or copies) to draw; " + record
                           + " to trace the GPU too." if not gpu_work else
                           "No timeline: no step of this trace has GPU time to draw.")
    if not detail.get("per_step"):
        out["breakdown"] = "No step has a time on the GPU timeline, so there is nothing to break down."
    pts = [k for k in doc["kernels"] if k.get("flops") and k.get("bytes") and k.get("achieved_tflops")]
    if gpu["spec"].get("hbm_gbps") is None:
        out["roofline"] = (f"No roofline: gpuprof has no peaks for the GPU \u201c{gpu['name']}\u201d, so kernels "
                           "are 'unknown' and there is no MFU. Name the part with `--gpu KEY` (e.g. "
                           "`gpuprof report TRACE --gpu H100-SXM`; a key that is not exact lists the candidates), "
                           "or measure this GPU with `gpuprof calibrate -o spec.json` and pass `--gpu-spec spec.json`.")
    elif not pts:
        out["roofline"] = ("No roofline points: no kernel has FLOPs and bytes, which come from the ops' recorded "
                           "input shapes; " + record + "." if gpu_work else
                           "No roofline points: this trace has no kernels; " + record + ".")
    if not detail.get("operators"):
        out["operators"] = ("No operators: the profiled steps have no CPU ops (a GPU-only trace, "
                            "activities=[CUDA]); " + record + " to see them.")
    if not detail.get("memory"):
        nvml = (" The NVML memory series of this run is under GPU samples (NVML)." if detail.get("nvml_series")
                else "")
        out["memory"] = ("No GPU memory events in this trace: the allocator's events are recorded by "
                         "`torch.profiler.profile(..., profile_memory=True)`." + nvml)
    return out


TIMELINE_COLORS = {**CLASS_COLORS, "cpu_op": "#4a5568", "runtime": "#38a169", "idle": "#cbd5e0"}


def _timeline_figure(tl: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The step's lanes as horizontal bars, one trace per class (so the legend toggles classes),
    each finding's claimed items as the bars of the last, highlight trace, and the host calls that
    cause them (``causes``) as the outlined bars of the one before it."""
    if not tl or not tl.get("lanes"):
        return {}, {}
    lanes = [_label(lane["name"], 60) for lane in tl["lanes"]]
    it, strings = tl["items"], tl["strings"]
    lane, start, dur, cls = it["lane"], it["start"], it["dur"], it["cls"]
    texts = [f"{_label(strings[n], 120)}<br>{d / 1000:.3f} ms at {s / 1000:.3f} ms"
             + (f"<br>{_label(strings[o], 80)}" if strings[o] else "")
             + (f"<br>{_label(strings[sh], 140)}" if strings[sh] else "")
             for n, d, s, o, sh in zip(it["name"], dur, start, it["detail"], it["shapes"])]
    data: list[dict[str, Any]] = []
    for c in dict.fromkeys(cls):
        idx = [i for i, x in enumerate(cls) if x == c]
        data.append({"type": "bar", "orientation": "h", "name": c, "y": [lanes[lane[i]] for i in idx],
                     "base": [start[i] / 1000 for i in idx], "x": [max(dur[i], 1e-3) / 1000 for i in idx],
                     "text": [texts[i] for i in idx], "hovertemplate": "%{text}<extra>" + c + "</extra>",
                     "textposition": "none", "marker": {"color": TIMELINE_COLORS.get(c, "#718096")}, "width": 0.7})

    def bars(rows: list[int]) -> dict[str, Any]:
        return {"y": [lanes[lane[i]] for i in rows], "base": [start[i] / 1000 for i in rows],
                "x": [max(dur[i], 1e-3) / 1000 for i in rows], "text": [texts[i] for i in rows]}

    causes = tl.get("causes") or {}
    claims = {fid: {**bars(rows), "causes": bars(causes.get(fid, []))} for fid, rows in tl["findings"].items()}
    # what causes a finding's claims (an allocator finding's cudaMalloc/cudaFree calls), outlined
    data.append({"type": "bar", "orientation": "h", "name": "what causes it", "y": [], "base": [], "x": [],
                 "text": [], "hovertemplate": "%{text}<extra>causes it</extra>", "textposition": "none", "width": 0.9,
                 "marker": {"color": "rgba(26,32,44,0.15)", "line": {"color": "#1a202c", "width": 2}}})
    data.append({"type": "bar", "orientation": "h", "name": "selected finding", "y": [], "base": [], "x": [],
                 "text": [], "hovertemplate": "%{text}<extra>claimed</extra>", "textposition": "none", "width": 0.9,
                 "marker": {"color": "rgba(229,62,62,0.55)", "line": {"color": "#c53030", "width": 2}}})
    gpu0 = tl.get("gpu_start_us", 0.0) / 1000
    end = tl.get("window_us", 0.0) / 1000
    # The host may run far ahead of the GPU (70 % of the width on gpt_fp32): when its lead is over
    # half the step's width the chart opens on the GPU's own window; the page offers both.
    gpu_view = bool(end > 0 and gpu0 > 0.5 * end)
    layout: dict[str, Any] = {"barmode": "overlay", "height": 160 + 34 * len(lanes), "bargap": 0.2,
              "xaxis": {"title": {"text": "ms from the step's first host event"}, "zeroline": False,
                        **({"range": [gpu0 - 0.02 * (end - gpu0), end + 0.02 * (end - gpu0)]} if gpu_view else {})},
              "yaxis": {"categoryorder": "array", "categoryarray": list(reversed(lanes)), "automargin": True},
              "margin": {"l": 10, "r": 20, "t": 60, "b": 40}, "hovermode": "closest",
              "legend": {"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
              "shapes": [{"type": "line", "x0": gpu0, "x1": gpu0, "yref": "paper", "y0": 0, "y1": 1,
                          "line": {"dash": "dot", "width": 1, "color": "#718096"}}] if gpu0 > 0 else []}
    if len(tl.get("ranks") or []) > 1:
        layout["xaxis"]["title"] = {"text": "ms from each rank's step start"}
    layout["meta"] = {"gpu_window": [gpu0, end], "opens_on_gpu_window": gpu_view}
    return {"data": data, "layout": layout}, claims


def _memory_figure(m: dict[str, Any]) -> dict[str, Any]:
    if not m:
        return {}
    gb = 1e9
    data = [{"type": "scatter", "mode": "lines", "name": "allocated", "x": m["t_ms"],
             "y": [v / gb for v in m["allocated"]], "line": {"shape": "hv", "color": "#2b6cb0"},
             "hovertemplate": "%{y:.3f} GB allocated at %{x:.2f} ms<extra></extra>"}]
    if m.get("reserved") is not None:
        data.append({"type": "scatter", "mode": "lines", "name": "reserved", "x": m["t_ms"],
                     "y": [v / gb for v in m["reserved"]], "line": {"shape": "hv", "color": "#a0aec0", "dash": "dot"},
                     "hovertemplate": "%{y:.3f} GB reserved at %{x:.2f} ms<extra></extra>"})
    shapes = [{"type": "rect", "xref": "x", "yref": "paper", "x0": s["start_ms"], "x1": s["end_ms"], "y0": 0, "y1": 1,
               "fillcolor": "#edf2f7" if i % 2 else "#f7fafc", "line": {"width": 0}, "layer": "below"}
              for i, s in enumerate(m["steps"])]
    notes = [{"x": m["peak_t_ms"], "y": m["peak_bytes"] / gb, "text": f"peak {m['peak_bytes'] / gb:.3f} GB",
              "showarrow": True, "arrowhead": 2}]
    return {"data": data, "layout": {"height": 320, "shapes": shapes, "annotations": notes,
                                     "xaxis": {"title": {"text": "ms from the first profiled step"}},
                                     "yaxis": {"title": {"text": "GB since the trace began" if m.get("relative")
                                                         else "GB"}, **({} if m.get("relative") else
                                                                        {"rangemode": "tozero"})},
                                     "margin": {"l": 60, "r": 20, "t": 10, "b": 40}, "legend": {"orientation": "h"}}}
