"""How much slower the CUDA caching allocator's driver calls run under torch.profiler (issue #24).

The replay's host-speed factor (docs/replay.md, "Allocation calls and the speed factor") assumes the
driver's own time in ``cudaMalloc``/``cudaFree`` is not inflated by the profiler the way Python
dispatch is. This probe measures both in one process, on the GPU it runs on:

- ``empty_cache``: free 40 blocks of 8 MiB, then ``torch.cuda.empty_cache()`` (``cudaFree`` each);
- ``realloc``: allocate the 40 blocks again (``cudaMalloc`` each, the cache being empty);
- ``tiny_ops``: 400 ``x + 1.0`` on a small tensor (Python dispatch and launches, no allocation
  calls beyond the cache's).

Each region is timed with ``time.perf_counter`` between device synchronisations: 5 warm-up
repeats, 30 repeats without the profiler, then 30 under ``torch.profiler`` (CPU and CUDA
activities). Output (``--out``, JSON): per region the median without and with the profiler and
their ratio, plus the ``cudaMalloc``/``cudaFree`` durations in the exported trace.

    python alloc_probe.py --out alloc_probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

BLOCKS = 40
BLOCK_BYTES = 8 << 20
TINY_OPS = 400


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    dev = torch.device("cuda")
    held: list[torch.Tensor] = []
    small = torch.zeros(256, device=dev)

    def fill() -> None:
        held.extend(torch.empty(BLOCK_BYTES, dtype=torch.uint8, device=dev) for _ in range(BLOCKS))

    def free_and_empty() -> None:
        held.clear()
        torch.cuda.empty_cache()

    def tiny() -> None:
        x = small
        for _ in range(TINY_OPS):
            x = x + 1.0

    def timed(region: str, before: Callable[[], None], body: Callable[[], None]) -> float:
        before()
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.profiler.record_function(f"probe::{region}"):
            body()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3

    regions: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
        "empty_cache": (fill, free_and_empty),        # the blocks are allocated outside the timed part
        "realloc": (free_and_empty, fill),            # the cache is empty before the timed part
        "tiny_ops": (lambda: None, tiny),
    }

    def run(n: int) -> dict[str, list[float]]:
        return {r: [timed(r, b, f) for _ in range(n)] for r, (b, f) in regions.items()}

    run(a.warmup)
    plain = run(a.repeats)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        traced = run(a.repeats)
    calls: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:  # the runtime calls as the trace holds them
        path = os.path.join(tmp, "probe.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            for e in json.load(f).get("traceEvents", []):
                if e.get("name") in ("cudaMalloc", "cudaFree") and "dur" in e:
                    calls.setdefault(e["name"], []).append(float(e["dur"]) / 1e3)  # us -> ms
    out = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "blocks": BLOCKS, "block_bytes": BLOCK_BYTES, "tiny_ops": TINY_OPS, "repeats": a.repeats,
        "regions": {
            r: {"plain_ms": statistics.median(plain[r]), "traced_ms": statistics.median(traced[r]),
                "ratio": statistics.median(traced[r]) / statistics.median(plain[r]),
                "plain_all_ms": plain[r], "traced_all_ms": traced[r]}
            for r in regions
        },
        "traced_driver_calls": {
            n: {"count": len(v), "median_ms": statistics.median(v), "total_ms": sum(v)} for n, v in calls.items()
        },
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    for r, v in out["regions"].items():
        print(f"{r:12s} plain {v['plain_ms']:8.3f} ms  traced {v['traced_ms']:8.3f} ms  x{v['ratio']:.2f}")
    for n, v in out["traced_driver_calls"].items():
        print(f"{n:12s} {v['count']} calls, median {v['median_ms'] * 1e3:.1f} us, total {v['total_ms']:.1f} ms")


if __name__ == "__main__":
    main()
