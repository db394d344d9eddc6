"""Measure what channels-last does to batch norm on this GPU: training forward + backward of
``nn.BatchNorm2d`` on NCHW vs channels-last inputs, per dtype, over ResNet-like sizes.

The memory_format analyzer prices a trace's NCHW batch-norm kernels with these ratios (the
channels-last time over the NCHW time at the nearest size, interpolated in log elements); without
the table it reports their saving only as an upper bound. bf16 rows run bf16 activations with FP32
parameters, as autocast does.

What the analyzer scales is a trace's kernel durations, so each timing is of the kernels alone:
``INNER`` forward+backward iterations captured in a CUDA graph and replayed between two CUDA
events (the median of ``repeat`` replays, after warm-up), with no host launch inside the window.
The first table (2026-12-01) timed eager iterations between the events; at the small sizes the
host's launches set that time for both layouts alike, and their ratio read 1 where the kernels
differ (docs/accuracy.md, "compile and memory_format, read pair by pair"). Those eager timings are
still measured and kept beside the graph ones (``nchw_eager_us``, ``cl_eager_us``) for comparison.
The backward is ``torch.autograd.grad`` of the input and the affine parameters, so no gradient
accumulation kernel joins the batch-norm kernels.

On a GPU machine (writes the file the analyzer reads; needs torch with CUDA):

    python -m benchmarks.layout_table gpuprof/data/layout_table.json
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
    """Eager: ``INNER`` calls of ``fn`` between two CUDA events (host launches inside the window)."""
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


def _graph_median_us(fn: Callable[[], object], warmup: int = 3, repeat: int = 7) -> float:
    """The kernels alone: ``INNER`` calls of ``fn`` captured in one CUDA graph, each replay timed
    between two CUDA events, per call."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as graph capture requires
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(INNER):
            fn()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / INNER)
    del graph
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
                params = (x, bn.weight, bn.bias)

                def step() -> object:
                    y = bn(x)
                    return torch.autograd.grad(y, params, grad)

                us[fmt_name] = _graph_median_us(step)
                us[fmt_name + "_eager"] = _median_us(step)
                del bn, x, grad, params
            rows.append({"op": "batch_norm", "dtype": name, "n": n, "c": c, "h": h, "w": w,
                         "elements": n * c * h * w, "nchw_us": round(us["nchw"], 2), "cl_us": round(us["cl"], 2),
                         "nchw_eager_us": round(us["nchw_eager"], 2), "cl_eager_us": round(us["cl_eager"], 2)})
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": props.name, "torch": torch.__version__,
            "method": f"BatchNorm2d training forward+backward (autograd.grad of the input, weight and bias), "
                      f"{INNER} iterations captured in one CUDA graph, median of 7 replays timed by CUDA events "
                      "after 3 warm-ups (nchw_us, cl_us); beside them the same iterations run eagerly between the "
                      "events (nchw_eager_us, cl_eager_us, the first table's method); bf16 activations with "
                      "FP32 parameters",
            "rows": rows}


if __name__ == "__main__":
    doc = layout_table()
    text = json.dumps(doc, indent=1)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "x") as f:
            f.write(text + "\n")
    print(text)
