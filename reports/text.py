"""The terminal summary: step time, MFU, where the time goes, what to fix first, top kernels.

Names from traces are user data: control characters are shown escaped (``\\x1b``) so a kernel
name cannot move the cursor, recolour the terminal or write the clipboard. Colour only when asked
(the CLI asks on a TTY without ``NO_COLOR``).
"""

from __future__ import annotations

import re
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


def render_text(doc: dict[str, Any], color: bool = False, top: int = 10) -> str:
    bold = (lambda s: f"\x1b[1m{s}\x1b[0m") if color else (lambda s: s)
    dim = (lambda s: f"\x1b[2m{s}\x1b[0m") if color else (lambda s: s)
    s = doc["summary"]
    gpu = doc["gpu"]
    lines = [
        bold(f"gpuprof {doc['tool']['version']}") + f"  {_safe(gpu['name'])}"
        + (f" ({_safe(gpu['spec']['source'])})" if gpu["spec"].get("source") else ""),
        (f"ranks {len(doc['source']['ranks'])}   steps {s['steps']} ({_safe(s['steps_source'])})   "
         f"step time {bold(_num(s['step_time_ms'], '{:.2f} ms'))}   GPU busy {_num(s['gpu_busy_pct'], '{:.1f}%')}   "
         f"MFU {bold(_num(s['mfu_pct'], '{:.1f}%', 'n/a'))}"),
    ]
    b = s["breakdown_pct"]
    parts = [f"{k} {v:.1f}%" for k, v in sorted(b.items(), key=lambda kv: -(kv[1] or 0)) if v and v >= 0.05]
    lines.append("time: " + ", ".join(parts))
    for w in doc.get("warnings", []):
        lines.append(dim(f"note: {_safe(w)}"))

    lines.append("")
    lines.append(bold("What to fix first"))
    findings = doc.get("findings", [])
    if not findings:
        lines.append("  no findings" + (" (analyzers skipped: " + ", ".join(
            _safe(x["analyzer"]) for x in doc.get("analyzers_skipped", [])) + ")" if doc.get("analyzers_skipped") else ""))
    for i, f in enumerate(findings[:top], 1):
        saving = (f"saves ~{f['estimated_savings_ms']:.2f} ms/step ({f['estimated_savings_pct']:.1f}%)"
                  if f["estimated_savings_ms"] > 0 else "informational")
        lines.append(f"  {i}. [{f['severity']}] {_safe(f['title'], 90)}  {saving}")
        lines.append(dim(f"     fix: {_safe(f['recommendation'], 110)}"))

    lines.append("")
    lines.append(bold("Top kernels"))
    lines.append(f"  {'time ms':>9} {'count':>6} {'bound':>8} {'roof%':>6} {'TFLOP/s':>8} {'GB/s':>7}  name")
    for k in doc.get("kernels", [])[:top]:
        lines.append(f"  {k['total_us'] / 1000:9.2f} {k['count']:6d} {k['bound']:>8} {_num(k['roofline_pct'], '{:.0f}'):>6} "
                     f"{_num(k['achieved_tflops'], '{:.1f}'):>8} {_num(k['achieved_gbps'], '{:.0f}'):>7}  {_safe(k['name'], 70)}")
    return "\n".join(lines) + "\n"
