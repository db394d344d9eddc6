"""Overhead of `gpuprof record` on a GPT-style bf16 training loop (run on a GPU machine).

Runs the same loop plain and under `gpuprof record` variants (no NVML; NVML without GPM and byte
counters; everything), timing every step on the GPU timeline with CUDA events (no host
synchronisation inside the loop). Recorded steps are split into early ones (before the profiler
starts), steady ones outside the profiled window, and those inside it. Prints the overhead of
each against the plain run and the NVML sampler's CPU use; writes OUTDIR/overhead.json.

    python benchmarks/record_overhead.py OUTDIR [VARIANT...]   # plain and recorder variants, in order
    GPUPROF_BENCH_BATCH=32 ...                                 # a GPU-bound step (default 8: host-bound)
    python benchmarks/record_overhead.py --loop FILE        # (internal) one run, step times to FILE
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

STEPS = 80
ROOT = Path(__file__).resolve().parents[1]


def loop(out: str) -> None:
    import torch

    sys.path.insert(0, str(ROOT / "sample_traces" / "programs"))
    from gpt import GPT  # the sample-trace GPT: 6 layers, d=768, seq 512, batch 8

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GPT(50304, 6, 768, 12, 512, "sdpa", "fused", 0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    batch = int(os.environ.get("GPUPROF_BENCH_BATCH", "8"))
    data = [torch.randint(0, 50304, (batch, 512), device="cuda") for _ in range(4)]
    events = [torch.cuda.Event(enable_timing=True) for _ in range(STEPS + 1)]
    events[0].record()
    for i in range(STEPS):
        x = data[i % 4]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, torch.roll(x, -1, 1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        events[i + 1].record()
    torch.cuda.synchronize()
    ms = [events[i].elapsed_time(events[i + 1]) for i in range(STEPS)]
    Path(out).write_text(json.dumps(ms))


VARIANTS = {  # name: extra `gpuprof record` options (None = plain run, no recorder)
    "plain": None,
    "record_no_nvml": ["--no-nvml"],
    "record_nvml_basic": ["--no-gpm", "--no-nvml-counters"],
    "record_nvml_full": [],
    "plain_again": None,  # drift check: the plain run once more, last
    "record_nvml_full_again": [],
}


def main(outdir: Path, variants: list[str]) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    res: dict[str, dict[str, object]] = {}
    for name in variants:
        times = outdir / f"{name}.json"
        extra = VARIANTS[name]
        if extra is None:
            subprocess.run([py, __file__, "--loop", str(times)], check=True)
            ms = json.loads(times.read_text())
            res[name] = {"steady_median_ms": statistics.median(ms[29:]), "early_median_ms": statistics.median(ms[1:15])}
            continue
        run = outdir / f"run_{name}"
        subprocess.run([py, "-m", "gpuprof.cli", "record", "--out", str(run), *extra, "--", py, __file__, "--loop",
                        str(times)], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        ms = json.loads(times.read_text())
        m = json.loads((run / "manifest.json").read_text())
        p = m["profiler"]
        # the step that starts the profiler (1-based): the steady-state window ends where the program settles
        first = m["ranks"][0]["profiler_started_at_step"] - 1
        sched = p["schedule"]
        last = first + (sched["wait"] + sched["warmup"] + sched["active"]) * sched["repeat"]
        inside = range(first, last + 2)  # the step after the window pays for the trace export
        res[name] = {
            "early_median_ms": statistics.median(ms[1:15]),  # before the profiler starts
            "steady_median_ms": statistics.median([ms[i - 1] for i in range(30, STEPS + 1) if i not in inside]),
            "inside_window_median_ms": statistics.median([ms[i - 1] for i in inside if i - 1 < len(ms)]),
            "sampler_cpu_pct_of_one_core": m.get("nvml", {}).get("sampler_cpu_pct_of_one_core"),
            "unprofiled_step_ms": m.get("unprofiled_step_ms"),
        }
    base = res.get("plain")
    for name, r in res.items():
        if base and name != "plain":
            for k in ("early", "steady", "inside_window"):
                if f"{k}_median_ms" in r:
                    r[f"{k}_overhead_pct"] = round(100 * (float(r[f"{k}_median_ms"]) /  # type: ignore[arg-type]
                                                       float(base["steady_median_ms" if k != "early" else "early_median_ms"]) - 1), 2)  # type: ignore[arg-type]
        print(name, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
    (outdir / "overhead.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "--loop":
        loop(sys.argv[2])
    else:
        main(Path(sys.argv[1]), sys.argv[2:] or list(VARIANTS))
