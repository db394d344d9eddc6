"""The trace load against a bare msgspec typed decode, native scanner vs the msgspec path (issue 26).

For each trace, in fresh processes and interleaved so that a slow spell of a shared machine hits
every variant alike:

- ``ratio``: the bare msgspec typed decode of :mod:`benchmarks.stages` (read, gunzip, decode into
  structs of the fields gpuprof reads), then :func:`gpuprof.trace.load.load_trace`, in one
  process, as ``benchmarks.stages`` measures them side by side; once with the native scanner
  (``new``) and once with it switched off (``old``: the msgspec path, which is main's loader
  before issue 26 moved into ``gpuprof.trace.chunks.from_chunks``; or, with ``--old-src DIR``, the loader of
  another source tree, e.g. ``git archive main | tar -x -C DIR``);
- ``peak``: the load alone in a fresh process (no bare decode before it), its peak RSS
  (``VmHWM``) less that of the same process just before the load (the imports).

CPU time (``process_time``) is the figure: on a 2-core machine shared with other work wall time
swings with the load while CPU time barely moves. Each figure is the minimum of ``--repeat``
runs. The traces are made by ``benchmarks.matrix``'s shapes (real H200 steps repeated), in a
temporary folder, unless given as paths.

    python -m benchmarks.load_paths --sizes 100,350 [--shapes gpt,sync,...] [--repeat 3] [--json out.json]
    python -m benchmarks.load_paths TRACE [TRACE...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.stages import CHILD

ROOT = Path(__file__).resolve().parents[1]

_BARE = CHILD.split("import gpuprof\n")[0]  # the bare decode of benchmarks.stages, timed into cpu[...]
_LOAD = r'''
def hwm():  # this process's peak RSS, MB (VmHWM starts anew at exec; ru_maxrss keeps the parent's)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
from gpuprof.trace import load
if MODE == "old":
    try:
        from gpuprof.trace import columnar
        columnar.scan = lambda data: None  # the msgspec path
    except ImportError:  # a tree from before the scanner (--old-src)
        pass
before = hwm()
c = time.process_time()
trace = load.load_trace(path)
cpu["load"] = time.process_time() - c
cpu["peak_mb"] = hwm() - before
cpu["rss_mb"] = hwm()
cpu["events"] = trace.meta.events
print(json.dumps(cpu))
'''


def _child(path: Path, mode: str, bare: bool, old_src: str | None) -> dict[str, float]:
    code = (_BARE if bare else "import gc, json, sys, time\npath = sys.argv[1]\ncpu = {}\n") + \
        f"MODE = {mode!r}\n" + ("gc.disable()\n" if not bare else "") + _LOAD
    env = {**os.environ, "PYTHONPATH": old_src if (mode == "old" and old_src) else str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, cwd="/")
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
    out: dict[str, float] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def measure(path: Path, repeat: int, old_src: str | None = None) -> dict[str, Any]:
    """Minimum over ``repeat`` interleaved rounds of each figure, for one trace."""
    path = path.resolve()
    runs: dict[str, list[float]] = {k: [] for k in ("bare", "bare_old", "new", "old", "new_peak", "old_peak",
                                                    "new_rss", "old_rss")}
    for _ in range(repeat):
        for mode in ("new", "old"):
            r = _child(path, mode, True, old_src)
            runs["bare" if mode == "new" else "bare_old"].append(r["bare msgspec decode"])
            runs[mode].append(r["load"])
            p = _child(path, mode, False, old_src)
            runs[f"{mode}_peak"].append(p["peak_mb"])
            runs[f"{mode}_rss"].append(p["rss_mb"])
    out: dict[str, Any] = {k: min(v) for k, v in runs.items()}
    out["runs"] = runs
    # both processes run the same bare decode: its minimum over all of them is the floor
    out["bare"] = min(out["bare"], out["bare_old"])
    out["ratio_new"] = out["new"] / out["bare"]
    out["ratio_old"] = out["old"] / out["bare"]
    out["mb"] = path.stat().st_size / 1e6
    out["events"] = int(r["events"])
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| shape | MB | events | bare decode | old load | new load | new / bare | old / bare | "
             "peak RSS of the load, old → new |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = "✓" if r["ratio_new"] <= 1.5 else "✗"
        lines.append(f"| {r['label']} | {r['mb']:.0f} | {r.get('events', 0):,} | {r['bare']:.2f} s | {r['old']:.2f} s | "
                     f"{r['new']:.2f} s | **{r['ratio_new']:.2f}×** {mark} | {r['ratio_old']:.2f}× | "
                     f"{r['old_rss']:.0f} → {r['new_rss']:.0f} MB (load alone: +{r['old_peak']:.0f} → "
                     f"+{r['new_peak']:.0f} MB) |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="*", help="trace files (default: make the shapes of benchmarks.matrix)")
    p.add_argument("--sizes", default="100", help="MB of JSON per shape, comma-separated")
    p.add_argument("--shapes", default="gpt,sync,tiny,cnn,nccl,ranks8")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--old-src", help="a source tree whose loader is 'old' (default: this one, scanner off)")
    p.add_argument("--json", help="also write the measurements here")
    p.add_argument("--tmp", help="folder for the generated traces (default: a temporary one)")
    a = p.parse_args()
    rows: list[dict[str, Any]] = []
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
          file=sys.stderr)

    def one(path: Path, label: str, events: int, extra: dict[str, Any]) -> None:
        r = {"label": label, "trace": str(path), **extra, **measure(path, a.repeat, a.old_src),
             "load_avg_1m": round(os.getloadavg()[0], 1)}
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "runs"}), file=sys.stderr, flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(rows, indent=1))

    if a.traces:
        for t in a.traces:
            one(Path(t).resolve(), Path(t).name, 0, {})
    else:
        import shutil

        from benchmarks.matrix import SHAPES, make

        with tempfile.TemporaryDirectory(dir=a.tmp) as d:
            for mb in [float(x) for x in a.sizes.split(",")]:
                for shape in a.shapes.split(","):
                    target, folder, events = make(shape, mb, Path(d))
                    rank0 = folder / "rank0.json"  # of the 8-rank job: rank 0, as benchmarks.matrix's stages
                    label = SHAPES[shape][0] + (" (rank 0 of 8)" if SHAPES[shape][2] > 1 else "")
                    one(rank0, label, events, {"shape": shape, "requested_mb": mb})
                    shutil.rmtree(folder, ignore_errors=True)
    print(table(rows))


if __name__ == "__main__":
    main()
