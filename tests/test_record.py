"""`gpuprof record` end to end on CPU torch (CI has no GPU and no NVML), and the NVML sampler
against a fake NVML module."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuprof.record.nvml import COLUMNS, Sampler

TRAIN = """
import sys, time, torch
steps, crash_at, code, sleep = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.AdamW(m.parameters())
print("ready", flush=True)
for i in range(steps):
    loss = torch.nn.functional.cross_entropy(m(torch.randn(32, 64)), torch.randint(0, 10, (32,)))
    loss.backward(); opt.step(); opt.zero_grad()
    time.sleep(sleep)
    if i == crash_at:
        raise RuntimeError("boom")
sys.exit(code)
"""

INFER = """
import torch, gpuprof
m = torch.nn.Linear(32, 32)
with torch.no_grad():
    for i in range(12):
        m(torch.randn(4, 32)); gpuprof.step()
"""

DDP = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(12):
    m(torch.randn(8, 32)).sum().backward(); opt.step(); opt.zero_grad()
dist.destroy_process_group()
"""

LOADER = """
import torch
from torch.utils.data import DataLoader, TensorDataset
if __name__ == "__main__":
    ds = TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,)))
    dl = DataLoader(ds, batch_size=16, num_workers=2, multiprocessing_context="spawn", persistent_workers=True)
    m = torch.nn.Linear(32, 4); opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for x, y in dl:
        torch.nn.functional.cross_entropy(m(x), y).backward(); opt.step(); opt.zero_grad()
"""

FAST = ["--skip-steps", "2", "--timed-steps", "3", "--schedule", "1,1,2"]


def write(tmp: Path, name: str, src: str) -> Path:
    p = tmp / name
    p.write_text(src)
    return p


def record(tmp: Path, out: str, *cmd: str, opts: list[str] = FAST) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuprof.cli", "record", "--out", str(tmp / out), *opts, "--",
                           *cmd], capture_output=True, text=True, cwd=tmp, timeout=300)


def start_long_recording(tmp: Path, sleep: str) -> subprocess.Popen[str]:
    """`gpuprof record` of a training loop that runs until interrupted (``sleep`` s per step)."""
    script = write(tmp, "train.py", TRAIN)
    return subprocess.Popen([sys.executable, "-m", "gpuprof.cli", "record", "--out", str(tmp / "run"), *FAST, "--",
                             sys.executable, str(script), "100000", "-1", "0", sleep],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)


def manifest(tmp: Path, out: str) -> dict[str, Any]:
    return json.loads((tmp / out / "manifest.json").read_text())


def test_record_then_report(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", TRAIN)
    r = record(tmp_path, "run", sys.executable, str(script), "20", "-1", "0", "0")
    assert r.returncode == 0, r.stderr
    m = manifest(tmp_path, "run")
    assert m["schema_version"] == 1 and m["exit_code"] == 0 and m["failures"] == []
    assert m["traces"] == [{"rank": 0, "path": "traces/rank0.json.gz"}]
    assert m["command"][-4:] == ["20", "-1", "0", "0"] and m["torch"].startswith("2.")
    assert m["profiler"]["schedule"] == {"wait": 1, "warmup": 1, "active": 2, "repeat": 1}
    assert m["unprofiled_step_ms"] > 0 and m["ranks"][0]["timed_steps"] == 3
    assert "NVML unavailable" in m["nvml"].get("error", "NVML unavailable")  # CI machines have no NVML
    rep = subprocess.run([sys.executable, "-m", "gpuprof.cli", "report", str(tmp_path / "run"), "--format", "json"],
                         capture_output=True, text=True)
    doc = json.loads(rep.stdout)
    assert doc["summary"]["steps"] == 2 and doc["summary"]["unprofiled_step_time_ms"] == pytest.approx(
        m["unprofiled_step_ms"])


def test_exit_code_is_the_programs(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", TRAIN)
    r = record(tmp_path, "run", sys.executable, str(script), "20", "-1", "7", "0")
    assert r.returncode == 7 and manifest(tmp_path, "run")["exit_code"] == 7


def test_crash_inside_the_window_keeps_a_valid_run(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", TRAIN)
    # steps 1-2 skipped; 3-6 timed, the 6th starts the profiler; 7 wait, 8 warmup, 9-10 active:
    # a crash right after step 9 (loop index 8) is inside the active window
    r = record(tmp_path, "run", sys.executable, str(script), "20", "8", "0", "0")
    assert r.returncode == 1 and "boom" in r.stderr
    m = manifest(tmp_path, "run")
    assert m["exit_code"] == 1 and m["traces"] and m["ranks"][0]["status"] == "partial"
    assert any("inside the active window" in f for f in m["failures"])
    rep = subprocess.run([sys.executable, "-m", "gpuprof.cli", "report", str(tmp_path / "run")], capture_output=True,
                         text=True, cwd=tmp_path)  # the default HTML report is written to cwd
    assert rep.returncode == 0, rep.stderr


def test_sigint_is_passed_on_and_the_run_folder_written(tmp_path: Path) -> None:
    p = start_long_recording(tmp_path, "0.01")
    deadline = time.time() + 120
    meta = tmp_path / "run" / "traces" / "rank0.meta.json"
    while time.time() < deadline and not (meta.exists() and json.loads(meta.read_text()).get("trace")):
        time.sleep(0.2)  # wait until the profiled window has been written
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err  # 128 + SIGINT, as the program's own death by KeyboardInterrupt
    m = manifest(tmp_path, "run")
    assert m["traces"] and m["exit_code"] == 130


def test_refuses_to_overwrite_a_run(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "manifest.json").write_text("{}")
    r = record(tmp_path, "run", sys.executable, "-c", "pass")
    assert r.returncode == 2 and "never writes over a run" in r.stderr and "Traceback" not in r.stderr
    assert (tmp_path / "run" / "manifest.json").read_text() == "{}"


def test_program_without_optimizer_uses_gpuprof_step(tmp_path: Path) -> None:
    script = write(tmp_path, "infer.py", INFER)
    r = record(tmp_path, "run", sys.executable, str(script))
    assert r.returncode == 0, r.stderr
    m = manifest(tmp_path, "run")
    assert m["traces"] and m["ranks"][0]["step_source"] == "gpuprof.step()"


def test_missing_command_and_too_short_program(tmp_path: Path) -> None:
    r = record(tmp_path, "run", "definitely-not-a-command-xyz")
    assert r.returncode == 127 and "could not start" in r.stderr
    script = write(tmp_path, "train.py", TRAIN)
    r = record(tmp_path, "run2", sys.executable, str(script), "3", "-1", "0", "0")
    m = manifest(tmp_path, "run2")
    assert r.returncode == 0 and not m["traces"] and any("before profiling began" in f for f in m["failures"])


def test_dataloader_worker_processes(tmp_path: Path) -> None:
    """Spawned DataLoader workers load the bootstrap and import torch too: they must stay silent."""
    script = write(tmp_path, "loader.py", LOADER)
    r = record(tmp_path, "run", sys.executable, str(script))
    assert r.returncode == 0, r.stderr[-2000:]
    m = manifest(tmp_path, "run")
    assert [t["rank"] for t in m["traces"]] == [0] and len(m["ranks"]) == 1 and m["failures"] == []


def test_torchrun_two_cpu_ranks(tmp_path: Path) -> None:
    script = write(tmp_path, "ddp.py", DDP)
    r = record(tmp_path, "run", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(script))
    assert r.returncode == 0, r.stderr[-2000:]
    m = manifest(tmp_path, "run")
    assert [t["rank"] for t in m["traces"]] == [0, 1] and m["world_size"] == 2
    rep = subprocess.run([sys.executable, "-m", "gpuprof.cli", "report", str(tmp_path / "run"), "--format", "json"],
                         capture_output=True, text=True)
    assert json.loads(rep.stdout)["source"]["ranks"] == [0, 1]


# --- the sampler against a fake NVML (SYNTHETIC: no GPU here) -------------------------------

class FakeNvml:
    """Enough of pynvml for the sampler: one GPU, GPM unsupported, one failing metric."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 2, 0
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 197, 198

    def __init__(self) -> None:
        self.t = 0

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return SimpleNamespace(total=80 * 2**30, used=40 * 2**30)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        return 700_000

    def nvmlDeviceGetMaxClockInfo(self, h: str, c: int) -> int:
        return 1980

    def nvmlGpmQueryDeviceSupport(self, h: str) -> Any:
        return SimpleNamespace(isSupportedDevice=0)

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        return 690_000

    def nvmlDeviceGetClockInfo(self, h: str, c: int) -> int:
        self.t += 1
        return 1500 if c == self.NVML_CLOCK_SM else 3201

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        return 0x4

    def nvmlDeviceGetTemperature(self, h: str, s: int) -> int:
        raise RuntimeError("NotSupported")

    def nvmlDeviceGetFieldValues(self, h: str, ids: list[int]) -> list[Any]:
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(ullVal=1000 * self.t)) for _ in ids]


def test_sampler_writes_rows_and_switches_off_failing_metrics(tmp_path: Path) -> None:
    clock = iter(range(1_000_000_000, 10**12, 50_000_000))
    s = Sampler(tmp_path / "nvml.csv", hz=200.0, nvml=FakeNvml(), clock=lambda: next(clock), budget_pct=100.0,
                min_period_s={"util": 0.02, "memory": 0.05, "gpm": 0.05, "counters": 0.05})
    s.start()
    time.sleep(0.2)
    s.stop()
    rows = list(csv.DictReader(open(tmp_path / "nvml.csv")))
    assert len(rows) == s.samples >= 5
    r = rows[-1]
    slow = rows[0]  # utilisation, memory, temperature and GPM are read on the first sample and then less often
    assert slow["util_gpu_pct"] == "97" and float(slow["mem_used_mb"]) == 40 * 1024
    assert rows[1]["mem_used_mb"] == "" and rows[1]["power_w"] != ""
    assert float(r["power_w"]) == 690.0 and r["sm_clock_mhz"] == "1500"
    assert r["clock_event_reasons"] == "4" and float(r["power_limit_w"]) == 700.0 and r["sm_clock_max_mhz"] == "1980"
    assert r["temp_c"] == "" and "temperature" in s.off and "gpm" in s.off
    counted = [r for r in rows if r["pcie_tx_bytes"]]  # read whenever the counters group is due
    assert len(counted) >= 2 and int(counted[-1]["pcie_tx_bytes"]) > int(counted[0]["pcie_tx_bytes"])
    assert int(rows[1]["ts_ns"]) - int(rows[0]["ts_ns"]) == 50_000_000
    assert set(s.group_us) == {"util", "memory", "counters"} and s.periods_s["memory"] >= 0.05
    assert rows[-1]["pcie_tx_bytes"] and rows[-1]["mem_used_mb"]  # a last row with every group at stop


def test_sampler_plan_keeps_within_the_cpu_budget() -> None:
    """plan_strides: cheap groups run at their shortest period; costly ones are stretched so the
    whole thread fits its budget, but never past their longest period."""
    from gpuprof.record.nvml import MAX_PERIOD_S, MIN_PERIOD_S, plan_strides

    cheap = {"util": 50.0, "memory": 90.0, "gpm": 300.0, "counters": 300.0}
    assert plan_strides(100.0, cheap, hz=20.0) == {g: round(MIN_PERIOD_S[g] * 20) for g in cheap}
    costly = {"util": 100.0, "memory": 180.0, "gpm": 3000.0, "counters": 700.0}
    k = plan_strides(150.0, costly, hz=20.0)
    per_s = 150.0 * 20 + sum(costly[g] * 20 / k[g] for g in costly)  # µs of CPU per second
    assert per_s <= 0.5 / 100 * 1e6 and all(k[g] > MIN_PERIOD_S[g] * 20 for g in costly)
    # fixed cost alone over budget: every group at its longest period
    assert plan_strides(300.0, costly, hz=20.0) == {g: round(MAX_PERIOD_S[g] * 20) for g in costly}


def test_sampler_a_failing_fast_read_is_switched_off_alone(tmp_path: Path) -> None:
    class NoReasons(FakeNvml):
        def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
            raise RuntimeError("NotSupported")

    s = Sampler(tmp_path / "n.csv", hz=100.0, nvml=NoReasons())
    rows = [s.sample_once()[0] for _ in range(3)]
    cols = {c: i for i, c in enumerate(COLUMNS)}
    assert "clock_event_reasons" in s.off and "power" not in s.off
    assert all(r[cols["clock_event_reasons"]] is None and r[cols["power_w"]] == 690.0 for r in rows)
    assert all(r[cols["sm_clock_mhz"]] == 1500 for r in rows)


def test_sampler_sees_only_visible_gpus(tmp_path: Path) -> None:
    s = Sampler(tmp_path / "n.csv", hz=10.0, nvml=FakeNvml(), devices=[3])
    assert s.devices == []  # index 3 does not exist on a 1-GPU machine
    assert os.path.exists(tmp_path) and s.samples == 0


def test_a_signal_during_export_does_not_lose_the_trace(tmp_path: Path) -> None:
    """The export is where a Ctrl-C hurts most: it is held until the file is whole."""
    p = start_long_recording(tmp_path, "0.001")
    deadline = time.time() + 120
    traces = tmp_path / "run" / "traces"
    while time.time() < deadline and not list(traces.glob("*.partial.json.gz")) and not (traces / "rank0.json.gz").exists():
        time.sleep(0.001)
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=60)
    m = manifest(tmp_path, "run")
    assert m["traces"], m["failures"]
    assert not list(traces.glob("*.partial.json.gz"))
