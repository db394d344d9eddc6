"""Measure what channels-last does to batch norm on this GPU: training forward + backward of
``nn.BatchNorm2d`` on NCHW vs channels-last inputs, per dtype, over ResNet-like sizes.

The memory_format analyzer prices a trace's NCHW batch-norm kernels with these ratios (the
channels-last time over the NCHW time at the nearest size, interpolated in log elements); without
the table it reports their saving only as an upper bound. bf16 rows run bf16 activations with FP32
parameters, as autocast does. Each timing is the median of CUDA-event windows over ``INNER``
forward+backward iterations after warm-up; host launch time inside a window affects both layouts
alike and pulls small sizes' ratios towards 1, so the table errs on the side of a smaller saving.

On a GPU machine (writes the file the analyzer reads; needs torch with CUDA):

    python -m benchmarks.layout_table gpuprof/data/h200_layout_table.json
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

SHAPES = ((64, 64, 112, 112), (64, 64, 56, 56), (64, 256, 56, 56), (64, 128, 28, 28), (64, 512, 28, 28),
          (64, 256, 14, 14), (64, 1024, 14, 14), (64, 512, 7, 7), (64, 2048, 7, 7), (16, 256, 14, 14))
INNER = 10


def _median_us(fn: Callable[[], object], warmup: int = 3, repeat: int = 7) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(INNER):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / INNER)
    return float(statistics.median(times))


def layout_table() -> dict[str, Any]:
    import torch

    rows = []
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        for n, c, h, w in SHAPES:
            us = {}
            for fmt_name, fmt in (("nchw", torch.contiguous_format), ("cl", torch.channels_last)):
                bn = torch.nn.BatchNorm2d(c).cuda().to(memory_format=fmt)
                x = torch.randn(n, c, h, w, device="cuda", dtype=dtype).to(memory_format=fmt).requires_grad_()
                grad = torch.randn(n, c, h, w, device="cuda", dtype=dtype).to(memory_format=fmt)

                def step() -> object:
                    y = bn(x)
                    y.backward(grad)
                    return y

                us[fmt_name] = _median_us(step)
                del bn, x, grad
            rows.append({"op": "batch_norm", "dtype": name, "n": n, "c": c, "h": h, "w": w,
                         "elements": n * c * h * w, "nchw_us": round(us["nchw"], 2), "cl_us": round(us["cl"], 2)})
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": props.name, "torch": torch.__version__,
            "method": f"BatchNorm2d training forward+backward, median of 7 CUDA-event windows of {INNER} "
                      "iterations after 3 warm-ups; bf16 activations with FP32 parameters",
            "rows": rows}


if __name__ == "__main__":
    doc = layout_table()
    text = json.dumps(doc, indent=1)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "x") as f:
            f.write(text + "\n")
    print(text)
