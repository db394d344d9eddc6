"""Does ``torch._scaled_mm`` run here, and how fast is it against bf16 on the same shapes?

    python scaled_mm_check.py [--out CHECK.json] [--device cpu --tiny]

For each (M, K, N): a bf16 ``a @ b.T`` and the FP8 product of fp8.py (e4m3 operands, tensorwise
scales; with and without ``use_fast_accum``), each timed over ``--iters`` back-to-back calls between two
CUDA events after ``--warmup`` calls, TFLOP/s = 2MKN / time; also the FP8 result's relative error
against bf16, and how long quantising ``a`` (amax + scale + cast) takes. The shapes are the MLP
GEMMs of fp8_mlp.py (forward and both backward products) and a square 8192^3.
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch
from fp8 import E4M3, E5M2, col_major, quantize, scaled_mm

SHAPES = [(8192, 4096, 16384), (8192, 16384, 4096), (16384, 8192, 4096), (8192, 8192, 8192)]


def timed_ms(fn, iters: int, warmup: int, dev: torch.device) -> float:  # type: ignore[no-untyped-def]
    for _ in range(warmup):
        fn()
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1000.0 / iters


def measure(m: int, k: int, n: int, iters: int, warmup: int, dev: torch.device) -> dict[str, object]:
    """One shape: bf16 and FP8 times, TFLOP/s, the FP8 error, the e5m2 x e4m3 product, a's quantisation."""
    torch.manual_seed(0)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    ref = x @ w.t()
    x8, sx = quantize(x, E4M3)
    w8, sw = quantize(w, E4M3)
    row: dict[str, object] = {"m": m, "k": k, "n": n}
    row["bf16_ms"] = timed_ms(lambda: x @ w.t(), iters, warmup, dev)
    for fast in (False, True):
        key = "fp8_fast_accum" if fast else "fp8"
        try:
            run = functools.partial(scaled_mm, x8, w8.t(), sx, sw, fast_accum=fast)
            out = run()
            row[f"{key}_rel_err"] = float((out.float() - ref.float()).norm() / ref.float().norm())
            row[f"{key}_ms"] = timed_ms(run, iters, warmup, dev)
        except Exception as e:  # noqa: BLE001 -- the check reports what failed and goes on
            row[f"{key}_error"] = f"{type(e).__name__}: {e}"
    try:  # the backward's e5m2 x e4m3 product, as _Fp8Matmul runs it (g @ w with w column-major)
        g8, sg = quantize(ref, E5M2)
        scaled_mm(g8, col_major(w8), sg, sw)
        row["e5m2_x_e4m3"] = "ok"
    except Exception as e:  # noqa: BLE001
        row["e5m2_x_e4m3"] = f"{type(e).__name__}: {e}"
    row["quantize_a_ms"] = timed_ms(lambda: quantize(x, E4M3), iters, warmup, dev)
    for key in ("bf16", "fp8", "fp8_fast_accum"):
        if f"{key}_ms" in row:
            row[f"{key}_tflops"] = 2.0 * m * k * n / (float(row[f"{key}_ms"]) * 1e-3) / 1e12  # type: ignore[arg-type]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    dev = torch.device(a.device)
    shapes = [(256, 128, 512), (256, 512, 128)] if a.tiny else SHAPES
    iters, warmup = (2, 1) if a.tiny else (a.iters, a.warmup)
    rows = []
    for m, k, n in shapes:
        row = measure(m, k, n, iters, warmup, dev)
        rows.append(row)
        print(f"M={m} K={k} N={n}: bf16 {row.get('bf16_tflops', 0):.4g} TFLOP/s, fp8 {row.get('fp8_tflops', 0):.4g}, "
              f"fp8 fast-accum {row.get('fp8_fast_accum_tflops', 0):.4g} (rel. err {row.get('fp8_rel_err', float('nan')):.4f}); "
              f"quantise a {row['quantize_a_ms']:.3f} ms; e5m2 x e4m3: {row['e5m2_x_e4m3']}"
              + "".join(f"; {k_}: {v}" for k_, v in row.items() if k_.endswith("_error")), flush=True)
    doc = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
           "iters": iters, "warmup": warmup, "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
