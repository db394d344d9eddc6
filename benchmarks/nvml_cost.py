"""Cost of each NVML query through nvidia-ml-py (run on a GPU machine): µs per call, median of
repeats. Tells which queries dominate the sampler's CPU time."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import pynvml


def basic_queries(nv: Any, h: Any) -> dict[str, Callable[[], Any]]:
    """The sampler's basic queries, in its order (benchmarks/sampler_cost.py uses them too)."""
    return {
        "utilization": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "memory": lambda: nv.nvmlDeviceGetMemoryInfo(h),
        "power": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "sm_clock": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "mem_clock": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        "clock_event_reasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
        "temperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
    }


def main() -> None:
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    calls = {
        **basic_queries(pynvml, h),
        "field_values_pcie": lambda: pynvml.nvmlDeviceGetFieldValues(
            h, [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]),
        "gpm_sample_alloc_get_free": lambda: pynvml.nvmlGpmSampleFree(
            pynvml.nvmlGpmSampleGet(h, pynvml.nvmlGpmSampleAlloc())),
    }
    for name, fn in calls.items():
        times = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(200):
                fn()
            times.append((time.perf_counter() - t) / 200 * 1e6)
        print(f"{name:28s} {statistics.median(times):8.1f} us")


if __name__ == "__main__":
    main()
