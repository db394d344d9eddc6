"""NVML sampler: a thread in the ``gpuprof record`` parent that reads each GPU at N Hz.

Columns (CSV, one row per GPU per sample): ts_ns (Unix ns, the clock Kineto's
``baseTimeNanoseconds`` uses, so samples line up with kernels), gpu, util_gpu_pct, util_mem_pct,
mem_used_mb, mem_total_mb, power_w, power_limit_w, sm_clock_mhz, mem_clock_mhz,
sm_clock_max_mhz, clock_event_reasons (bitmask: 0x1 idle, 0x4 SW power cap, 0x8 HW slowdown,
0x20 SW thermal, 0x40 HW thermal, 0x80 power brake), temp_c, pcie_tx_bytes, pcie_rx_bytes,
nvlink_tx_bytes, nvlink_rx_bytes (cumulative counters: take differences), and on Hopper and newer
the GPM metrics gpm_sm_util_pct, gpm_sm_occupancy_pct, gpm_tensor_util_pct, gpm_dram_bw_util_pct
(each over the interval since the previous sample). Measured on an H200 (benchmarks/nvml_cost.py,
benchmarks/sampler_cost.py): inside a real sample, memory info costs ~90 µs of CPU and
utilisation ~57 µs, the others 4-17 µs; a GPM read several hundred µs, the byte-counter field query
~330 µs. So the fast-changing power, SM clock and clock-event reasons are read every sample and
the rest less often (see ``sample_once``); a row's empty cells were not read that time. At 20 Hz
the thread used 0.50-0.58 % of one core there.

Every metric is optional: one that fails once (not supported, no permission) is switched off and
listed in ``unavailable``; the sampler never raises into the program being profiled.
"""

from __future__ import annotations

import csv
import threading
import time
from pathlib import Path
from typing import Any, Callable

COLUMNS = ["ts_ns", "gpu", "util_gpu_pct", "util_mem_pct", "mem_used_mb", "mem_total_mb", "power_w",
           "power_limit_w", "sm_clock_mhz", "mem_clock_mhz", "sm_clock_max_mhz", "clock_event_reasons", "temp_c",
           "pcie_tx_bytes", "pcie_rx_bytes", "nvlink_tx_bytes", "nvlink_rx_bytes", "gpm_sm_util_pct",
           "gpm_sm_occupancy_pct", "gpm_tensor_util_pct", "gpm_dram_bw_util_pct"]
GPM_METRICS = {"gpm_sm_util_pct": "NVML_GPM_METRIC_SM_UTIL", "gpm_sm_occupancy_pct": "NVML_GPM_METRIC_SM_OCCUPANCY",
               "gpm_tensor_util_pct": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
               "gpm_dram_bw_util_pct": "NVML_GPM_METRIC_DRAM_BW_UTIL"}
FIELDS = {"pcie_tx_bytes": "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "pcie_rx_bytes": "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
          "nvlink_tx_bytes": "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
          "nvlink_rx_bytes": "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"}


SLOW_EVERY = 4
GPM_EVERY = 20
COUNTER_EVERY = 20


def load_nvml() -> Any:
    """The pynvml module (from nvidia-ml-py), initialised; raises on any failure."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


class Sampler(threading.Thread):
    """Samples ``devices`` (indices; all when None) every 1/hz s into ``path`` until ``stop()``."""

    def __init__(self, path: Path, hz: float, nvml: Any, devices: list[int] | None = None,
                 clock: Callable[[], int] = time.time_ns, gpm: bool = True, fields: bool = True) -> None:
        super().__init__(name="gpuprof-nvml", daemon=True)
        self.path, self.period, self.nv, self.clock = path, 1.0 / hz, nvml, clock
        count = nvml.nvmlDeviceGetCount()
        self.devices = [d for d in (devices if devices is not None else range(count)) if 0 <= d < count]
        self.handles = {d: nvml.nvmlDeviceGetHandleByIndex(d) for d in self.devices}
        self.off: dict[str, str] = {}
        self.samples = 0
        self.cpu_seconds = 0.0
        self.cpu_split = {"read": 0.0, "write": 0.0, "wait": 0.0}  # where the thread's CPU time goes
        self._stop_event = threading.Event()
        self._static: dict[int, dict[str, Any]] = {d: self._read_static(h) for d, h in self.handles.items()}
        self._gpm: dict[int, Any] = {}
        self._gpm_prev: dict[int, Any] = {}
        if not fields:
            self.off.update({c: "switched off (--no-nvml-counters)" for c in FIELDS})
        if gpm:
            self._init_gpm()
        else:
            self.off["gpm"] = "switched off (--no-gpm)"

    # --- reading ---------------------------------------------------------------------------
    def _try(self, name: str, fn: Callable[[], Any]) -> Any:
        if name in self.off:
            return None
        try:
            return fn()
        except Exception as e:  # NVMLError_NotSupported, NoPermission, missing symbol, ...
            self.off[name] = f"{e.__class__.__name__}: {e}"
            return None

    def _read_static(self, h: Any) -> dict[str, Any]:
        nv = self.nv
        return {
            "mem_total_mb": self._try("mem_total_mb", lambda: nv.nvmlDeviceGetMemoryInfo(h).total / 2**20),
            "power_limit_w": self._try("power_limit_w", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
            "sm_clock_max_mhz": self._try("sm_clock_max_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
        }

    def _init_gpm(self) -> None:
        nv = self.nv
        for d, h in self.handles.items():
            ok = self._try("gpm", lambda: nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
            if ok:
                s = self._try("gpm", lambda: nv.nvmlGpmSampleGet(h, nv.nvmlGpmSampleAlloc()))
                if s is not None:
                    self._gpm_prev[d] = s
            elif "gpm" not in self.off:
                self.off["gpm"] = "not supported on this GPU (Hopper and newer)"

    def _gpm_values(self, d: int, h: Any) -> dict[str, Any]:
        nv = self.nv
        if d not in self._gpm_prev or "gpm" in self.off:
            return {}

        def read() -> dict[str, Any]:
            cur = nv.nvmlGpmSampleGet(h, nv.nvmlGpmSampleAlloc())
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_METRICS)
            mg.sample1, mg.sample2 = self._gpm_prev[d], cur
            for i, const in enumerate(GPM_METRICS.values()):
                mg.metrics[i].metricId = getattr(nv, const)
            nv.nvmlGpmMetricsGet(mg)
            nv.nvmlGpmSampleFree(self._gpm_prev[d])
            self._gpm_prev[d] = cur
            return {col: (mg.metrics[i].value if mg.metrics[i].nvmlReturn == 0 else None)
                    for i, col in enumerate(GPM_METRICS)}

        return self._try("gpm", read) or {}

    def _fields(self, h: Any) -> dict[str, Any]:
        nv = self.nv
        want = [(col, getattr(nv, const)) for col, const in FIELDS.items() if hasattr(nv, const) and col not in self.off]
        if not want:
            return {}
        vals = self._try("field_values", lambda: nv.nvmlDeviceGetFieldValues(h, [fid for _, fid in want]))
        out: dict[str, Any] = {}
        for (col, _), v in zip(want, vals or []):
            if getattr(v, "nvmlReturn", 1) == 0:
                out[col] = int(v.value.ullVal)
            else:
                self.off[col] = f"field not supported (NVML return {getattr(v, 'nvmlReturn', '?')})"
        return out

    def sample_once(self) -> list[dict[str, Any]]:
        """One row per GPU. Power, SM clock and clock-event reasons every sample; utilisation
        (itself a ~100-170 ms average in NVML) on every ``SLOW_EVERY``-th; GPM (an average over
        the interval since its last read) on every ``GPM_EVERY``-th; memory, memory clock,
        temperature and byte counters on every ``COUNTER_EVERY``-th (empty in between)."""
        nv = self.nv
        ts = self.clock()
        slow = self.samples % SLOW_EVERY == 0
        rows = []
        for d, h in self.handles.items():
            row: dict[str, Any] = {
                "ts_ns": ts, "gpu": d,
                "power_w": (lambda p: p / 1000.0 if p is not None else None)(
                    self._try("power", lambda: nv.nvmlDeviceGetPowerUsage(h))),
                "sm_clock_mhz": self._try("sm_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                "clock_event_reasons": self._try("clock_event_reasons",
                                                 lambda: int(nv.nvmlDeviceGetCurrentClocksEventReasons(h))),
                **self._static[d],
            }
            if slow:
                util = self._try("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))
                row["util_gpu_pct"] = util.gpu if util else None
                row["util_mem_pct"] = util.memory if util else None
            if self.samples % COUNTER_EVERY == 0:
                mem = self._try("memory", lambda: nv.nvmlDeviceGetMemoryInfo(h))
                row.update({
                    "mem_used_mb": mem.used / 2**20 if mem else None,
                    "mem_clock_mhz": self._try("mem_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
                    "temp_c": self._try("temperature", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                })
            if self.samples % GPM_EVERY == 0:
                row.update(self._gpm_values(d, h))
            if self.samples % COUNTER_EVERY == 0:
                row.update(self._fields(h))
            rows.append(row)
        self.samples += 1
        return rows

    # --- thread ----------------------------------------------------------------------------
    def run(self) -> None:
        t_cpu = time.thread_time()
        with open(self.path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(COLUMNS)
            nxt = time.monotonic()
            split = self.cpu_split
            while not self._stop_event.is_set():
                c0 = time.thread_time()
                try:
                    rows = self.sample_once()
                except Exception as e:  # never let the sampler take the program down
                    self.off.setdefault("sampler", f"{e.__class__.__name__}: {e}")
                    break
                c1 = time.thread_time()
                w.writerows([[row.get(c) for c in COLUMNS] for row in rows])
                if self.samples % 20 == 0:
                    f.flush()
                c2 = time.thread_time()
                nxt += self.period
                time.sleep(max(0.0, nxt - time.monotonic()))  # cheaper wake-ups than Event.wait here
                c3 = time.thread_time()
                split["read"] += c1 - c0
                split["write"] += c2 - c1
                split["wait"] += c3 - c2
        self.cpu_seconds = time.thread_time() - t_cpu

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5.0)
