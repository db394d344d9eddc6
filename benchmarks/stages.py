"""Where a cold report's time goes: each stage and each analyzer, timed on one trace.

Stages, in the order ``gpuprof report --no-cache`` runs them on a single trace: ``load`` (decode
and frames, :func:`gpuprof.trace.load.load_trace`), ``cost model + roofline``
(:func:`gpuprof.roofline.classify`, which prices every op through :mod:`gpuprof.costmodel`),
``timeline`` (:func:`gpuprof.timeline.summarize`), ``rank summary`` (:func:`gpuprof.parts.part_of`),
``rank view (idle gaps)`` (:class:`gpuprof.rank.RankView`, shared by the analyzers), then every
analyzer of the registry alone, ``claims``, ``replay plan`` (the rank's graph and its host model,
:func:`gpuprof.replay.fixes.plan`), ``pricing`` (every fix replayed alone,
:func:`gpuprof.pricing.price_rank`) and the JSON report. Beside the load: a bare msgspec typed decode of
the same file (read, gunzip, decode into structs of the fields gpuprof reads, nothing else),
the floor the loader is measured against. Each trace runs in a fresh process; with ``--json``
the figures are printed as one JSON object per trace (``benchmarks/matrix.py`` reads them).

A regression in one analyzer shows as its own line growing, whatever the others do.

    python -m benchmarks.stages sample_traces/h200/gpt_host_sync.json.gz [more traces...] [--json]
    python -m benchmarks.stages TRACE --against OTHER_VENV/bin/python --repeat 5

With ``--against`` each trace is timed by this tree's gpuprof and by the one ``OTHER`` imports (run
from a temporary folder, so no source tree shadows its install), interleaved ``--repeat`` times
(the order swapped each round: this 2-core machine drifts by ±20 %), and the median CPU time of
each stage is printed for both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import gc, gzip, json, resource, sys, time
from typing import Any
import msgspec

path = sys.argv[1]
times = {}
cpu = {}  # CPU time of this process per stage: on a shared machine the steadier figure

class Args(msgspec.Struct):
    external_id: Any = msgspec.field(default=None, name="External id")
    correlation: Any = None
    stream: Any = None
    device: Any = None
    grid: Any = None
    block: Any = None
    registers: Any = msgspec.field(default=None, name="registers per thread")
    shared_memory: Any = msgspec.field(default=None, name="shared memory")
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    input_strides: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Strides")
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")
    sequence_number: Any = msgspec.field(default=None, name="Sequence number")
    fwd_thread_id: Any = msgspec.field(default=None, name="Fwd thread id")
    bytes: Any = None
    collective_name: Any = msgspec.field(default=None, name="Collective name")
    in_msg_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_msg_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    name: Any = None

class Event(msgspec.Struct):
    ph: Any = None
    cat: Any = None
    name: str = ""
    pid: Any = 0
    tid: Any = 0
    ts: Any = None
    dur: Any = 0.0
    args: Args | None = None

class Doc(msgspec.Struct):
    traceEvents: list[Event] = []
    deviceProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None

def bare() -> int:
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return len(msgspec.json.decode(raw, type=Doc).traceEvents)

gc.disable()  # as load_trace does: a decode of millions of small objects must not pay for GC passes
t, c = time.perf_counter(), time.process_time(); n_events = bare()
times["bare msgspec decode"], cpu["bare msgspec decode"] = time.perf_counter() - t, time.process_time() - c
gc.enable(); gc.collect()

import gpuprof
from gpuprof import pricing
from gpuprof.analysis import Result
from gpuprof.analyzers import select
from gpuprof.api import Analysis
from gpuprof import claims as claims_module
from gpuprof.parts import part_of
from gpuprof.pipeline import findings_of
from gpuprof.rank import RankResult, RankView
from gpuprof.replay import fixes
from gpuprof.roofline import classify
from gpuprof.specs import resolve
from gpuprof.timeline import summarize
from gpuprof.trace.load import load_trace
from gpuprof import strings
strings.own_process()  # as `gpuprof report` runs (gpuprof/strings.py)

def stage(name, fn):
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    times[name] = times.get(name, 0.0) + time.perf_counter() - t
    cpu[name] = cpu.get(name, 0.0) + time.process_time() - c
    return out

trace = stage("load", lambda: load_trace(path))
spec = resolve(trace.meta.device_properties)
roof = stage("cost model + roofline", lambda: classify(trace, spec))
summary = stage("timeline", lambda: summarize(trace.steps, trace.kernels, roof, trace.memcpys, spec))
r = RankResult(trace, roof, summary)
part = stage("rank summary", lambda: part_of(r))
active, _ = select((part,), spec)
view = stage("rank view (idle gaps)", lambda: RankView(r, spec))
cands = []
for an in active:
    if an.run is not None:
        cands.extend(stage("analyzer " + an.name, lambda: an.run(view)))
# as jobs.analyse_rank: one assignment of the units for both (a tree before rank_claims assigned twice)
rank_claims = getattr(claims_module, "rank_claims", None)
if rank_claims is not None:
    claims, shares = stage("claims", lambda: rank_claims(part.rank, cands, part.n_steps))
else:
    claims = stage("claims", lambda: claims_module.claimed(cands, part.n_steps))
    shares = None
plan = stage("replay plan", lambda: fixes.plan(view, claims, None))
contribs = stage("pricing", lambda: pricing.price_rank(
    plan, shares if shares is not None else claims_module.claim(part.rank, cands, part.n_steps), part))
findings = findings_of((part,), contribs)
a = Analysis.of(Result(parts=(part,), spec=spec, findings=tuple(findings), frames=(r,), claims=(claims,)))
stage("json report", lambda: a.to_json())
print(json.dumps({"events": n_events, "kernels": len(trace.kernels), "seconds": times, "cpu_seconds": cpu,
                  "findings": [f.id for f in findings],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(path: str | Path, python: str = sys.executable, cwd: str | Path = ROOT) -> dict[str, object]:
    """The stage times of one trace, in a fresh process (run in ``cwd``: this tree, whose gpuprof
    it imports, unless another install is timed)."""
    r = subprocess.run([python, "-c", CHILD, str(Path(path).resolve())], capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]}
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+")
    p.add_argument("--json", action="store_true", help="one JSON object per trace instead of a table")
    p.add_argument("--against", help="another Python whose gpuprof is timed beside this tree's, interleaved")
    p.add_argument("--repeat", type=int, default=1, help="with --against: rounds per trace (medians printed)")
    a = p.parse_args()
    if a.against:
        for path in a.traces:
            against(path, a.against, a.repeat)
        return
    for path in a.traces:
        m = measure(path)
        if a.json:
            print(json.dumps({"trace": path, **m}))
            continue
        print(f"{path}: {Path(path).stat().st_size / 1e6:.1f} MB, {m.get('events', '?')} events")
        if "error" in m:
            print(f"  failed: {m['error']}")
            continue
        secs, cpu = m["seconds"], m["cpu_seconds"]
        assert isinstance(secs, dict) and isinstance(cpu, dict)
        total = sum(v for k, v in cpu.items() if k != "bare msgspec decode")
        print(f"  {'':34} {'wall':>8}    {'CPU':>8}")
        for k, v in secs.items():
            share = "" if k == "bare msgspec decode" else f"{100 * cpu[k] / total:5.1f} % of CPU"
            print(f"  {k:34} {v:8.3f} s  {cpu[k]:8.3f} s  {share}")
        print(f"  {'total (without the bare decode)':34} {sum(secs.values()) - secs['bare msgspec decode']:8.3f} s  "
              f"{total:8.3f} s  peak RSS {m['peak_rss_mb']:.0f} MB")
        print(f"  load / bare decode: {cpu['load'] / cpu['bare msgspec decode']:.2f}x CPU time "
              f"({secs['load'] / secs['bare msgspec decode']:.2f}x wall)")


def against(path: str, other: str, repeat: int) -> None:
    """Median CPU per stage of ``path`` by this tree's gpuprof and ``other``'s, interleaved."""
    runs: dict[str, list[dict[str, float]]] = {"this": [], "against": []}
    with tempfile.TemporaryDirectory(prefix="gpuprof-stages-") as tmp:
        for i in range(repeat):
            order = [("this", sys.executable, ROOT), ("against", other, Path(tmp))]
            for label, python, cwd in order if i % 2 == 0 else order[::-1]:
                m = measure(path, python, cwd)
                if "error" in m:
                    print(f"{path}: {label} failed: {m['error']}")
                    return
                cpu = m["cpu_seconds"]
                assert isinstance(cpu, dict)
                runs[label].append(cpu)
    print(f"{path}: median CPU of {repeat} interleaved runs (this tree / {other})")
    for k in runs["this"][0]:
        this = [r[k] for r in runs["this"]]
        other_s = [r.get(k, float("nan")) for r in runs["against"]]
        print(f"  {k:34} {statistics.median(this):8.3f} s  {statistics.median(other_s):8.3f} s   "
              f"(this {', '.join(f'{x:.2f}' for x in this)}; against {', '.join(f'{x:.2f}' for x in other_s)})")
    total = [sum(v for k, v in r.items() if k != "bare msgspec decode") for r in runs["this"]]
    total_o = [sum(v for k, v in r.items() if k != "bare msgspec decode") for r in runs["against"]]
    print(f"  {'total (without the bare decode)':34} {statistics.median(total):8.3f} s  {statistics.median(total_o):8.3f} s")


if __name__ == "__main__":
    main()
