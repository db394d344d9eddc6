"""The terminal summary: step time, MFU, where the time goes, what to fix first, top kernels.

Names from traces are user data: control characters are shown escaped (``\\x1b``) so a kernel
name cannot move the cursor, recolour the terminal or write the clipboard. Colour only when asked
(the CLI asks on a TTY without ``NO_COLOR``).
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

#: What a terminal may act on rather than show: C0 and C1 controls and DEL (ESC, CSI, OSC, BEL,
#: CR, backspace...), bidirectional overrides and isolates (text shown in another order than it
#: reads), line/paragraph separators, and lone surrogates (which cannot even be encoded).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(s: Any) -> str:
    """``str(s)`` safe to print on a terminal: every control character escaped as ``\\xNN`` or
    ``\\uNNNN``; newlines and tabs too, so one message stays one line."""
    return _CONTROL.sub(_escape, str(s))


def _safe(s: Any, width: int | None = None) -> str:
    text = str(s)
    if width is not None and len(text) > width:  # cut first: escaping a 500 MB name to show 70 characters is waste
        text = text[: width - 1] + "…"
    return printable(text)


def _num(x: Any, fmt: str = "{:.1f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x)


#: Host-side categories: estimated from gaps the (profiled) host left on the GPU timeline.
HOST_SIDE = ("launch_overhead", "input_pipeline", "host_sync")


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    """``text`` wrapped to ``width`` columns after the prefixes; a `code` span that fits on a line
    is never split across lines (a longer one breaks at its own spaces), and nothing is cut (a
    word longer than a line gets a line of its own)."""
    room = max(20, width) - len(rest)
    protected = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\u00a0") if len(m.group(0)) < room
                       else m.group(0), text)
    lines = textwrap.wrap(protected, width=max(20, width), initial_indent=first, subsequent_indent=rest,
                          break_long_words=False, break_on_hyphens=False)
    return [ln.replace("\u00a0", " ") for ln in lines] or [first.rstrip()]


def _step_line(s: dict[str, Any], bold: Any) -> str:
    traced = _num(s["step_time_ms"], "{:.2f} ms")
    unprofiled = s.get("unprofiled_step_time_ms")
    if unprofiled:
        return f"step time {bold(_num(unprofiled, '{:.2f} ms'))} without the profiler, {traced} traced"
    return f"step time {bold(traced)} traced (without the profiler: unknown)"


#: One cell per class in the step bars: distinct characters without colour, coloured blocks with it
#: (ANSI 256-colour codes near the HTML report's class colours).
BAR_CHARS = {"compute": ("#", 25), "memory": ("=", 166), "latency": ("~", 178), "unknown": ("?", 248),
             "communication": ("c", 160), "memcpy": ("m", 97), "idle": (".", 254)}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _visible(s: str) -> int:
    return len(_ANSI.sub("", s))


def _bar(step: dict[str, Any], cells: int, color: bool) -> str:
    """``cells`` characters split over the step's classes by largest remainder (so they add up)."""
    t = step.get("time_ms") or 0.0
    shares = [(c, (step.get(c) or 0.0) / t * cells if t > 0 else 0.0) for c in BAR_CHARS]
    n = {c: int(x) for c, x in shares}
    for c, _ in sorted(shares, key=lambda cx: -(cx[1] - int(cx[1])))[: max(0, cells - sum(n.values()))]:
        n[c] += 1
    if color:
        return "".join(f"\x1b[38;5;{BAR_CHARS[c][1]}m" + "\u2588" * n[c] for c in BAR_CHARS if n[c]) + "\x1b[0m"
    return "".join(BAR_CHARS[c][0] * n[c] for c in BAR_CHARS)


def step_bars(per_step: list[dict[str, Any]], width: int, color: bool = False, most: int = 8) -> list[str]:
    """One bar per step (at most ``most``, ranks labelled when several), time by class."""
    if not per_step:
        return []
    ranks = len({p["rank"] for p in per_step}) > 1
    rows = per_step[:most]
    labels = [(f"r{p['rank']} " if ranks else "") + f"step {p['step']}" for p in rows]
    lw = max(len(x) for x in labels)
    cells = max(10, width - lw - 16)
    out = [f"  {lab:<{lw}} {_bar(p, cells, color)} {p['time_ms']:8.2f} ms" for lab, p in zip(labels, rows)]
    if len(per_step) > most:
        out.append(f"  … {len(per_step) - most} more steps")
    keys = [(f"\x1b[38;5;{code}m\u2588\x1b[0m" if color else ch) + f" {c}" for c, (ch, code) in BAR_CHARS.items()]
    line = " "
    for k in keys:  # the legend wrapped to the width (by visible characters: colour codes take none)
        if _visible(line) + 2 + _visible(k) > width and line.strip():
            out.append(line)
            line = " "
        line += " " + k + " "
    return out + [line.rstrip()]


def _operator_lines(ops: list[dict[str, Any]], width: int) -> list[str]:
    from gpuprof.reports.names import op_label

    head = f"  {'GPU ms':>8} {'host ms':>8} {'count':>6}  "
    room = max(12, width - len(head))
    out = [head + "operator"]
    for o in ops:
        host = o.get("host_self_ms_per_step")
        host = o.get("host_ms_per_step") if host is None else host  # annotations: no self time
        out.append(f"  {o.get('gpu_ms_per_step') or 0:8.3f} {host or 0:8.3f} "
                   f"{o['count']:6d}  {_safe(op_label(str(o['name']), room))}")
    return out


#: Categories whose fix a rank's own replay cannot price (it cannot see when the other ranks
#: arrive): with one rank traced they stay out of the projection (gpuprof.replay.fixes.CROSS_RANK).
CROSS_RANK = ("exposed_communication", "rank_imbalance")

#: How close the projection's baseline must be to the step the report shows (the unprofiled one,
#: else the traced one) to go unexplained.
BASELINE_TOLERANCE = 0.02


def _numbers(pos: list[int]) -> str:
    """Finding numbers with consecutive ones as ranges: 1–3, 5."""
    runs: list[str] = []
    for p in pos:
        if runs and runs[-1].split("–")[-1] == str(p - 1):
            runs[-1] = runs[-1].split("–")[0] + f"–{p}"
        else:
            runs.append(str(p))
    return ", ".join(runs)


def projection_line(s: dict[str, Any], findings: list[dict[str, Any]], ranks: int = 1) -> str | None:
    """"apply fixes 1–3: 40.2 → 26.5 ms per step (1.5×, replayed)": the replayed step time with
    the high- and medium-confidence fixes applied together (numbered as listed); then which fixes
    it leaves out and why (low confidence; cross-rank, on one rank's trace; not replayable), and
    its baseline where that is not the step the report shows (the traced step replayed with the
    profiler's host cost taken out). When nothing is projected but fixes save time, why not; None
    when there is nothing to say."""
    after, before = s.get("projected_step_time_ms"), s.get("projected_from_ms")
    ids = s.get("projected_findings") or []
    pos = [i for i, f in enumerate(findings, 1) if f.get("id") in ids]
    out_why: dict[str, list[int]] = {}
    for i, f in enumerate(findings, 1):
        if f.get("id") in ids or not (f.get("estimated_savings_ms") or 0) > 0:
            continue
        if f.get("confidence") == "low":
            why = "low confidence: host time measured under the profiler"
        elif f.get("category") in CROSS_RANK and ranks == 1:
            why = "cross-rank: one rank's replay cannot see when the others arrive"
        else:
            why = "not replayable with the others"
        out_why.setdefault(why, []).append(i)
    left = "; ".join(f"{'fix' if len(n) == 1 else 'fixes'} {_numbers(n)} ({why})" for why, n in out_why.items())
    if not after or not before or not pos:
        return f"no fixes projected together: {left}" if left else None
    word = "fix" if len(pos) == 1 else "fixes"
    line = f"apply {word} {_numbers(pos)}: {before:.1f} → {after:.1f} ms per step ({before / after:.1f}×, replayed)"
    shown = s.get("unprofiled_step_time_ms") or s.get("step_time_ms")
    if shown and abs(before - shown) > BASELINE_TOLERANCE * shown:
        if s.get("unprofiled_step_time_ms"):
            line += (f"; from {before:.1f} ms, the trace replayed with its host calibrated to the step without "
                     f"the profiler ({shown:.1f} ms measured)")
        else:
            line += (f"; from {before:.1f} ms, the traced step ({shown:.1f} ms) replayed with the profiler's "
                     "estimated host cost taken out")
    return line + (f"; leaves out {left}" if left else "")


def render_text(doc: dict[str, Any], color: bool = False, top: int = 10, width: int | None = None,
                views: dict[str, Any] | None = None) -> str:
    """The terminal summary of a JSON report document, wrapped to ``width`` columns (100 when
    not given): header, step time with and without the profiler, MFU, time by class (and, with
    ``views``, one bar per step), the fixes with saving and confidence and how they are ranked,
    notes, and the top kernels per step, beside the top operators (``views['operators']``)
    when the terminal is wide enough, else below them."""
    from gpuprof.reports.names import short_name

    w = width or 100
    bold = (lambda x: f"\x1b[1m{x}\x1b[0m") if color else (lambda x: x)
    dim = (lambda x: f"\x1b[2m{x}\x1b[0m") if color else (lambda x: x)
    s = doc["summary"]
    gpu = doc["gpu"]
    tool = f"gpuprof {doc['tool']['version']}"
    header = _wrap(f"{tool}  {_safe(gpu['name'])}" + (f" ({_safe(gpu['spec']['source'])})" if gpu["spec"].get("source")
                                                       else ""), w, "", "  ")
    lines = [bold(tool) + header[0][len(tool):], *header[1:]]
    src = doc["source"]
    what = f"run {src['run_folder']}" if src.get("run_folder") else ", ".join(src["paths"])
    lines += _wrap(_safe(what), w, "", "  ")
    mfu = f"MFU {bold(_num(s['mfu_pct'], '{:.1f}%', 'n/a'))} traced"
    if s.get("mfu_unprofiled_pct") is not None:
        mfu += f", {_num(s['mfu_unprofiled_pct'], '{:.1f}%')} without the profiler"
    facts = [f"ranks {len(src['ranks'])}", f"steps {s['steps']} ({_safe(s['steps_source'])})",
             f"GPU busy {_num(s['gpu_busy_pct'], '{:.1f}%')}"]
    lines += _wrap("   ".join(x.replace(" ", "\u00a0") for x in facts), w, "", "")
    lines.append(_step_line(s, bold))
    wait = s.get("input_wait")
    if wait:  # the DataLoader waits the profiled steps missed: the fixes are priced without them
        on = f" on rank {_safe(str(wait['rank']))}" if wait.get("rank") is not None else ""
        lines += _wrap(f"of it {_num(wait['loader_wait_ms_per_step'], '{:.2f} ms')} waiting for the DataLoader{on}; "
                       f"{_num(wait['typical_step_time_ms'], '{:.2f} ms')} without the waits the profiled steps "
                       "missed, which the fixes below are priced on", w, "  ", "  ")
    lines.append(mfu)
    proj = projection_line(s, doc.get("findings", []), len(src["ranks"]))
    if proj:
        lines += _wrap(proj.replace(" ms", "\u00a0ms"), w, "", "  ")
    b = s["breakdown_pct"]
    parts = [f"{k} {v:.1f}%" for k, v in sorted(b.items(), key=lambda kv: -(kv[1] or 0)) if v and v >= 0.05]
    lines += _wrap("time: " + ", ".join(parts), w, "", "      ")
    lines += step_bars((views or {}).get("per_step") or [], w, color)
    for warning in doc.get("warnings", []):
        lines += [dim(x) for x in _wrap(_safe(warning), w, "note: ", "      ")]

    lines.append("")
    ranking = doc.get("ranking", {}).get("by")
    lines.append(bold("What to fix first"))
    if ranking:
        lines += [dim(x) for x in _wrap(_safe(ranking), w, "  ", "  ")]
    findings = doc.get("findings", [])
    if not findings:
        lines += _wrap("no findings" + (" (analyzers skipped: " + ", ".join(
            _safe(x["analyzer"]) for x in doc.get("analyzers_skipped", [])) + ")" if doc.get("analyzers_skipped") else ""),
            w, "  ", "    ")
    for i, f in enumerate(findings[:top], 1):
        saving = (f"saves ~{f['estimated_savings_ms']:.2f} ms/step ({f['estimated_savings_pct']:.1f}%)"
                  if f["estimated_savings_ms"] > 0 else "informational, no saving estimated")
        head = (f"{i}. [severity {f['severity']}, confidence {f['confidence']}] {_safe(f['title'])}  "
                + saving.replace(" ", "\u00a0"))
        lines += _wrap(head, w, "  ", "     ")
        lines += [dim(x) for x in _wrap(_safe(f["recommendation"]), w, "     fix: ", "          ")]
    if len(findings) > top:
        lines.append(dim(f"  … {len(findings) - top} more in the JSON report"))
    host = [f for f in findings[:top] if f["category"] in HOST_SIDE and f["confidence"] == "low"]
    if host and not s.get("unprofiled_step_time_ms"):
        hint = (f"hint: {', '.join(sorted({_safe(f['category']) for f in host}))} "
                f"{'is' if len(host) == 1 else 'are'} estimated from a host slowed by the profiler (confidence "
                "low); give the step time measured without it, e.g. from training logs: `--step-ms MS`")
        lines += [bold(x) for x in _wrap(hint, w, "  ", "        ")]
    notes = doc.get("notes", [])
    if notes:
        lines.append("")
        lines.append(bold("Notes") + dim(" (checked, save nothing measurable)"))
        for f in notes:
            lines += [dim(x) for x in _wrap(f"{_safe(f['title'])} (~{f['estimated_savings_ms']:.3f} ms/step)",
                                            w, "  - ", "    ")]

    ops = (views or {}).get("operators") or []
    side = bool(ops) and w >= 150  # room for both tables side by side
    kw = w // 2 - 1 if side else w
    tail = _kernel_lines(doc, top, kw, bold, dim)
    if ops:
        op_lines = [bold("Top operators") + " (per step; host = self time)"] + _operator_lines(ops, w - kw - 2
                                                                                            if side else w)
        if side:
            tail = [a + " " * max(0, kw - _visible(a)) + "  " + b
                    for a, b in zip(tail + [""] * (len(op_lines) - len(tail)), op_lines + [""] * (len(tail) - len(op_lines)))]
        else:
            tail += [""] + op_lines
    lines += [""] + [ln.rstrip() for ln in tail]
    return "\n".join(lines) + "\n"


def _kernel_lines(doc: dict[str, Any], top: int, w: int, bold: Any, dim: Any) -> list[str]:
    from gpuprof.reports.names import short_name

    lines = [bold("Top kernels") + " (per step)"]
    rates = w >= 80  # a narrow terminal keeps the name readable rather than the achieved rates
    head = f"  {'ms/step':>8} {'count':>6} {'bound':>8} {'roof%':>6} " + (f"{'TFLOP/s':>8} {'GB/s':>7}  " if rates else " ")
    lines.append(head + "name")
    room = max(12, w - len(head))
    for k in doc.get("kernels", [])[:top]:
        roof = _num(k["roofline_pct"], "{:.0f}") + ("!" if k.get("cost_model_error") else "")
        rate = (f"{_num(k['achieved_tflops'], '{:.1f}'):>8} {_num(k['achieved_gbps'], '{:.0f}'):>7}  " if rates else " ")
        lines.append(f"  {_num(k.get('ms_per_step'), '{:8.3f}'):>8} {k['count']:6d} {k['bound']:>8} {roof:>6} "
                     f"{rate}{_safe(short_name(str(k['name']), room))}")
    if any(k.get("cost_model_error") for k in doc.get("kernels", [])[:top]):
        lines += [dim(x) for x in _wrap("!: some instances ran above their roofline, a cost-model error left out of "
                                        "roof% (see note)", w, "  ", "     ")]
    return lines
