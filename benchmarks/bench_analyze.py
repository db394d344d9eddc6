"""Time and memory of `gpuprof report --format json` on given traces, one fresh process per trace.

Prints, per trace: file size, events, load time, analysis time (roofline, steps, kernel table,
JSON), and the process's peak resident memory. Targets live in docs/performance.md.

    python benchmarks/bench_analyze.py sample_traces/h200/gpt_bf16.json.gz [more traces...]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from gpuprof.trace.load import load_trace
from gpuprof import analyze
import gpuprof.api as api
t_import = time.perf_counter() - t0
path = sys.argv[1]
t2 = time.perf_counter()
a = analyze(path)
doc = a.to_json()
t_total = time.perf_counter() - t2
rss_report = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t1 = time.perf_counter()
trace = load_trace(path)  # the load alone, a second time: the analysis is the difference
t_load = time.perf_counter() - t1
print(json.dumps({"events": trace.meta.events, "kernels": len(trace.kernels), "load_s": t_load,
                  "report_s": t_total, "analysis_s": max(t_total - t_load, 0.0), "import_s": t_import,
                  "peak_rss_mb": rss_report}))
"""


def main(paths: list[str]) -> None:
    print(f"{'trace':40} {'MB':>7} {'events':>10} {'load s':>7} {'analysis s':>10} {'report s':>8} {'peak RSS MB':>11}")
    for p in paths:
        r = subprocess.run([sys.executable, "-c", CHILD, p], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{p}: failed: {r.stderr.strip().splitlines()[-1]}")
            continue
        m = json.loads(r.stdout)
        mb = Path(p).stat().st_size / 1e6
        print(f"{Path(p).name[:40]:40} {mb:7.1f} {m['events']:10d} {m['load_s']:7.2f} {m['analysis_s']:10.2f} "
              f"{m['report_s']:8.2f} {m['peak_rss_mb']:11.0f}")


if __name__ == "__main__":
    main(sys.argv[1:] or [str(Path(__file__).resolve().parents[1] / "sample_traces" / "h200" / "gpt_bf16.json.gz")])
