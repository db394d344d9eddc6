"""Merge record_interleaved.sh's per-round timings into one NAME.timing.json per program.

    python sample_traces/programs/merge_timings.py OUTDIR NAME [NAME ...]

Reads OUTDIR/NAME.r<round>.timing.json (one process each) and writes OUTDIR/NAME.timing.json:
``step_ms`` is the mean over every window of every round, ``step_ms_runs`` those windows in round
order, ``process_ms`` each process's mean, ``step_ms_sem`` the standard error of the mean over
processes (the processes are the independent samples: windows inside one process agree far better
than processes do; left out where there is only one process), ``spread_pct`` the range of the windows over their mean, and
``profiled_process_ms`` the mean of the windows of the process that recorded the trace.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path


def merge(out: Path, name: str) -> dict[str, object]:
    files = sorted(out.glob(f"{name}.r*.timing.json"), key=lambda p: int(re.findall(r"\.r(\d+)\.", p.name)[0]))
    if not files:
        raise SystemExit(f"{out}: no {name}.r*.timing.json")
    recs = [json.loads(f.read_text()) for f in files]
    runs = [float(x) for r in recs for x in (r.get("step_ms_runs") or [r["step_ms"]])]
    procs = [float(r["step_ms"]) for r in recs]
    profiled = [r for r in recs if not r["argv"]["no_profile"]]
    doc = dict(recs[0])
    doc["argv"] = dict(profiled[0]["argv"] if profiled else recs[0]["argv"])
    doc.update({
        "step_ms": statistics.fmean(runs),
        "step_ms_runs": runs,
        "process_ms": procs,
        "spread_pct": round(100.0 * (max(runs) - min(runs)) / statistics.fmean(runs), 1),
        "profiled_process_ms": float(profiled[0]["step_ms"]) if profiled else None,
        "rounds": len(recs),
    })
    # one process gives no spread between processes: no step_ms_sem then (a 0.0 would read as "no noise";
    # benchmarks/pairs.step_noise_ms falls back to the windows' range)
    doc.pop("step_ms_sem", None)
    if len(procs) > 1:
        doc["step_ms_sem"] = statistics.stdev(procs) / len(procs) ** 0.5
    (out / f"{name}.timing.json").write_text(json.dumps(doc, indent=1))
    return doc


def main() -> None:
    out = Path(sys.argv[1])
    for name in sys.argv[2:]:
        d = merge(out, name)
        print(f"{name}: {d['step_ms']:.3f} ms, sem {d.get('step_ms_sem', float('nan')):.3f}, processes "
              + ", ".join(f"{x:.2f}" for x in d["process_ms"]))  # type: ignore[union-attr]


if __name__ == "__main__":
    main()
