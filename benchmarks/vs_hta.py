"""gpuprof vs. Holistic Trace Analysis 0.5.0 on the same trace, side by side, in one run.

gpuprof: the command `gpuprof report --format json --no-cache` end to end (start-up and imports
included), then with the parse cache warm (results cache emptied), then with both caches warm. HTA: load the trace and compute its
temporal, idle-time and kernel breakdowns (those that raise are listed, not timed out: HTA 0.5.0's
temporal breakdown asserts on torch 2.11 traces seen here). Each runs in a fresh process; wall time and peak RSS
are measured. HTA is a benchmark-only dependency: give the Python of an environment that has it.

    python benchmarks/vs_hta.py TRACE.json[.gz] --hta-python /path/to/venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

MEASURE = r"""
import json, resource, subprocess, sys, time
t = time.perf_counter()
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
if r.returncode:
    sys.exit(r.stderr)
print(json.dumps({"seconds": time.perf_counter() - t,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""

HTA = r"""
import json, resource, sys, time
t = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
loaded = time.perf_counter() - t
failed = []
for name in ("get_temporal_breakdown", "get_idle_time_breakdown", "get_gpu_kernel_breakdown"):
    try:
        getattr(a, name)(visualize=False)
    except Exception as e:  # HTA 0.5.0 asserts on some torch 2.11 traces; record it and go on
        failed.append(f"{name}: {e.__class__.__name__}")
print(json.dumps({"seconds": time.perf_counter() - t, "load_seconds": loaded, "failed": failed,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(py: str, code: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    r = subprocess.run([py, "-c", code, *args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median time, with every run's seconds beside it."""
    ok = sorted((r for r in runs if "seconds" in r), key=lambda r: r["seconds"])
    if not ok:
        return runs[0]
    return {**ok[len(ok) // 2], "all_seconds": [round(r["seconds"], 2) for r in runs if "seconds" in r]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--hta-python", required=True)
    p.add_argument("--repeat", type=int, default=3, help="gpuprof runs (median kept); HTA runs once between them")
    a = p.parse_args()
    mb = Path(a.trace).stat().st_size / 1e6
    cli = [sys.executable, "-m", "gpuprof.cli", "report", a.trace, "--format", "json"]
    cold, parsed, cached = [], [], []
    theirs: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as cache:
        shutil.copy(a.trace, Path(d) / ("rank0" + "".join(Path(a.trace).suffixes)))  # HTA reads a folder
        env = {**os.environ, "GPUPROF_CACHE_DIR": cache}
        run(sys.executable, MEASURE, *cli, env=env)  # fills the cache
        for i in range(a.repeat):  # interleaved, so a slower spell of the machine hits both tools
            cold.append(run(sys.executable, MEASURE, *cli, "--no-cache"))
            shutil.rmtree(Path(cache) / "results", ignore_errors=True)  # the parse cache alone
            parsed.append(run(sys.executable, MEASURE, *cli, env=env))
            cached.append(run(sys.executable, MEASURE, *cli, env=env))  # parse and results caches
            if i == a.repeat // 2:
                theirs = run(a.hta_python, HTA, d)
    mine, warm, again = median_run(cold), median_run(parsed), median_run(cached)
    print(json.dumps({"trace_mb": round(mb, 1), "gpuprof": mine, "gpuprof_parse_cache": warm,
                      "gpuprof_results_cache": again, "hta": theirs}, indent=1))
    if "seconds" in mine and "seconds" in theirs:
        print(f"{mb:.0f} MB trace: gpuprof {mine['seconds']:.1f} s, {mine['peak_rss_mb']:.0f} MB (parse cache "
              f"{warm.get('seconds', float('nan')):.1f} s, results cache {again.get('seconds', float('nan')):.2f} s); "
              f"HTA {theirs['seconds']:.1f} s, "
              f"{theirs['peak_rss_mb']:.0f} MB: {theirs['seconds'] / mine['seconds']:.1f}x faster, "
              f"{mine['peak_rss_mb'] / theirs['peak_rss_mb']:.2f}x the memory")


if __name__ == "__main__":
    main()
