"""`gpuprof record` end to end on CPU torch (CI has no GPU and no NVML), and the NVML sampler
against a fake NVML module."""

from __future__ import annotations

import csv
import json
import os
import re
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
    assert [(t["rank"], t["path"]) for t in m["traces"]] == [(0, "traces/rank0.json.gz")]
    # CPU torch: the host clock times the steps, and the manifest says so and why
    assert m["unprofiled_timing"] == {"method": "host_clock", "why": "the program does not use CUDA", "ranks": 1}
    assert m["ranks"][0]["unprofiled_timing"]["host_step_ms"] == m["unprofiled_step_ms"]
    assert m["command"][-4:] == ["20", "-1", "0", "0"] and m["torch"].startswith("2.")
    assert m["profiler"]["schedule"] == {"wait": 1, "warmup": 1, "active": 2, "repeat": 1}
    assert m["unprofiled_step_ms"] > 0 and m["ranks"][0]["timed_steps"] == 3
    assert "NVML unavailable" in m["nvml"].get("error", "NVML unavailable")  # CI machines have no NVML
    rep = subprocess.run([sys.executable, "-m", "gpuprof.cli", "report", str(tmp_path / "run"), "--format", "json"],
                         capture_output=True, text=True)
    doc = json.loads(rep.stdout)
    assert doc["summary"]["steps"] == 2 and doc["summary"]["unprofiled_step_time_ms"] == pytest.approx(
        m["unprofiled_step_ms"])


SLOWER_LATER = """
import sys, time, torch
m = torch.nn.Linear(16, 16); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(45):
    m(torch.randn(4, 16)).sum().backward(); opt.step(); opt.zero_grad()
    time.sleep(0.002 if i < 12 else 0.025)  # from step 13 on, after the profiled steps 7-10
"""


@pytest.mark.parametrize("user", [None, "0"])
def test_steps_after_profiling_are_timed_and_cupti_torn_down(tmp_path: Path, user: str | None) -> None:
    script = write(tmp_path, "train.py", SLOWER_LATER)
    env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
    if user is not None:
        env["TEARDOWN_CUPTI"] = user
    r = subprocess.run([sys.executable, "-m", "gpuprof.cli", "record", "--out", str(tmp_path / "run"), *FAST, "--",
                        sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    m = manifest(tmp_path, "run")
    assert m["profiler"]["teardown_cupti"] == ({"value": "1", "set_by": "gpuprof"} if user is None
                                               else {"value": "0", "set_by": "environment"})
    rank = m["ranks"][0]
    assert rank["profiler_started_at_step"] == 7 and rank["profiled_steps"] == 4
    # the check starts two steps after the stop (step 10) and times the next 20: steps 14-33
    assert rank["after_profiling_timing"] == {"method": "host_clock", "steps": [14, 33],
                                              "teardown_cupti": user or "1"}
    assert m["unprofiled_step_ms"] < 20 < m["after_profiling_step_ms"] == rank["after_profiling_step_ms"]


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


def trace_recorded(meta: Path) -> bool:
    """Whether a rank's record (``traces/*.meta.json``) names its written trace yet. The hook
    claims the record as an empty file (``hook._claim``) and fills it atomically later: a missing
    or empty file is "not yet", never a parse error."""
    text = meta.read_text() if meta.is_file() else ""
    return bool(text and json.loads(text).get("trace"))


def test_sigint_is_passed_on_and_the_run_folder_written(tmp_path: Path) -> None:
    p = start_long_recording(tmp_path, "0.01")
    deadline = time.time() + 120
    meta = tmp_path / "run" / "traces" / "rank0.meta.json"
    while time.time() < deadline and not trace_recorded(meta):
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
    assert r.returncode == 127, r.stderr
    assert r.stderr == "gpuprof: error: definitely-not-a-command-xyz: command not found\n"
    assert not (tmp_path / "run").exists()  # nothing ran: no run folder to mistake for a recording
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


# --- #15: the program's whole process tree, its own profiler, its processes' names, its path ------

LONG = """
import os, sys, time, torch
progress, sleep = sys.argv[1], float(sys.argv[2])
m = torch.nn.Linear(64, 10); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(100000):
    m(torch.randn(32, 64)).sum().backward(); opt.step(); opt.zero_grad()
    with open(progress + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {i + 1}")
    os.replace(progress + ".tmp", progress)
    time.sleep(sleep)
"""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_progress(path: Path, steps: int, timeout: float = 180) -> int:
    """The pid of the LONG program once it has done ``steps`` steps."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            pid, done = map(int, path.read_text().split())
            if done >= steps:
                return pid
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"the program did not reach step {steps}")


def record_bg(tmp: Path, shell: str, opts: list[str] = FAST) -> subprocess.Popen[str]:
    """`gpuprof record -- bash -c SHELL`: the program's processes are grandchildren of gpuprof."""
    return subprocess.Popen([sys.executable, "-m", "gpuprof.cli", "record", "--out", str(tmp / "run"), *opts, "--",
                             "bash", "-c", shell], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)


def _stop(p: subprocess.Popen[str], *pids: int) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    if p.poll() is None:
        p.kill()
        p.communicate()


def test_ctrl_c_reaches_the_programs_grandchildren(tmp_path: Path) -> None:
    prog = write(tmp_path, "long.py", LONG)
    p = record_bg(tmp_path, f'"{sys.executable}" "{prog}" "{tmp_path / "progress"}" 0.01; echo after')
    pid = wait_progress(tmp_path / "progress", 12)  # past the profiled window (steps 9-10)
    try:
        p.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C sends to gpuprof's (foreground) group
        out, err = p.communicate(timeout=90)
        assert p.returncode == 130, err  # bash dies of the SIGINT its python died of, as in a shell
        assert not alive(pid) and "after" not in out
        m = manifest(tmp_path, "run")
        assert m["exit_code"] == 130 and m["signal"] == signal.SIGINT and m["traces"]
    finally:
        _stop(p, pid)


def test_sigterm_waits_for_the_grandchild_trace(tmp_path: Path) -> None:
    """SIGTERM inside the active window: bash dies at once, its python flushes a partial trace;
    that trace is in the manifest, written after it, and no process of the program is left."""
    prog = write(tmp_path, "long.py", LONG)
    p = record_bg(tmp_path, f'"{sys.executable}" "{prog}" "{tmp_path / "progress"}" 0.6; echo after')
    pid = wait_progress(tmp_path / "progress", 8)  # steps 9 and 10 are the active ones
    try:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=90)
        assert p.returncode == 128 + signal.SIGTERM, err
        assert not alive(pid)
        m = manifest(tmp_path, "run")
        assert [t["path"] for t in m["traces"]] == ["traces/rank0.json.gz"], m["failures"]
        assert m["ranks"][0]["pid"] == pid and any("inside the active window" in f for f in m["failures"])
        trace = tmp_path / "run" / "traces" / "rank0.json.gz"
        assert (tmp_path / "run" / "manifest.json").stat().st_mtime_ns >= trace.stat().st_mtime_ns
    finally:
        _stop(p, pid)


def test_processes_left_running_after_a_signal_are_killed(tmp_path: Path) -> None:
    prog = write(tmp_path, "long.py", LONG)
    stubborn = tmp_path / "stubborn.pid"
    p = record_bg(tmp_path, f"(trap '' INT TERM HUP; exec sleep 300) & echo $! > {stubborn}; "
                            f'"{sys.executable}" "{prog}" "{tmp_path / "progress"}" 0.01',
                  opts=[*FAST, "--kill-after", "5"])  # counted from the signal: room for the "waiting" line
    pid = wait_progress(tmp_path / "progress", 12)
    sleeper = int(stubborn.read_text())
    try:
        assert alive(sleeper)
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=90)
        assert p.returncode == 128 + signal.SIGTERM, err
        assert not alive(sleeper) and not alive(pid) and time.time() - t0 < 60
        assert re.search(r"waiting for the [12] process\(es\) it left running", err), err
        m = manifest(tmp_path, "run")
        assert any(f.startswith("killed the program's processes still running 5 s") for f in m["failures"])
        assert m["traces"]
    finally:
        _stop(p, pid, sleeper)


def test_a_process_that_outlives_the_command_is_waited_for(tmp_path: Path) -> None:
    """`bash -c "python train.py &"`: bash ends at once, the trace comes later and is kept."""
    script = write(tmp_path, "train.py", TRAIN)
    r = record(tmp_path, "run", "bash", "-c", f'"{sys.executable}" "{script}" 20 -1 0 0.02 &')
    assert r.returncode == 0, r.stderr
    assert [t["path"] for t in manifest(tmp_path, "run")["traces"]] == ["traces/rank0.json.gz"]


OWN_PROFILER = """
import json, sys, torch
from torch.profiler import profile, schedule, ProfilerActivity
out, start_at = sys.argv[1], int(sys.argv[2])
m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.AdamW(m.parameters())
written = []

def ready(p):
    path = f"{out}.{len(written)}.json"
    p.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    written.append(sorted({e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}))

def train_step():
    loss = torch.nn.functional.cross_entropy(m(torch.randn(32, 64)), torch.randint(0, 10, (32,)))
    loss.backward(); opt.step(); opt.zero_grad()

for i in range(start_at):
    train_step()
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
             on_trace_ready=ready) as prof:
    for i in range(12):
        train_step(); prof.step()
json.dump(written, open(out + ".summary.json", "w"))
"""


@pytest.mark.parametrize("start_at", [0, 8])
def test_a_program_with_its_own_profiler_runs_as_without_gpuprof(tmp_path: Path, start_at: int) -> None:
    """The program enters torch.profiler before gpuprof's window (0) or inside its active window
    (8: steps 9-10): gpuprof stands aside and the program's own traces are what it gets alone."""
    prog = write(tmp_path, "own.py", OWN_PROFILER)
    plain = subprocess.run([sys.executable, str(prog), str(tmp_path / "plain"), str(start_at)], capture_output=True,
                           text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    r = record(tmp_path, "run", sys.executable, str(prog), str(tmp_path / "rec"), str(start_at))
    assert r.returncode == 0, r.stderr
    expected = json.loads((tmp_path / "plain.summary.json").read_text())
    assert len(expected) == 2 and json.loads((tmp_path / "rec.summary.json").read_text()) == expected
    assert "already enabled" not in r.stderr and "no active profiling session" not in r.stderr
    m = manifest(tmp_path, "run")
    rank = m["ranks"][0]
    assert m["traces"] == [] and rank["status"] == "stood_aside" and not list((tmp_path / "run" / "traces").glob(
        "*.json.gz"))
    assert rank["own_profiler"] == {"what": "torch.profiler.profile", "at_step": start_at}
    assert any("ran its own profiler (torch.profiler.profile" in f and "stood aside" in f for f in m["failures"])
    if start_at == 0:  # profiled from the start: no unprofiled timing, and it says why
        assert m["unprofiled_step_ms"] is None and "own profiler" in rank["unprofiled_timing"]["why"]
    else:  # the timed steps (3-6) ended before the program's profiler began
        assert m["unprofiled_step_ms"] > 0


SPAWN = """
import sys, torch, torch.distributed as dist, torch.multiprocessing as mp

def worker(rank, world, port, use_pg):
    if use_pg:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    m = torch.nn.Linear(32, 32)
    if use_pg:
        m = torch.nn.parallel.DistributedDataParallel(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for i in range(12):
        m(torch.randn(8, 32)).sum().backward(); opt.step(); opt.zero_grad()
    if use_pg:
        dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(2, int(sys.argv[1]), sys.argv[2] == "pg"), nprocs=2)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("mode", ["pg", "none"])
def test_spawned_workers_never_overwrite_each_other(tmp_path: Path, mode: str) -> None:
    """torch.multiprocessing.spawn sets no RANK: with a process group the files are named by its
    ranks, without one by pid; either way each worker keeps its own trace and the manifest lists both."""
    prog = write(tmp_path, "spawn.py", SPAWN)
    r = record(tmp_path, "run", sys.executable, str(prog), str(_free_port()), mode)
    assert r.returncode == 0, r.stderr[-3000:]
    m = manifest(tmp_path, "run")
    assert len(m["traces"]) == 2 and len(m["ranks"]) == 2 and m["failures"] == [], m["failures"]
    pids = sorted(rec["pid"] for rec in m["ranks"])
    if mode == "pg":
        assert [t["path"] for t in m["traces"]] == ["traces/rank0.json.gz", "traces/rank1.json.gz"]
        assert {rec["rank_source"] for rec in m["ranks"]} == {"process_group"} and m["world_size"] == 2
    else:
        assert sorted(t["path"] for t in m["traces"]) == [f"traces/pid{p}.json.gz" for p in pids]
        assert all("rank" not in t for t in m["traces"]) and {rec["rank_source"] for rec in m["ranks"]} == {"pid"}
    rep = subprocess.run([sys.executable, "-m", "gpuprof.cli", "report", str(tmp_path / "run"), "--format", "json"],
                         capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert len(json.loads(rep.stdout)["source"]["paths"]) == 2


def test_a_second_process_claiming_a_rank_gets_its_own_name(tmp_path: Path) -> None:
    """Two main processes one after another (`a.py; b.py`) are both rank 0 by default: the second
    keeps its trace under its pid instead of replacing the first's."""
    script = write(tmp_path, "train.py", TRAIN)
    one = f'"{sys.executable}" "{script}" 20 -1 0 0'
    r = record(tmp_path, "run", "bash", "-c", f"{one}; {one}")
    assert r.returncode == 0, r.stderr
    m = manifest(tmp_path, "run")
    second = next(rec for rec in m["ranks"] if rec["name"] != "rank0")
    assert [t["path"] for t in m["traces"]] == ["traces/rank0.json.gz", f"traces/rank0.pid{second['pid']}.json.gz"]


USER_PROGRAM = """
import json, os, sys
import analyzers, benchmarks, reports, tests
import torch, gpuprof
m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(12):
    m(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
print(json.dumps({"who": [analyzers.WHO, benchmarks.WHO, reports.WHO, tests.WHO],
                  "pythonpath": os.environ["PYTHONPATH"], "gpuprof": gpuprof.__file__}))
"""


def test_the_programs_own_modules_are_not_shadowed(tmp_path: Path) -> None:
    """A user's `reports`, `tests`, `analyzers`, `benchmarks` (on the user's PYTHONPATH) are what
    the program imports, not the same-named folders of gpuprof's checkout."""
    from gpuprof.record.launcher import BOOT

    lib = tmp_path / "lib"
    (lib / "tests").mkdir(parents=True)
    (lib / "benchmarks").mkdir()
    (lib / "reports.py").write_text("WHO = 'user reports'\n")
    (lib / "analyzers.py").write_text("WHO = 'user analyzers'\n")
    (lib / "tests" / "__init__.py").write_text("WHO = 'user tests'\n")
    (lib / "benchmarks" / "__init__.py").write_text("WHO = 'user benchmarks'\n")
    (tmp_path / "app").mkdir()
    prog = write(tmp_path / "app", "main.py", USER_PROGRAM)
    r = subprocess.run([sys.executable, "-m", "gpuprof.cli", "record", "--out", str(tmp_path / "run"), *FAST, "--",
                        sys.executable, str(prog)], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(lib)})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["who"] == ["user analyzers", "user benchmarks", "user reports", "user tests"]
    assert out["pythonpath"] == os.pathsep.join([str(BOOT), str(lib)])
    assert manifest(tmp_path, "run")["traces"]  # and gpuprof itself was found and recorded


def test_the_bootstrap_makes_only_gpuprof_importable(tmp_path: Path) -> None:
    """An interpreter that cannot see gpuprof (-S: no site-packages, so no install) finds gpuprof
    through the bootstrap, and nothing else that sits beside it."""
    from gpuprof.record.launcher import BOOT

    code = ("import os, runpy, importlib.util as u; os.environ['GPUPROF_RUN_DIR'] = 'x'; "
            f"runpy.run_path({str(BOOT / 'sitecustomize.py')!r}); import gpuprof.record.hook as h; "
            "print(h.__file__, [n for n in ('reports', 'analyzers', 'tests', 'benchmarks') if u.find_spec(n)])")
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    path, found = r.stdout.split(" ", 1)
    assert Path(path) == BOOT.parent / "hook.py" and found.strip() == "[]"


# --- #15/#11: bad --out, bad counts, commands that cannot start, programs that never step -------

@pytest.mark.parametrize("out", ["/proc/gpuprof-no-such-dir/run", "/sys/gpuprof-test-run", "file"])
def test_an_unwritable_out_is_one_line(tmp_path: Path, out: str) -> None:
    if out == "file":
        (tmp_path / "file").write_text("keep me")
    target = tmp_path / out if out == "file" else Path(out)
    r = subprocess.run([sys.executable, "-m", "gpuprof.cli", "record", "--out", str(target), "--", sys.executable,
                        "-c", "pass"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(f"gpuprof: error: {target}: ")
    assert "Traceback" not in r.stderr
    if out == "file":
        assert (tmp_path / "file").read_text() == "keep me"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_is_one_line(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = record(tmp_path, "ro/run", sys.executable, "-c", "pass")
        assert r.returncode == 2 and "cannot create the run folder (Permission denied)" in r.stderr
        r = record(tmp_path, "ro", sys.executable, "-c", "pass")  # the empty folder itself
        assert r.returncode == 2 and "cannot write in the run folder (Permission denied)" in r.stderr
    finally:
        ro.chmod(0o755)


def test_two_records_into_one_folder(tmp_path: Path) -> None:
    """Started together into one new folder: exactly one records, the others are refused in one line."""
    script = write(tmp_path, "train.py", TRAIN)
    ps = [subprocess.Popen([sys.executable, "-m", "gpuprof.cli", "record", "--out", str(tmp_path / "run"), *FAST,
                            "--", sys.executable, str(script), "20", "-1", "0", "0"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path) for _ in range(4)]
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in ps]
    assert sorted(rc for rc, _ in results) == [0, 2, 2, 2], results
    for rc, err in results:
        if rc == 2:
            assert err.count("\n") == 1 and ("already in use" in err or "is not empty" in err), err
    m = manifest(tmp_path, "run")
    assert m["exit_code"] == 0 and len(m["ranks"]) == 1 and m["traces"]
    # and a record into the finished run is refused, leaving it as it was
    before = (tmp_path / "run" / "manifest.json").read_bytes()
    r = record(tmp_path, "run", sys.executable, "-c", "pass")
    assert r.returncode == 2 and (tmp_path / "run" / "manifest.json").read_bytes() == before


@pytest.mark.parametrize("opt", [["--skip-steps", "-1"], ["--timed-steps", "-3"], ["--nvml-hz", "0"],
                                 ["--kill-after", "-1"]])
def test_negative_counts_are_refused(tmp_path: Path, opt: list[str]) -> None:
    r = record(tmp_path, "run", sys.executable, "-c", "pass", opts=opt)
    assert r.returncode == 2 and "Invalid value" in r.stderr and not (tmp_path / "run").exists()


def test_a_command_that_cannot_run_exits_as_a_shell_would(tmp_path: Path) -> None:
    script = write(tmp_path, "notexec.sh", "#!/bin/sh\necho hi\n")
    r = record(tmp_path, "run", str(script))
    assert r.returncode == 126 and r.stderr == f"gpuprof: error: {script}: is not an executable file\n"
    r = record(tmp_path, "run", str(tmp_path / "missing.py"))
    assert r.returncode == 127 and r.stderr.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_a_program_that_never_steps_is_told_how_to_mark_steps(tmp_path: Path) -> None:
    script = write(tmp_path, "nostep.py", "import torch\nm = torch.nn.Linear(4, 4)\nfor i in range(20):\n"
                                          "    m(torch.randn(2, 4))\n")
    r = record(tmp_path, "run", sys.executable, str(script))
    assert r.returncode == 0, r.stderr
    m = manifest(tmp_path, "run")
    assert m["ranks"] == [] and m["processes_without_steps"][0]["program"] == "nostep.py"
    (msg,) = m["failures"]
    assert msg.startswith("torch was imported by nostep.py (pid ") and "never called step() on a torch.optim" in msg
    assert "gpuprof.step()" in msg and "never imported" not in msg
    assert not (tmp_path / "run" / ".procs").exists()
    r = record(tmp_path, "run2", sys.executable, "-c", "print('no torch here')")
    assert r.returncode == 0 and manifest(tmp_path, "run2")["failures"][0].startswith(
        "no process of the program imported torch")


def test_cuda_event_timing_spans_the_window_without_a_sync_per_step(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    """SYNTHETIC (no GPU here): a fake torch.cuda whose GPU takes 10 ms per step and runs 3 steps
    behind a host that enqueues a step in microseconds. The recorder's figure is the GPU's, taken
    from one event at each end of the window; it never waits for the GPU unless the process ends."""
    import torch

    from gpuprof.record import hook

    now = {"step": 0, "syncs": 0}

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            self.at = -1

        def record(self, stream: object) -> None:
            assert stream == "stream of cuda:1"
            self.at = now["step"]

        def query(self) -> bool:
            return now["step"] >= self.at + 3

        def synchronize(self) -> None:
            now["syncs"] += 1

        def elapsed_time(self, end: "Event") -> float:
            return (end.at - self.at) * 10.0

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: f"stream of {dev}")

    def run(steps: int) -> hook.Recorder:
        rec = hook.Recorder(tmp_path, (2, 4, 1, 1, 1, 1), True, False)
        rec.device = torch.device("cuda", 1)  # the stepping optimizer's parameters' device
        monkeypatch.setattr(rec, "_start", lambda: None)  # the profiler itself is not under test here
        for _ in range(steps):
            now["step"] += 1
            rec.step()
        return rec

    rec = run(7)  # marks at steps 3..7: 4 timed steps
    ms, timing = rec.unprofiled()
    assert ms is None and timing["method"] == "cuda_events" and timing["device"] == "cuda:1"  # GPU not there yet
    now["step"] += 3
    ms, timing = rec.unprofiled()
    assert ms == pytest.approx(10.0) and timing["steps"] == 4 and timing["host_step_ms"] < 5.0
    assert now["syncs"] == 0
    rec = run(7)
    assert rec.unprofiled(block=True)[0] == pytest.approx(10.0) and now["syncs"] == 1  # at exit only


def test_gpm_mean_counts_intervals_that_saw_the_gpu_busy() -> None:
    """A GPM value covers the time since the previous GPM read. On a short program the only GPM
    read after the start can be the recorder's last row, taken once the GPU is idle again: it
    measured the busy run and must count (test_gpu.py saw gpm_sm_util_pct_mean None on the H200).
    An interval with no busy sample inside stays out. Synthetic samples built here."""
    import numpy as np
    import pandas as pd

    from gpuprof.nvml_data import summarize

    nan = np.nan
    df = pd.DataFrame({
        "ts_ns": [0, 1, 2, 3, 4, 5, 6],
        "gpu": [0] * 7,
        "util_gpu_pct": [0, 0, 90, 95, 0, 0, 0],
        "gpm_sm_util_pct": [nan, 5.0, nan, nan, 70.0, nan, 1.0],  # (-inf,1] idle, (1,4] busy, (4,6] idle
        "gpm_tensor_util_pct": [nan] * 7,
    })
    s = summarize(df, 0.1)
    assert s["gpm_sm_util_pct_mean"] == 70.0
    assert s["gpm_tensor_util_pct_mean"] is None
    assert s["util_gpu_pct_mean"] == 92.5
