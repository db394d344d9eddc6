"""Make a big trace from a real one by repeating its profiled steps with shifted times and ids.

The output is derived from a real recording (every event is a real event, moved in time, with
External ids and correlations offset so links stay unique); it is for benchmarks only and is
never shipped as a sample trace.

    python benchmarks/make_big_trace.py sample_traces/h200/gpt_bf16.json.gz /tmp/big.json --copies 40
    python benchmarks/make_big_trace.py sample_traces/h200/gpt_bf16.json.gz /tmp/big.json --mb 100
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any


def read_doc(src: str | Path) -> dict[str, Any]:
    raw = Path(src).read_bytes()
    doc: dict[str, Any] = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return doc


def repeat_steps(doc: dict[str, Any], copies: int) -> tuple[dict[str, Any], int, int]:
    """``doc`` with its timed events repeated ``copies`` times, each copy shifted past the last in
    time, ids and ``ProfilerStep#`` numbers. Returns (document, events, steps)."""
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    ids_in = set(map(id, events))
    meta = [e for e in doc["traceEvents"] if id(e) not in ids_in]
    t0 = min(e["ts"] for e in events)
    span = max(e["ts"] + e.get("dur", 0) for e in events) - t0 + 100.0
    ids = [e["args"].get(k) for e in events for k in ("External id", "correlation") if isinstance(e.get("args"), dict)]
    id_span = max(i for i in ids if isinstance(i, int)) + 1
    step_names = sorted({e["name"] for e in events if e["name"].startswith("ProfilerStep#")},
                        key=lambda n: int(n.split("#")[1]))
    out = []
    for c in range(copies):
        for e in events:
            f = dict(e)
            f["ts"] = round(e["ts"] + c * span, 3)
            if isinstance(e.get("args"), dict):
                args = dict(e["args"])
                for k in ("External id", "correlation"):
                    if isinstance(args.get(k), int):
                        args[k] += c * id_span
                f["args"] = args
            if f["name"] in step_names:
                f["name"] = f"ProfilerStep#{int(f['name'].split('#')[1]) + c * len(step_names)}"
            out.append(f)
    return {**doc, "traceEvents": meta + out}, len(out), copies * len(step_names)


def write_doc(doc: dict[str, Any], dst: str | Path) -> int:
    """Write ``doc`` (gzip level 1 when ``dst`` ends in .gz); returns the JSON's size in bytes."""
    text = json.dumps(doc).encode()
    Path(dst).write_bytes(gzip.compress(text, 1) if str(dst).endswith(".gz") else text)
    return len(text)


def copies_for(doc: dict[str, Any], mb: float) -> int:
    """How many copies of ``doc``'s steps make about ``mb`` MB of JSON."""
    one = len(json.dumps(repeat_steps(doc, 1)[0]).encode()) / 1e6
    return max(1, round(mb / one))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--copies", type=int, default=10)
    p.add_argument("--mb", type=float, help="make about this many MB of JSON instead of --copies")
    a = p.parse_args()
    src = read_doc(a.src)
    copies = copies_for(src, a.mb) if a.mb else a.copies
    doc, n_events, n_steps = repeat_steps(src, copies)
    size = write_doc(doc, a.dst)
    print(f"{a.dst}: {n_events} events, {size / 1e6:.0f} MB of JSON, {n_steps} steps")


if __name__ == "__main__":
    main()
