"""GPU-only: a real `gpuprof record` of a GPU training program, with NVML and GPM series in the
report. Runs with `pytest -m gpu` on a GPU machine; elsewhere it is deselected (see conftest),
never reported as passed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.gpu


def test_record_a_gpu_program_with_nvml(tmp_path: Path) -> None:
    run = tmp_path / "run"
    prog = ROOT / "sample_traces" / "programs" / "gpt.py"
    r = subprocess.run([sys.executable, "-m", "gpuprof.cli", "record", "--out", str(run), "--", sys.executable,
                        str(prog), "--no-profile", "--out", str(tmp_path / "unused.json.gz"), "--timed-steps", "30"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((run / "manifest.json").read_text())
    assert m["traces"] and m["gpus"][0]["uuid"].startswith("GPU-") and m["cuda"]
    assert m["nvml"]["samples"] > 20 and m["unprofiled_step_ms"] > 0
    rep = subprocess.run([sys.executable, "-m", "gpuprof.cli", "report", str(run), "--format", "json"],
                         capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0, rep.stderr[-3000:]
    doc = json.loads(rep.stdout)
    n = doc["nvml"][0]
    assert n["busy_samples"] > 0 and n["sm_clock_mhz_max"] > 0 and n["power_limit_w"] > 0
    if "gpm" not in m["nvml"]["unavailable"]:
        assert n["gpm_sm_util_pct_mean"] is not None
    assert doc["kernels"] and doc["summary"]["mfu_pct"] > 0
    print(json.dumps({"nvml": n, "unavailable": m["nvml"]["unavailable"],
                      "sampler_cpu_pct_of_one_core": m["nvml"]["sampler_cpu_pct_of_one_core"]}, indent=1))


def test_record_torchrun_on_two_gpus(tmp_path: Path) -> None:
    """`gpuprof record -- torchrun` with one rank per GPU: a trace per rank, both GPUs sampled,
    and the report names the rank made slow on purpose (40 ms of host work per step on rank 1)."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    run = tmp_path / "run"
    prog = ROOT / "sample_traces" / "programs" / "gpt.py"
    r = subprocess.run([sys.executable, "-m", "gpuprof.cli", "record", "--out", str(run), "--", sys.executable, "-m",
                        "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(prog), "--ddp",
                        "--slow-rank-ms", "40", "--no-profile", "--out", str(tmp_path / "unused.json.gz"),
                        "--timed-steps", "20"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((run / "manifest.json").read_text())
    assert [t["rank"] for t in m["traces"]] == [0, 1] and m["world_size"] == 2
    assert m["nvml"]["devices"] == [0, 1] and m["nvml"]["samples"] > 20
    rep = subprocess.run([sys.executable, "-m", "gpuprof.cli", "report", str(run), "--format", "json"],
                         capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0, rep.stderr[-3000:]
    doc = json.loads(rep.stdout)
    assert doc["source"]["ranks"] == [0, 1] and len(doc["nvml"]) == 2
    top = doc["findings"][0]
    assert top["category"] == "rank_imbalance" and top["evidence"]["slow_rank"] == 1
    print(json.dumps({"top": top["title"], "sampler_cpu_pct_of_one_core": m["nvml"]["sampler_cpu_pct_of_one_core"],
                      "read_periods_s": m["nvml"].get("read_periods_s")}, indent=1))
