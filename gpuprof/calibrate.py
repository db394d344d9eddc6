"""Measure this GPU's achievable ceilings and write them as a gpuprof spec file.

Datasheet peaks are upper bounds the hardware rarely reaches; a roofline against measured
ceilings says how far a kernel is from what this card really does. ``gpuprof calibrate`` times
large matrix products per dtype and a large device-to-device copy with CUDA events (median of
repeats, after warm-up, on random data; never zeros, which run faster than real data) and writes
a JSON spec file that ``gpuprof report --gpu-spec FILE`` reads.

Needs torch with CUDA; imports nothing else of gpuprof's so it runs on a bare GPU machine.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from typing import Any


def _median_ms(fn: Callable[[], object], warmup: int, repeat: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(statistics.median(times))


def _matmul_tflops(kind: str, n: int, warmup: int, repeat: int) -> float | None:
    import torch

    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = kind == "tf32"
    try:
        if kind in ("bf16", "fp16", "fp32", "tf32", "fp64"):
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}.get(kind, torch.float32)
            # Rotate among several operand sets so the timing is not of the L2 cache.
            sets = [(torch.randn(n, n, device=dev, dtype=dtype), torch.randn(n, n, device=dev, dtype=dtype)) for _ in range(3)]
            state = {"i": 0}

            def run() -> object:
                state["i"] = (state["i"] + 1) % len(sets)
                a, b = sets[state["i"]]
                return a @ b
        elif kind == "fp8":
            a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
            b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()
            one = torch.ones((), device=dev)

            def run() -> object:
                return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        elif kind == "int8":
            a = torch.randint(-64, 64, (n, n), device=dev, dtype=torch.int8)
            b = torch.randint(-64, 64, (n, n), device=dev, dtype=torch.int8)

            def run() -> object:
                return torch._int_mm(a, b)
        else:
            raise ValueError(kind)
        ms = _median_ms(run, warmup, repeat)
    except (RuntimeError, AttributeError, TypeError):
        return None  # this build or card lacks the kernel: leave the datasheet figure
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    return 2.0 * n**3 / (ms * 1e-3) / 1e12


def _copy_gbps(nbytes: int, warmup: int, repeat: int) -> float:
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src), warmup, repeat)
    return 2.0 * nbytes / (ms * 1e-3) / 1e9  # bytes read plus bytes written


GEMM_DIMS = (256, 1024, 4096, 16384)
GEMM_K = (256, 1024, 4096)


def _graph_us(mm: int, nn: int, kk: int, dtype: Any, warmup: int, repeat: int) -> tuple[float, int]:
    """µs per (mm, kk) @ (kk, nn) GEMM, replayed from a CUDA graph of back-to-back calls.

    Timing one call between two CUDA events also times the host launching it (cuBLAS's
    heuristics and Python: ~10-20 µs here), so small and mid-size GEMMs read far slower than the
    same kernels inside a training step. A graph of ``reps`` calls (about 0.5 TFLOP in all, 2 to 50
    calls) replays with no host in between; two operand sets alternate, outputs are preallocated.
    """
    import torch

    flops = 2.0 * mm * nn * kk
    reps = int(min(50, max(2, round(5e11 / flops))))
    sets = [(torch.randn(mm, kk, device="cuda", dtype=dtype), torch.randn(kk, nn, device="cuda", dtype=dtype))
            for _ in range(2)]
    out = torch.empty(mm, nn, device="cuda", dtype=dtype)
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm cuBLAS up (workspace, heuristics) before capture
        for i in range(3):
            torch.mm(*sets[i % 2], out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            torch.mm(*sets[i % 2], out=out)
    ms = _median_ms(graph.replay, warmup, repeat)
    del graph, sets, out
    return ms * 1e3 / reps, reps


def gemm_table(dtypes: tuple[str, ...] = ("bf16", "fp16", "tf32", "fp32"), warmup: int = 2,
               repeat: int = 5) -> list[dict[str, Any]]:
    """Achieved TFLOP/s of ``(m, k) @ (k, n)`` GEMMs over a grid of sizes, aligned and misaligned.

    The aligned rows are what a GEMM of that size and dtype reaches on this card: the reference a
    misaligned GEMM is compared with when the trace holds no aligned twin. Each aligned shape is
    also timed with every dimension one less (odd: no 16-byte alignment), so the table shows the
    measured penalty too. Random operands, two sets alternating, GEMMs replayed back to back from a
    CUDA graph (:func:`_graph_us`); median of CUDA-event timings.
    """
    import torch

    rows: list[dict[str, Any]] = []
    for kind in dtypes:
        torch.backends.cuda.matmul.allow_tf32 = kind == "tf32"
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(kind, torch.float32)
        try:
            for m in GEMM_DIMS:
                for n in GEMM_DIMS:
                    for k in GEMM_K:
                        for aligned in (True, False):
                            mm, nn, kk = (m, n, k) if aligned else (m - 1, n - 1, k - 1)
                            us, reps = _graph_us(mm, nn, kk, dtype, warmup, repeat)
                            rows.append({"dtype": kind, "m": mm, "n": nn, "k": kk, "aligned": aligned,
                                         "us": round(us, 2), "reps": reps,
                                         "tflops": round(2.0 * mm * nn * kk / (us * 1e-6) / 1e12, 2)})
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def calibrate(size: int = 8192, copy_bytes: int = 2 << 30, warmup: int = 3, repeat: int = 10) -> dict[str, Any]:
    """Time matmuls per dtype and a device copy on the current CUDA device; return a spec dict."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("calibrate needs a CUDA GPU and a CUDA build of torch")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    peaks: dict[str, float] = {}
    for kind in ("bf16", "fp16", "tf32", "fp32", "fp8", "int8", "fp64"):
        n = size if kind not in ("fp32", "fp64") else size // 2
        value = _matmul_tflops(kind, n, warmup, repeat)
        if value is not None:
            peaks[kind] = round(value, 1)
    clocks: dict[str, Any] = {}
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        clocks = {
            "sm_clock_mhz_after": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "sm_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            "clock_event_reasons_after": int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)),
        }
    except Exception:  # NVML is optional here: the timings stand on their own
        pass
    return {
        "name": props.name,
        "measured": True,
        "peaks_tflops": peaks,
        "hbm_gbps": round(_copy_gbps(copy_bytes, warmup, repeat), 1),
        "sm_count": props.multi_processor_count,
        "method": f"median of {repeat} CUDA-event timings after {warmup} warm-ups; {size}^3 matmuls "
        f"(fp32/fp64 at {size // 2}^3) on random data; copy of {copy_bytes} bytes counting read+write",
        "torch": torch.__version__,
        **clocks,
    }


def main(out: str | None = None, gemms: bool = False) -> None:
    spec = calibrate()
    if gemms:
        spec["gemm_table"] = gemm_table()
    text = json.dumps(spec, indent=1)
    if out:
        with open(out, "x") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    import sys

    args = [a for a in sys.argv[1:] if a != "--gemm-table"]
    main(args[0] if args else None, gemms="--gemm-table" in sys.argv[1:])
