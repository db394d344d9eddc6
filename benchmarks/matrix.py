"""The trace-shape matrix: gpuprof vs. Holistic Trace Analysis 0.5.0 on big traces of six shapes,
each made from real H200 traces in sample_traces/ by repeating their profiled steps
(:mod:`benchmarks.make_big_trace`; benchmark data only, written to a temporary folder):

=====================  ================================================================
kernel-heavy GPT       ``gpt_bf16`` (bf16 GPT training step)
sync-heavy             ``gpt_host_sync`` (``.item()`` every few layers)
many tiny kernels      ``tiny_eager`` (launch-bound MLP in eager mode)
CNN                    ``vision_pinned`` (ResNet-style training step)
NCCL-heavy DDP rank    ``ddp_manual_allreduce/rank0`` (an all-reduce per parameter)
8 ranks of one job     ``ddp_manual_allreduce`` ranks 0/1 as ranks 0-7 (a folder, the size in total)
=====================  ================================================================

For each shape and size (MB of JSON), in one run and interleaved so a slow spell of the machine
hits both tools: ``gpuprof report --format json`` end to end in a fresh process (start-up
included) cold (``--no-cache``), with the parse cache alone (results cache emptied) and with
both caches, each the median of ``--repeat`` runs; HTA the median of ``--hta-repeat`` runs (default one) spread
between gpuprof's rounds (load, then temporal, idle-time and
kernel breakdowns, as ``benchmarks/vs_hta.py``); and the stage breakdown of a cold report with a
bare msgspec typed decode of the same file beside the load (:mod:`benchmarks.stages`; of rank 0
for the 8-rank job). Peak memory is the largest total RSS of the process and all its
descendants (worker processes included, for both tools), sampled every 20 ms. CPU time (user +
system of the process and its descendants) is printed beside wall time: on a machine shared with
other work (2 cores, several sessions) wall time swings several-fold with the load while CPU time
barely moves, so the targets are judged on CPU time (both tools' work is CPU-bound; neither waits
on I/O once the file is in the page cache).

Targets (issue 26, which replaced issue 14's), checked per row (✓/✗) on CPU time: cold ≥ 10× less
CPU than HTA on a single trace and ≥ 5× on a job of several ranks, ≤ 0.5× its peak memory, a
cached re-report < 0.5 s per 100 MB (these three on traces ≥ 50 MB), and the load ≤ 1.5× the bare
decode.

    python -m benchmarks.matrix --hta-python .scratch/hta-venv/bin/python [--sizes 100,400] [--repeat 3]
        [--hta-repeat 3] [--shapes gpt,sync,...] [--json results.json]
    python -m benchmarks.matrix --from results.json     # the table again, from the measurements

HTA 0.5.0 in its own environment: ``python3 -m venv .scratch/hta-venv &&
.scratch/hta-venv/bin/pip install holistictraceanalysis==0.5.0``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.make_big_trace import copies_for, read_doc, repeat_steps, write_doc
from benchmarks.stages import measure as stage_times
from benchmarks.vs_hta import HTA

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "sample_traces" / "h200"

#: key -> (label, source traces, ranks): one source is one trace file; ranks > 1 is a folder of
#: that many rank traces made from the sources in turn.
SHAPES: dict[str, tuple[str, tuple[str, ...], int]] = {
    "gpt": ("kernel-heavy GPT", ("gpt_bf16.json.gz",), 1),
    "sync": ("sync-heavy", ("gpt_host_sync.json.gz",), 1),
    "tiny": ("many tiny kernels", ("tiny_eager.json.gz",), 1),
    "cnn": ("CNN", ("vision_pinned.json.gz",), 1),
    "nccl": ("NCCL-heavy DDP rank", ("ddp_manual_allreduce/rank0.json.gz",), 1),
    "ranks8": ("8 ranks of one job", ("ddp_manual_allreduce/rank0.json.gz", "ddp_manual_allreduce/rank1.json.gz"), 8),
}


def make(shape: str, mb: float, where: Path) -> tuple[Path, Path, int]:
    """The trace (or folder of rank traces) of ``shape`` at about ``mb`` MB, a folder holding
    only it (what HTA reads) and its events."""
    _, sources, n_ranks = SHAPES[shape]
    folder = where / f"{shape}-{mb:g}"
    folder.mkdir(parents=True)
    docs = [read_doc(H200 / s) for s in sources]
    events = 0
    # one count of copies for every rank: the ranks of one job profile the same steps (rank 0's
    # and rank 1's traces differ in size, and at ~350 MB their own counts gave 21 and 18 steps)
    copies = copies_for(docs[0], mb / n_ranks)
    for r in range(n_ranks):
        src = docs[r % len(docs)]
        doc, n, _ = repeat_steps(src, copies)
        if n_ranks > 1:
            doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": n_ranks}
        write_doc(doc, folder / f"rank{r}.json")
        events += n
    return (folder if n_ranks > 1 else folder / "rank0.json"), folder, events


def timed(cmd: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> dict[str, Any]:
    """Wall time of ``cmd`` (run in ``cwd``), the CPU time and peak total RSS of it and its
    descendants; its last stdout line when that is JSON."""
    import resource

    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    peak = 0
    proc = psutil.Process(p.pid)
    while p.poll() is None:
        try:
            tree = [proc, *proc.children(recursive=True)]
            rss = 0
            for q in tree:
                try:
                    rss += q.memory_info().rss
                except psutil.Error:
                    pass
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.02)
    out, err = p.communicate()
    seconds = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # every reaped descendant's CPU time
    if p.returncode != 0:
        return {"error": (err.strip().splitlines() or [f"exit {p.returncode}"])[-1]}
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    res: dict[str, Any] = {"seconds": seconds, "cpu_seconds": cpu, "peak_rss_mb": peak / 2**20}
    last = out.strip().splitlines()[-1] if out.strip() else ""
    if last.startswith("{") and last.endswith("}"):
        try:
            res["child"] = json.loads(last)
        except ValueError:
            pass
    return res


def median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "seconds" in r]
    if not ok:
        return runs[0] if runs else {"error": "not run"}
    ok.sort(key=lambda r: r["seconds"])
    return {**ok[len(ok) // 2], "all_seconds": [round(r["seconds"], 2) for r in ok]}


def hta_rounds(repeat: int, hta_repeat: int) -> list[int]:
    """The gpuprof rounds (0 .. ``repeat`` - 1) after which HTA runs, once per entry: spread evenly
    over the rounds, centred (one run: the middle round), so a slow spell of the machine falls on
    both tools alike."""
    return [((2 * j + 1) * repeat) // (2 * hta_repeat) for j in range(hta_repeat)]


def row(shape: str, mb: float, where: Path, hta_python: str | None, repeat: int,
        earlier: dict[tuple[str, float, int], dict[str, Any]] | None = None, hta_repeat: int = 1) -> dict[str, Any]:
    """One shape at one size: the trace made, both tools timed, the trace deleted (``hta_python``
    None: gpuprof alone, unless ``earlier`` holds HTA's measurement of the same trace). HTA runs
    ``hta_repeat`` times between gpuprof's rounds (:func:`hta_rounds`) and its median run is kept,
    as gpuprof's is."""
    target, folder, events = make(shape, mb, where)
    size = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
    cache = where / f"cache-{shape}-{mb:g}"
    env = {**os.environ, "GPUPROF_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "gpuprof.cli", "report", str(target), "--format", "json"]
    load0 = os.getloadavg()[0]
    timed(cli, env)  # fills both caches
    cold, parsed, cached = [], [], []
    hta: dict[str, Any] = {"error": "not run (no --hta-python)"}
    hta_runs: list[dict[str, Any]] = []
    after = hta_rounds(repeat, hta_repeat)
    for i in range(repeat):
        cold.append(timed([*cli, "--no-cache"], env))
        shutil.rmtree(cache / "results", ignore_errors=True)
        parsed.append(timed(cli, env))
        cached.append(timed(cli, env))
        if hta_python:
            hta_runs += [timed([hta_python, "-c", HTA, str(folder)]) for _ in range(after.count(i))]
    if hta_runs:
        hta = median(hta_runs)
    if hta_python is None and earlier and (shape, mb, events) in earlier:
        hta = earlier[(shape, mb, events)]  # the same generated trace (same shape, size and events)
    stages = stage_times(folder / "rank0.json")
    shutil.rmtree(cache, ignore_errors=True)
    out = {"shape": shape, "label": SHAPES[shape][0], "mb": round(size, 1), "events": events,
           "ranks": SHAPES[shape][2], "cold": median(cold), "parse_cache": median(parsed),
           "results_cache": median(cached), "hta": hta, "stages": stages,
           "load_avg_1m": [round(load0, 1), round(os.getloadavg()[0], 1)]}
    shutil.rmtree(folder, ignore_errors=True)
    return out


def verdicts(r: dict[str, Any]) -> dict[str, bool | None]:
    """Each issue-26 target (module doc): met, missed, or None where it cannot be judged (a run failed)."""
    cold, hta, again = r["cold"], r["hta"], r["results_cache"]
    secs = _stage_cpu(r)
    big = r["mb"] >= 50
    both = "cpu_seconds" in cold and "cpu_seconds" in hta
    return {
        "speed": (hta["cpu_seconds"] / cold["cpu_seconds"] >= (5 if r.get("ranks", 1) > 1 else 10))
        if both and big else None,
        "memory": (cold["peak_rss_mb"] / hta["peak_rss_mb"] <= 0.5) if both and big else None,
        "load": (secs["load"] / secs["bare msgspec decode"] <= 1.5) if "load" in secs else None,
        # per 100 MB: below 50 MB the fixed start-up (Python and imports) is all there is
        "cached": (again["cpu_seconds"] / (r["mb"] / 100) < 0.5) if "cpu_seconds" in again and big else None,
    }


def _stage_cpu(r: dict[str, Any]) -> dict[str, float]:
    """The stage breakdown's CPU seconds (wall seconds from runs made before it recorded CPU)."""
    st = r["stages"] if isinstance(r["stages"], dict) else {}
    out: dict[str, float] = st.get("cpu_seconds") or st.get("seconds") or {}
    return out


def table(rows: list[dict[str, Any]]) -> str:
    def s(x: dict[str, Any], key: str = "seconds", fmt: str = "{:.2f} s") -> str:
        return fmt.format(x[key]) if key in x else f"failed ({x.get('error', '?')[:60]})"

    def t(x: dict[str, Any]) -> str:
        return f"{x['seconds']:.2f} s (cpu {x['cpu_seconds']:.2f})" if "seconds" in x else s(x)

    def mark(v: bool | None) -> str:
        return "" if v is None else (" ✓" if v else " ✗")

    lines = ["| shape | MB | events | gpuprof cold | parse cache | results cache | HTA 0.5.0 | cold vs HTA | "
             "load / bare decode (CPU) | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        v = verdicts(r)
        cold, hta = r["cold"], r["hta"]
        vs = "–"
        if "cpu_seconds" in cold and "cpu_seconds" in hta:
            vs = (f"{hta['cpu_seconds'] / cold['cpu_seconds']:.1f}× less CPU{mark(v['speed'])} "
                  f"({hta['seconds'] / cold['seconds']:.1f}× wall), "
                  f"{cold['peak_rss_mb'] / hta['peak_rss_mb']:.2f}× the memory{mark(v['memory'])}")
        secs = _stage_cpu(r)
        ld = (f"{secs['load']:.2f} / {secs['bare msgspec decode']:.2f} s = "
              f"{secs['load'] / secs['bare msgspec decode']:.2f}×{mark(v['load'])}" if "load" in secs else "–")
        lines.append(
            f"| {r['label']} | {r['mb']:.0f} | {r['events']:,} | {t(cold)}, {s(cold, 'peak_rss_mb', '{:.0f} MB')} | "
            f"{t(r['parse_cache'])} | {t(r['results_cache'])}{mark(v['cached'])} | "
            f"{(t(hta) + ', ' + s(hta, 'peak_rss_mb', '{:.0f} MB') + (' (earlier run)' if 'from' in hta else '')) if 'seconds' in hta else 'not run'} | {vs} | {ld} | "
            f"{r['load_avg_1m'][0]}–{r['load_avg_1m'][1]} |")
    return "\n".join(lines)


def compile_sources() -> None:
    """Bytecode for this tree's modules, as ``pip install`` writes it for an installed package: the
    timed reports run from the source tree, and where ``PYTHONDONTWRITEBYTECODE`` is set (this VM
    sets it) every fresh process would otherwise compile gpuprof's ~100 modules again, which no
    user's install pays and HTA's environment does not (docs/performance.md, 2026-12-04)."""
    import compileall

    for d in ("gpuprof", "analyzers", "reports"):
        compileall.compile_dir(ROOT / d, quiet=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hta-python", help="the Python of an environment with holistictraceanalysis==0.5.0")
    p.add_argument("--sizes", default="100,400", help="MB of JSON per shape, comma-separated")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--repeat", type=int, default=3, help="gpuprof runs per row (median kept)")
    p.add_argument("--hta-repeat", type=int, default=1,
                   help="HTA runs per row, spread over gpuprof's (median kept): its CPU time varies by about "
                        "10 %% between runs on a shared machine, as much as a target's margin")
    p.add_argument("--hta-only", action="append", default=[], metavar="MB=SHAPE[+SHAPE...]",
                   help="at this size run HTA on these shapes only (HTA at 400 MB takes minutes per trace here)")
    p.add_argument("--hta-from", help="a --json file of an earlier run: reuse its HTA measurements of the same "
                   "traces (same shape, size and event count; HTA's code does not change between runs) "
                   "instead of running HTA again")
    p.add_argument("--json", help="also write every measurement here")
    p.add_argument("--tmp", help="folder for the generated traces (default: a temporary one)")
    p.add_argument("--from", dest="from_json", help="print the table of a --json file written before; run nothing")
    a = p.parse_args()
    if a.from_json:
        print(table(json.loads(Path(a.from_json).read_text())))
        return
    rows = []
    t0 = time.monotonic()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} CPUs, "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB", file=sys.stderr)
    hta_only = {float(k): v.split("+") for k, v in (x.split("=", 1) for x in a.hta_only)}
    earlier = None
    if a.hta_from:
        earlier = {(r["shape"], float(r["requested_mb"]), r["events"]): {**r["hta"], "from": f"{a.hta_from} ({r['when']})"}
                   for r in json.loads(Path(a.hta_from).read_text())
                   if "cpu_seconds" in r["hta"] and "requested_mb" in r}
    compile_sources()
    with tempfile.TemporaryDirectory(dir=a.tmp) as d:
        for mb in [float(x) for x in a.sizes.split(",")]:
            for shape in a.shapes.split(","):
                hta = a.hta_python if mb not in hta_only or shape in hta_only[mb] else None
                r = row(shape, mb, Path(d), hta, a.repeat, earlier, a.hta_repeat)
                r["requested_mb"], r["when"] = mb, time.strftime("%Y-%m-%d %H:%M")
                rows.append(r)
                if a.json:  # after every row: a run cut short keeps what it measured
                    Path(a.json).write_text(json.dumps(rows, indent=1))
                print(json.dumps({k: r[k] for k in ("shape", "mb", "cold", "results_cache", "hta")}), file=sys.stderr,
                      flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(table(rows))
    missed = [f"{r['label']} {r['mb']:.0f} MB: {k}" for r in rows for k, v in verdicts(r).items() if v is False]
    print(f"\n{len(rows)} rows in {time.monotonic() - t0:.0f} s; targets missed: {'; '.join(missed) or 'none'}")
    if rows:
        print("median cold CPU time per 100 MB: "
              f"{statistics.median(r['cold'].get('cpu_seconds', 0) / r['mb'] * 100 for r in rows):.2f} s")


if __name__ == "__main__":
    main()
