"""Cost of each NVML query through nvidia-ml-py (run on a GPU machine): µs per call, median of
repeats. Tells which queries dominate the sampler's CPU time."""

from __future__ import annotations

import statistics
import time

import pynvml

pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
calls = {
    "utilization": lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
    "memory": lambda: pynvml.nvmlDeviceGetMemoryInfo(h),
    "power": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
    "sm_clock": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
    "mem_clock": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
    "clock_event_reasons": lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
    "temperature": lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
    "field_values_pcie": lambda: pynvml.nvmlDeviceGetFieldValues(
        h, [pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]),
    "gpm_sample_alloc_get_free": lambda: pynvml.nvmlGpmSampleFree(pynvml.nvmlGpmSampleGet(h, pynvml.nvmlGpmSampleAlloc())),
}
for name, fn in calls.items():
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(200):
            fn()
        times.append((time.perf_counter() - t) / 200 * 1e6)
    print(f"{name:28s} {statistics.median(times):8.1f} us")
