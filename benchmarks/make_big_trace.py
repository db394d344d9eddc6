"""Make a big trace from a real one by repeating its profiled steps with shifted times and ids.

The output is derived from a real recording (every event is a real event, moved in time, with
External ids and correlations offset so links stay unique); it is for benchmarks only and is
never shipped as a sample trace.

    python benchmarks/make_big_trace.py sample_traces/h200/gpt_bf16.json.gz /tmp/big.json --copies 40
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--copies", type=int, default=10)
    a = p.parse_args()
    raw = Path(a.src).read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    meta = [e for e in doc["traceEvents"] if e not in events]
    t0 = min(e["ts"] for e in events)
    span = max(e["ts"] + e.get("dur", 0) for e in events) - t0 + 100.0
    ids = [e["args"].get(k) for e in events for k in ("External id", "correlation") if isinstance(e.get("args"), dict)]
    id_span = max(i for i in ids if isinstance(i, int)) + 1
    step_names = sorted({e["name"] for e in events if e["name"].startswith("ProfilerStep#")},
                        key=lambda n: int(n.split("#")[1]))
    out = []
    for c in range(a.copies):
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
    doc["traceEvents"] = meta + out
    text = json.dumps(doc).encode()
    Path(a.dst).write_bytes(gzip.compress(text, 1) if a.dst.endswith(".gz") else text)
    print(f"{a.dst}: {len(out)} events, {len(text) / 1e6:.0f} MB of JSON, {a.copies * len(step_names)} steps")


if __name__ == "__main__":
    main()
