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
the rest less often: each group's period is stretched, from ``MIN_PERIOD_S`` up to ``MAX_PERIOD_S``,
so that the thread stays within ``CPU_BUDGET_PCT`` of one core from the costs it measures as it
runs (``plan_strides``; the periods used go into the manifest). A row's empty cells were not read
that time. Rows are written in batches of ``WRITE_EVERY`` samples. docs/collector.md has the
measured CPU use.

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


#: Metric groups read less often than every sample, with the shortest period (s) each is read at.
#: utilisation is itself a ~100-170 ms average in NVML; GPM metrics average over the interval
#: since their last read; memory, memory clock and temperature change slowly; the byte counters
#: are cumulative.
MIN_PERIOD_S = {"util": 0.25, "memory": 1.0, "gpm": 1.0, "counters": 1.0}
#: ... and the longest: past it the group is read anyway, budget or not.
MAX_PERIOD_S = {"util": 2.0, "memory": 10.0, "gpm": 20.0, "counters": 30.0}
CPU_BUDGET_PCT = 0.5  # of one core, for the whole sampler thread
PLAN_SHARE = 0.85  # plan to this share of the budget: read costs vary from one read to the next
PAYBACK_S = 10.0  # CPU spent over budget is paid back over this many seconds
WRITE_EVERY = 20  # rows are written (and flushed) in batches
_COL = {c: i for i, c in enumerate(COLUMNS)}
_POWER, _SM, _REASONS = _COL["power_w"], _COL["sm_clock_mhz"], _COL["clock_event_reasons"]


def plan_strides(fixed_us: float, group_us: dict[str, float], hz: float, budget_pct: float = CPU_BUDGET_PCT,
                 min_period_s: dict[str, float] | None = None, max_period_s: dict[str, float] | None = None
                 ) -> dict[str, int]:
    """Every how many samples to read each metric group so the sampler stays within its CPU
    budget: ``fixed_us`` is the measured CPU per sample that every sample pays (waking, the fast
    reads, writing), ``group_us`` each group's measured CPU per read (all GPUs together). Groups
    run at their shortest period when that fits in what the fixed cost leaves; otherwise all are
    stretched by one factor, each capped at its longest period."""
    lo = MIN_PERIOD_S if min_period_s is None else min_period_s
    hi = MAX_PERIOD_S if max_period_s is None else max_period_s
    left = PLAN_SHARE * budget_pct / 100.0 * 1e6 - fixed_us * hz  # µs of CPU per second for the groups
    want = sum(group_us[g] / lo[g] for g in group_us)  # µs per second at the shortest periods
    stretch = 1.0 if want <= 0 else (want / left if left > 0 else float("inf"))
    out = {}
    for g in group_us:
        period = min(hi[g], lo[g] * max(1.0, stretch))
        out[g] = max(1, round(period * hz))
    return out


def load_nvml() -> Any:
    """The pynvml module (from nvidia-ml-py), initialised; raises on any failure."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


class Sampler(threading.Thread):
    """Samples ``devices`` (indices; all when None) every 1/hz s into ``path`` until ``stop()``."""

    def __init__(self, path: Path, hz: float, nvml: Any, devices: list[int] | None = None,
                 clock: Callable[[], int] = time.time_ns, gpm: bool = True, fields: bool = True,
                 budget_pct: float = CPU_BUDGET_PCT, min_period_s: dict[str, float] | None = None) -> None:
        super().__init__(name="gpuprof-nvml", daemon=True)
        self.path, self.period, self.nv, self.clock = path, 1.0 / hz, nvml, clock
        count = nvml.nvmlDeviceGetCount()
        self.devices = [d for d in (devices if devices is not None else range(count)) if 0 <= d < count]
        self.handles = {d: nvml.nvmlDeviceGetHandleByIndex(d) for d in self.devices}
        self.off: dict[str, str] = {}
        self.samples = 0
        self.cpu_seconds = 0.0
        self.cpu_split = {"read": 0.0, "write": 0.0, "wait": 0.0}  # where the thread's CPU time goes
        self.budget_pct, self.hz = budget_pct, hz
        self.min_period_s = {**MIN_PERIOD_S, **(min_period_s or {})}
        self.group_us: dict[str, float] = {}  # measured CPU per read of each group (running mean)
        self._group_reads: dict[str, int] = {}
        self.strides = {g: max(1, round(p * hz)) for g, p in self.min_period_s.items()}
        self._due = dict.fromkeys(self.strides, 0)
        self._due["gpm"] = self.strides["gpm"]  # GPM's first sample is taken at start: its first interval ends here
        self._next_due = 0
        self._fast_ok = True
        self._power, self._clock = nvml.nvmlDeviceGetPowerUsage, nvml.nvmlDeviceGetClockInfo
        self._reasons, self._sm = nvml.nvmlDeviceGetCurrentClocksEventReasons, nvml.NVML_CLOCK_SM
        self.steady_cpu_seconds = 0.0  # CPU and wall time after the first second (start-up reads excluded)
        self.steady_seconds = 0.0
        self._stop_event = threading.Event()
        self._static: dict[int, dict[str, Any]] = {d: self._read_static(h) for d, h in self.handles.items()}
        self._template: dict[int, list[Any]] = {}
        for d in self.handles:
            row: list[Any] = [None] * len(COLUMNS)
            row[_COL["gpu"]] = d
            for col, v in self._static[d].items():
                row[_COL[col]] = v
            self._template[d] = row
        self._gpm: dict[int, Any] = {}
        self._gpm_prev: dict[int, Any] = {}
        if not fields:
            self.off.update({c: "switched off (--no-nvml-counters)" for c in FIELDS})
        if gpm:
            self._init_gpm()
        else:
            self.off["gpm"] = "switched off (--no-gpm)"

    # --- reading ---------------------------------------------------------------------------
    def _try(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        if name in self.off:
            return None
        try:
            return fn(*args)
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
                    self._gpm[d] = nv.nvmlGpmSampleAlloc()  # the spare: two buffers, reused
            elif "gpm" not in self.off:
                self.off["gpm"] = "not supported on this GPU (Hopper and newer)"

    def _gpm_values(self, d: int, h: Any) -> dict[str, Any]:
        nv = self.nv
        if d not in self._gpm_prev or "gpm" in self.off:
            return {}

        def read() -> dict[str, Any]:
            cur = nv.nvmlGpmSampleGet(h, self._gpm[d])
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_METRICS)
            mg.sample1, mg.sample2 = self._gpm_prev[d], cur
            for i, const in enumerate(GPM_METRICS.values()):
                mg.metrics[i].metricId = getattr(nv, const)
            nv.nvmlGpmMetricsGet(mg)
            self._gpm[d], self._gpm_prev[d] = self._gpm_prev[d], cur
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

    def sample_once(self) -> list[list[Any]]:
        """One row per GPU, in ``COLUMNS`` order: power, SM clock and clock-event reasons every
        sample; each other group when it is due (``plan_strides``), its cells empty otherwise.
        The every-sample path is kept lean (a prefilled row, three direct calls per GPU): at
        20 Hz the whole thread's budget is 250 µs of CPU per sample."""
        ts = self.clock()
        n = self.samples
        rows = []
        for d, h in self.handles.items():
            row = self._template[d].copy()
            row[0] = ts
            if self._fast_ok:
                try:
                    row[_POWER] = self._power(h) / 1000.0
                    row[_SM] = self._clock(h, self._sm)
                    row[_REASONS] = int(self._reasons(h))
                except Exception:  # find out which read fails, then read them one by one from now on
                    self._fast_ok = False
            if not self._fast_ok:
                self._read_fast_slowly(h, row)
            rows.append(row)
        if n >= self._next_due:
            for g in [g for g, at in self._due.items() if n >= at]:
                self._due[g] = n + self.strides[g]
                if self._group_off(g):
                    continue
                c0 = time.thread_time()
                for (d, h), row in zip(self.handles.items(), rows):
                    self._read_group(g, d, h, row)
                k = self._group_reads.get(g, 0)
                self.group_us[g] = (self.group_us.get(g, 0.0) * k + (time.thread_time() - c0) * 1e6) / (k + 1)
                self._group_reads[g] = k + 1
            self._next_due = min(self._due.values())
        self.samples += 1
        return rows

    def _read_fast_slowly(self, h: Any, row: list[Any]) -> None:
        """The every-sample reads one at a time, each switched off on its first failure."""
        nv = self.nv
        p = self._try("power", nv.nvmlDeviceGetPowerUsage, h)
        row[_POWER] = p / 1000.0 if p is not None else None
        row[_SM] = self._try("sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        r = self._try("clock_event_reasons", nv.nvmlDeviceGetCurrentClocksEventReasons, h)
        row[_REASONS] = int(r) if r is not None else None

    def _group_off(self, g: str) -> bool:
        if g == "gpm":
            return "gpm" in self.off or not self._gpm_prev
        if g == "counters":
            return "field_values" in self.off or all(c in self.off for c in FIELDS)
        return False

    def _read_group(self, g: str, d: int, h: Any, row: list[Any]) -> None:
        nv = self.nv
        if g == "util":
            util = self._try("utilization", nv.nvmlDeviceGetUtilizationRates, h)
            if util is not None:
                row[_COL["util_gpu_pct"]], row[_COL["util_mem_pct"]] = util.gpu, util.memory
        elif g == "memory":
            mem = self._try("memory", nv.nvmlDeviceGetMemoryInfo, h)
            row[_COL["mem_used_mb"]] = mem.used / 2**20 if mem else None
            row[_COL["mem_clock_mhz"]] = self._try("mem_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
            row[_COL["temp_c"]] = self._try("temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        elif g == "counters":
            for col, v in self._fields(h).items():
                row[_COL[col]] = v
        elif g == "gpm":
            for col, v in self._gpm_values(d, h).items():
                row[_COL[col]] = v

    def replan(self, fixed_us: float, overspent_us: float = 0.0) -> None:
        """Re-spread the group reads over the CPU budget from the costs measured so far; CPU
        spent beyond the budget until now (start-up reads, a costly spell) is paid back over the
        next ``PAYBACK_S`` seconds."""
        if self.group_us:
            payback = max(0.0, overspent_us) / PAYBACK_S / self.hz  # µs per sample
            self.strides.update(plan_strides(fixed_us + payback, self.group_us, self.hz, self.budget_pct,
                                             {g: self.min_period_s[g] for g in self.group_us}))

    @property
    def periods_s(self) -> dict[str, float]:
        """Each group's read period now (s), for the manifest."""
        return {g: round(k / self.hz, 3) for g, k in self.strides.items()}

    # --- thread ----------------------------------------------------------------------------
    def run(self) -> None:
        t_cpu, t_wall = time.thread_time(), time.monotonic()
        steady: tuple[float, float] | None = None
        with open(self.path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(COLUMNS)
            f.flush()
            nxt = time.monotonic()
            split = self.cpu_split
            pending: list[list[Any]] = []
            while not self._stop_event.is_set():
                c0 = time.thread_time()
                try:
                    pending.extend(self.sample_once())
                except Exception as e:  # never let the sampler take the program down
                    self.off.setdefault("sampler", f"{e.__class__.__name__}: {e}")
                    break
                c1 = time.thread_time()
                if self.samples % WRITE_EVERY == 0:  # one write per second: a crash loses at most that
                    w.writerows(pending)
                    f.flush()
                    pending.clear()
                c2 = time.thread_time()
                nxt += self.period
                time.sleep(max(0.0, nxt - time.monotonic()))  # cheaper wake-ups than Event.wait here
                c3 = time.thread_time()
                split["read"] += c1 - c0
                split["write"] += c2 - c1
                split["wait"] += c3 - c2
                if self.samples == 1 or self.samples % max(1, round(self.hz)) == 0:  # at once, then each second
                    total_us = sum(split.values()) / self.samples * 1e6
                    groups_us = sum(self.group_us[g] * self._group_reads[g] for g in self.group_us) / self.samples
                    used_us = (time.thread_time() - t_cpu) * 1e6
                    allowed_us = PLAN_SHARE * self.budget_pct / 100.0 * (time.monotonic() - t_wall) * 1e6
                    self.replan(max(0.0, total_us - groups_us), used_us - allowed_us)
                if self.samples == max(1, round(self.hz)):
                    steady = (time.thread_time(), time.monotonic())
            try:  # a last row with every group: cumulative counters and GPM cover the run to its end
                self._due = dict.fromkeys(self._due, 0)
                self._next_due = 0
                pending.extend(self.sample_once())
            except Exception as e:
                self.off.setdefault("sampler", f"{e.__class__.__name__}: {e}")
            w.writerows(pending)
        self.cpu_seconds = time.thread_time() - t_cpu
        if steady is not None:
            self.steady_cpu_seconds = time.thread_time() - steady[0]
            self.steady_seconds = time.monotonic() - steady[1]

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5.0)
