"""Overhead of `gpuprof record` on a GPT-style bf16 training loop (run on a GPU machine).

Runs the same loop twice — plain, then under `gpuprof record` — and times every step on the GPU
timeline with CUDA events (no host synchronisation inside the loop). Under the recorder, steps
are split into those outside the profiled window and those inside it (the recorder's rank
record says which). Prints the overhead outside and inside the window and the NVML sampler's CPU
use, and writes OUTDIR/overhead.json.

    python benchmarks/record_overhead.py OUTDIR            # both runs
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
    data = [torch.randint(0, 50304, (8, 512), device="cuda") for _ in range(4)]
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


def main(outdir: Path) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    subprocess.run([py, __file__, "--loop", str(outdir / "plain.json")], check=True)
    run = outdir / "run"
    subprocess.run([py, "-m", "gpuprof.cli", "record", "--out", str(run), "--", py, __file__, "--loop",
                    str(outdir / "recorded.json")], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    plain = json.loads((outdir / "plain.json").read_text())
    rec = json.loads((outdir / "recorded.json").read_text())
    m = json.loads((run / "manifest.json").read_text())
    p = m["profiler"]
    first = p["skip_steps"] + p["timed_steps"] + 1  # the step that starts the profiler (1-based)
    sched = p["schedule"]
    last = first + (sched["wait"] + sched["warmup"] + sched["active"]) * sched["repeat"]
    inside = range(first, last + 2)  # the step after the window pays for the trace export
    steady = range(30, STEPS)  # both runs warmed up
    out_rec = [rec[i - 1] for i in steady if i not in inside]
    in_rec = [rec[i - 1] for i in inside if i - 1 < len(rec)]
    base = statistics.median(plain[29:])
    res = {
        "plain_median_ms": base, "recorded_outside_window_median_ms": statistics.median(out_rec),
        "recorded_inside_window_median_ms": statistics.median(in_rec),
        "overhead_outside_window_pct": 100 * (statistics.median(out_rec) / base - 1),
        "overhead_inside_window_pct": 100 * (statistics.median(in_rec) / base - 1),
        "sampler_cpu_pct_of_one_core": m["nvml"].get("sampler_cpu_pct_of_one_core"),
        "nvml_samples": m["nvml"].get("samples"), "nvml_hz": m["nvml"].get("hz"),
        "nvml_unavailable": m["nvml"].get("unavailable"),
        "plain_ms": plain, "recorded_ms": rec, "window_steps": [first, last],
    }
    (outdir / "overhead.json").write_text(json.dumps(res, indent=1))
    for k, v in res.items():
        if not isinstance(v, list):
            print(f"{k}: {v}")


if __name__ == "__main__":
    if sys.argv[1] == "--loop":
        loop(sys.argv[2])
    else:
        main(Path(sys.argv[1]))
