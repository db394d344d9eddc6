"""Ranks vs. time: `gpuprof report --format json` on a folder of N rank traces, with 1 and with
several worker processes. The rank traces are copies of one real rank trace, re-ranked in their
file names (benchmark data only, never shipped as samples).

    python benchmarks/ranks.py TRACE N [N ...]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(trace: str, counts: list[int]) -> None:
    print(f"{'ranks':>6} {'workers':>8} {'seconds':>8}")
    for n in counts:
        with tempfile.TemporaryDirectory() as d:
            for r in range(n):
                shutil.copy(trace, Path(d) / f"trace_rank{r}.json.gz")
            for workers in (1, None):
                t = time.perf_counter()
                args = [sys.executable, "-m", "gpuprof.cli", "report", d, "--format", "json", "--no-cache"]
                args += ["--workers", str(workers)] if workers else []
                subprocess.run(args, check=True, capture_output=True)
                print(f"{n:6d} {workers or 'all':>8} {time.perf_counter() - t:8.2f}")


if __name__ == "__main__":
    main(sys.argv[1], [int(x) for x in sys.argv[2:]] or [2, 4, 8])
