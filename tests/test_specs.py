"""GPU specs (#10): every listed GPU has a datasheet entry, real device spellings resolve to the
right one, nameless devices resolve from their architecture, and bad spec files are one line."""

from __future__ import annotations

import gzip
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuprof.errors import SpecError
from gpuprof.specs import BUILTIN, DTYPES, find_builtin, load_spec_file, resolve
from tests.conftest import ROOT, SAMPLES, TraceBuilder, simple_training_trace

PUBLIC = ROOT / ".." / "shared" / "traces" / "public"

#: The GPUs issue #10 lists, each with a device name as torch/NVML/ROCm spell it (the first nine are
#: spellings seen in real traces of ../shared/traces/public) and the entry it must resolve to.
SPELLINGS = {
    "Tesla V100-DGXS-32GB": "V100-DGXS-32GB", "Tesla V100-SXM2-32GB": "V100-SXM2-32GB",
    "NVIDIA GeForce RTX 2080 Ti": "RTX-2080-Ti", "NVIDIA H100 80GB HBM3": "H100-SXM",
    "AMD Instinct MI300X VF": "MI300X", "AMD Instinct MI300X": "MI300X", "AMD Instinct MI210": "MI210",
    "NVIDIA H800": "H800-SXM", "NVIDIA B200": "B200",
    "Tesla V100-SXM2-16GB": "V100-SXM2-16GB", "Tesla V100-PCIE-16GB": "V100-PCIE-16GB",
    "Tesla V100-PCIE-32GB": "V100-PCIE-32GB", "Tesla V100-DGXS-16GB": "V100-DGXS-16GB", "Tesla T4": "T4",
    "NVIDIA A10": "A10", "NVIDIA A10G": "A10G", "NVIDIA A30": "A30", "NVIDIA A40": "A40",
    "NVIDIA A100-SXM4-40GB": "A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB": "A100-SXM4-80GB",
    "NVIDIA A100-PCIE-40GB": "A100-PCIE-40GB", "NVIDIA A100 80GB PCIe": "A100-PCIE-80GB",
    "NVIDIA A800-SXM4-80GB": "A800-SXM4-80GB", "NVIDIA A800 80GB PCIe": "A800-PCIE-80GB",
    "NVIDIA A800 40GB PCIe": "A800-PCIE-40GB", "NVIDIA L4": "L4", "NVIDIA L40": "L40", "NVIDIA L40S": "L40S",
    "NVIDIA RTX A6000": "RTX-A6000", "NVIDIA RTX 6000 Ada Generation": "RTX-6000-Ada",
    "NVIDIA GeForce RTX 3090": "RTX-3090", "NVIDIA GeForce RTX 4090": "RTX-4090",
    "NVIDIA GeForce RTX 5090": "RTX-5090", "NVIDIA H100 PCIe": "H100-PCIE", "NVIDIA H100 NVL": "H100-NVL",
    "NVIDIA H800 PCIe": "H800-PCIE", "NVIDIA H20": "H20", "NVIDIA H200": "H200-SXM", "NVIDIA H200 NVL": "H200-NVL",
    "NVIDIA GH200 480GB": "GH200-96GB", "NVIDIA GH200 144G HBM3e": "GH200-144GB", "NVIDIA B100": "B100",
    "NVIDIA GB200": "GB200", "AMD Instinct MI100": "MI100", "AMD Instinct MI250": "MI250",
    "AMD Instinct MI250X": "MI250X", "AMD Instinct MI300A": "MI300A", "AMD Instinct MI325X": "MI325X",
    "AMD Instinct MI355X": "MI355X",
}


def test_every_listed_gpu_has_a_complete_datasheet_entry() -> None:
    assert set(SPELLINGS.values()) == set(BUILTIN)  # every entry is reachable from a real spelling
    for key, s in BUILTIN.items():
        assert re.search("datasheet|data sheet|whitepaper|product brief", s.source.lower()), key
        assert s.boost_mhz > 0 or "unpublished" in s.source or "H20" in key, key
        assert set(s.peaks_tflops) <= set(DTYPES) and s.peaks_tflops.get("fp32", 0) > 0, key
        assert all(math.isfinite(v) and v > 0 for v in s.peaks_tflops.values()), key
        assert s.hbm_gbps > 0 and s.sm_count > 0 and s.memory_gb > 0 and s.interconnect and s.vendor in ("nvidia", "amd")
        assert s.pcie_gbps > 0
        bf16, fp16 = s.peaks_tflops.get("bf16"), s.peaks_tflops.get("fp16")
        assert fp16, key  # every part since Volta has FP16 matrix math
        if bf16:
            assert bf16 <= fp16, key  # where they differ (MI100), BF16 is the slower
    # Volta and Turing have FP16 tensor cores but no BF16, TF32 or FP8
    for key in ("V100-SXM2-32GB", "V100-PCIE-16GB", "V100-DGXS-32GB", "T4", "RTX-2080-Ti"):
        assert not {"bf16", "tf32", "fp8"} & set(BUILTIN[key].peaks_tflops), key
    assert BUILTIN["MI100"].peaks_tflops["bf16"] < BUILTIN["MI100"].peaks_tflops["fp16"]
    # FP8 only from Ada/Hopper/Blackwell and CDNA 3 on
    assert {k for k, s in BUILTIN.items() if "fp8" in s.peaks_tflops} >= {"H100-SXM", "L40S", "B200", "MI300X"}
    assert not {"A100-SXM4-80GB", "MI250X", "RTX-3090"} & {k for k, s in BUILTIN.items() if "fp8" in s.peaks_tflops}
    # dense figures: the halved "with sparsity" numbers of a few datasheets
    assert BUILTIN["H100-SXM"].peaks_tflops["bf16"] == 989.5 and BUILTIN["MI300X"].peaks_tflops["fp8"] == 2614.9


@pytest.mark.parametrize("name,key", sorted(SPELLINGS.items()))
def test_device_names_resolve(name: str, key: str) -> None:
    found = find_builtin(name)
    assert found is not None and found.key == key
    assert resolve([], gpu=key).key == key  # type: ignore[union-attr]  # --gpu takes every entry by key
    assert resolve([], gpu=found.name).key == key  # type: ignore[union-attr]  # ... and by its name


def test_names_that_are_not_a_listed_part_do_not_match() -> None:
    for name in ("NVIDIA RTX A4000", "NVIDIA GeForce RTX 4090 Laptop GPU", "Tesla V100S-PCIE-32GB", "NVIDIA GeForce RTX 3090 Ti",
                 "Voodoo5 6000", "", "NVIDIA A1000"):
        assert find_builtin(name) is None, name


def test_variants_are_told_apart_by_sms_and_memory() -> None:
    """One name, several parts: SM/CU count and memory choose, and a device that is a share of its
    part (an MI250X GCD, an MI300X CPX partition, an A100 MIG slice) gets that share of the peaks."""
    gcd = resolve([{"name": "AMD Instinct MI250X/MI250", "numSms": 110, "totalGlobalMem": 68702699520}])
    assert gcd is not None and gcd.key == "MI250X" and gcd.sm_count == 110
    assert gcd.peaks_tflops["bf16"] == pytest.approx(383 / 2) and gcd.hbm_gbps == pytest.approx(3276.8 / 2)
    mi250 = resolve([{"name": "AMD Instinct MI250X/MI250", "numSms": 104, "totalGlobalMem": 68702699520}])
    assert mi250 is not None and mi250.key == "MI250" and mi250.peaks_tflops["bf16"] == pytest.approx(362.1 / 2)
    cpx = resolve([{"name": "AMD Instinct MI300X", "numSms": 38, "totalGlobalMem": 206141652992}])
    assert cpx is not None and cpx.peaks_tflops["fp8"] == pytest.approx(2614.9 / 8) and cpx.hbm_gbps == 5300
    mig = resolve([{"name": "NVIDIA A100-SXM4-40GB MIG 3g.20gb", "numSms": 42, "totalGlobalMem": 21 * 2**30}])
    assert mig is not None and mig.key == "A100-SXM4-40GB" and mig.peaks_tflops["bf16"] == pytest.approx(312 * 42 / 108)
    assert mig.hbm_gbps < 1555 and "42 of 108" in mig.source
    assert resolve([{"name": "NVIDIA H100 80GB HBM3", "numSms": 114}]).key == "H100-PCIE"  # type: ignore[union-attr]
    assert resolve([{"name": "NVIDIA A100-PCIE", "numSms": 108, "totalGlobalMem": 85 * 10**9}]).key == "A100-PCIE-80GB"  # type: ignore[union-attr]
    assert find_builtin("NVIDIA A100-SXM4", 85 * 10**9).key == "A100-SXM4-80GB"  # type: ignore[union-attr]
    full = resolve([{"name": "NVIDIA H100 80GB HBM3", "numSms": 132, "totalGlobalMem": 85045477376}])
    assert full == BUILTIN["H100-SXM"]  # a whole device is the datasheet entry, unscaled


def test_nameless_devices_resolve_from_their_architecture() -> None:
    """vLLM on ROCm writes an empty name: compute capability (or gfx name), CU count and memory
    find the part; warp size 64 keeps AMD's 9.0 (MI200) apart from NVIDIA's 9.0 (Hopper)."""
    mi300 = {"name": "", "computeMajor": 9, "computeMinor": 4, "numSms": 304, "totalGlobalMem": 206141652992,
             "warpSize": 64}
    assert resolve([mi300]).key == "MI300X"  # type: ignore[union-attr]
    assert resolve([{**mi300, "totalGlobalMem": 274877906944}]).key == "MI325X"  # type: ignore[union-attr]
    assert resolve([{"name": "", "gcnArchName": "gfx90a:sramecc+:xnack-", "numSms": 110,
                     "totalGlobalMem": 68702699520}]).key == "MI250X"  # type: ignore[union-attr]
    assert resolve([{"name": "", "gcnArchName": "gfx950", "numSms": 256}]).key == "MI355X"  # type: ignore[union-attr]
    mi210 = {"name": "", "computeMajor": 9, "computeMinor": 0, "numSms": 104, "totalGlobalMem": 68702699520, "warpSize": 64}
    assert resolve([mi210]).vendor == "amd"  # type: ignore[union-attr]
    h100 = {"name": "", "computeMajor": 9, "computeMinor": 0, "numSms": 132, "totalGlobalMem": 85045477376, "warpSize": 32}
    got = resolve([h100])
    assert got is not None and got.key == "H100-SXM" and "matched by architecture" in got.source
    v100 = {"computeMajor": 7, "computeMinor": 0, "numSms": 80, "totalGlobalMem": 34079899648, "warpSize": 32}
    assert resolve([v100]).key.startswith("V100-") and resolve([v100]).memory_gb == 32  # type: ignore[union-attr]
    assert resolve([{"name": "", "computeMajor": 9, "computeMinor": 0, "numSms": 77, "warpSize": 32}]) is None
    assert resolve([{"name": "", "computeMajor": 42, "computeMinor": 0, "numSms": 132}]) is None


def _device_properties(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    props = doc.get("deviceProperties") if isinstance(doc, dict) else None
    return [p for p in props or [] if isinstance(p, dict)]


def test_every_public_trace_gpu_resolves() -> None:
    """Every trace of ../shared/traces/public whose MANIFEST names a GPU (or an empty name: the
    vLLM ROCm traces) resolves to the part the MANIFEST says; the ones without any device
    information (torch 1.8 era) resolve to nothing, and are analysed as an unknown GPU."""
    manifest = PUBLIC / "MANIFEST.json"
    if not manifest.is_file():
        pytest.skip("../shared/traces/public is absent (the shared real-trace corpus)")
    entries = json.loads(manifest.read_text())["entries"]
    seen = 0
    for e in entries:
        props = _device_properties(PUBLIC / e["file"])
        spec = resolve(props)
        if e["gpu"] is None:
            assert not props and spec is None, e["file"]
            continue
        assert spec is not None, e["file"]
        if e["gpu"]:
            assert spec.key == SPELLINGS[e["gpu"]], e["file"]
        else:
            assert spec.key == "MI300X" and "architecture" in spec.source, e["file"]
        seen += 1
    assert seen >= 20


def test_unknown_gpu_still_reports_time_by_class_and_host_findings(tmp_path: Path) -> None:
    """SYNTHETIC trace on a GPU no entry knows: the report has time by class, host-side analyzers
    run, spec-bound ones are listed as skipped, and there is exactly one unknown-GPU warning."""
    import gpuprof

    b = simple_training_trace(TraceBuilder(device={"id": 0, "name": "Imaginary GPU 9000", "numSms": 77,
                                                   "computeMajor": 99, "computeMinor": 0}))
    p = b.write(tmp_path / "t.json")
    d = gpuprof.analyze(p, cache=False).to_dict()
    assert d["gpu"]["name"] == "Imaginary GPU 9000" and d["gpu"]["spec"]["hbm_gbps"] is None
    assert sum(d["summary"]["breakdown_pct"].values()) == pytest.approx(100.0)
    assert d["summary"]["breakdown_pct"]["unknown"] > 0
    assert len([w for w in d["warnings"] if "unknown GPU" in w]) == 1
    skipped = {s["analyzer"] for s in d["analyzers_skipped"]}
    from gpuprof.analyzers import REGISTRY

    assert skipped and skipped != {a.name for a in REGISTRY}  # host-side analyzers still ran


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuprof.cli", *args], capture_output=True, text=True, timeout=120)


def test_bad_gpu_name_lists_every_entry() -> None:
    r = _cli("report", str(SAMPLES / "tiny_eager.json.gz"), "--gpu", "Voodoo5", "--format", "json", "--no-cache")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 4 and len(lines) == 1 and "Traceback" not in r.stderr
    assert all(key in lines[0] for key in BUILTIN)


@pytest.mark.parametrize("doc,field", [
    ({"name": "x", "hbm_gbps": "3350", "peaks_tflops": {"bf16": 1}}, "'hbm_gbps'"),
    ({"name": "x", "hbm_gbps": 3350, "peaks_tflops": [1, 2]}, "'peaks_tflops'"),
    ({"name": "x", "hbm_gbps": 3350, "peaks_tflops": {"bf16": "fast"}}, "peaks_tflops.bf16"),
    ({"name": "x", "hbm_gbps": float("nan"), "peaks_tflops": {"bf16": 1}}, "'hbm_gbps'"),
    ({"name": "x", "hbm_gbps": float("inf"), "peaks_tflops": {"bf16": 1}}, "'hbm_gbps'"),
    ({"name": "x", "hbm_gbps": 3350, "peaks_tflops": {"bf16": float("inf")}}, "peaks_tflops.bf16"),
    ({"name": "x", "hbm_gbps": 3350, "peaks_tflops": {"bf16": 1}, "sm_count": "132"}, "'sm_count'"),
    ({"name": "x", "hbm_gbps": 3350, "peaks_tflops": {"bf16": 1}, "sm_count": 13.5}, "'sm_count'"),
    ({"name": "x", "hbm_gbps": 3350, "peaks_tflops": {"bf16": 1}, "memory_gb": "80"}, "'memory_gb'"),
    ({"name": "x", "hbm_gbps": 3350, "peaks_tflops": {"bf16": 1}, "nvlink_gbps": -1}, "'nvlink_gbps'"),
    ({"name": 7, "hbm_gbps": 3350, "peaks_tflops": {"bf16": 1}}, "'name'"),
    ({"name": "x", "base": ["H100-SXM"], "peaks_tflops": {"bf16": 1}}, "'base'"),
    ({"name": "x", "base": "Voodoo5", "peaks_tflops": {"bf16": 1}}, "'base'"),
    ({"name": "x", "hbm_gbps": 3350, "peaks_tflops": {"bf16": 1}, "measured": "yes"}, "'measured'"),
    ([1, 2, 3], "JSON object"),
])
def test_spec_file_fields_of_wrong_types_are_one_line(doc: Any, field: str, tmp_path: Path) -> None:
    """SYNTHETIC spec files, each with one field of a wrong type or a non-finite number (Python's
    json writes NaN/Infinity, which json.loads reads back): exit 4, one line naming file and field."""
    p = tmp_path / "spec.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        load_spec_file(p)
    r = _cli("report", str(SAMPLES / "tiny_eager.json.gz"), "--gpu-spec", str(p), "--format", "json", "--no-cache")
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 4 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert str(p) in lines[0] and field.strip("'").split(".")[0] in lines[0]
