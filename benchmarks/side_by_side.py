"""Two installs of gpuprof, one cold JSON report each on one generated trace, interleaved in one
run (issue 23's check: the refactored code takes no more CPU than the commit before it).

    python -m benchmarks.side_by_side --python A=/path/to/venv-a/bin/python \
        --python B=/path/to/venv-b/bin/python --shape sync --mb 100 --repeat 3

Each ``--python`` is an interpreter whose ``gpuprof`` is the install to measure, run from a
temporary folder (no source tree on its path: a non-editable install, or an editable one of that
tree). The trace is made by :func:`benchmarks.matrix.make` (real H200 steps repeated); each report
is ``gpuprof report TRACE --format json --no-cache`` with an empty cache, timed as
:func:`benchmarks.matrix.timed` times it (CPU of the process tree, its peak RSS). Prints one JSON line per run and a
median per install.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.matrix import make, timed


def one(python: str, trace: Path, cwd: Path) -> dict[str, Any]:
    """One cold JSON report by ``python``'s gpuprof, run in ``cwd`` (no source tree on its path)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["GPUPROF_CACHE_DIR"] = str(cwd / "cache")
    r = timed([python, "-m", "gpuprof.cli", "report", str(trace), "--format", "json", "--no-cache",
               "-o", str(cwd / f"r{time.monotonic_ns()}.json")], env, cwd)
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", action="append", required=True, help="LABEL=INTERPRETER (twice or more)")
    ap.add_argument("--shape", default="sync")
    ap.add_argument("--mb", type=float, default=100.0)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    installs = [tuple(x.split("=", 1)) for x in a.python]
    with tempfile.TemporaryDirectory(prefix="gpuprof-sbs-") as tmp:
        where = Path(tmp)
        trace, folder, events = make(a.shape, a.mb, where)
        size = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
        print(json.dumps({"shape": a.shape, "mb": round(size, 1), "events": events,
                          "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in installs}
        for i in range(a.repeat):
            for label, python in installs if i % 2 == 0 else installs[::-1]:
                cwd = where / f"run-{label}"
                shutil.rmtree(cwd, ignore_errors=True)
                cwd.mkdir()
                r = one(python, trace, cwd)
                runs[label].append(r)
                print(json.dumps({"install": label, "run": i, **r, "load_1m": round(os.getloadavg()[0], 1)}))
        for label, rs in runs.items():
            ok = sorted((r for r in rs if "cpu_seconds" in r), key=lambda r: r["cpu_seconds"])
            if ok:
                m = ok[len(ok) // 2]
                print(json.dumps({"install": label, "median_cpu_seconds": m["cpu_seconds"],
                                  "all_cpu_seconds": [r["cpu_seconds"] for r in ok]}))


if __name__ == "__main__":
    main()
