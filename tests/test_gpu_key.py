"""``--gpu`` names one datasheet entry exactly, or lists the candidates and exits 4 (issue 27):
MFU and every roofline % rest on the part's peaks, so a near miss is never analysed as a guess."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuprof.errors import SpecError
from gpuprof.specs import resolve
from tests.conftest import SAMPLES


@pytest.mark.parametrize("key,want", [("H100-SXM", "H100-SXM"), ("h100 sxm", "H100-SXM"), ("NVIDIA H100 PCIe", "H100-PCIE"),
                                      ("a100_sxm4_80gb", "A100-SXM4-80GB"), ("MI300X", "MI300X")])
def test_an_exact_key_or_name_resolves(key: str, want: str) -> None:
    spec = resolve([], gpu=key)
    assert spec is not None and spec.key == want and f"(--gpu {key})" in spec.source


@pytest.mark.parametrize("key,candidates", [
    ("H100-PCI", ["H100-PCIE"]),  # was analysed as H100 SXM (989 vs 756 TFLOP/s BF16)
    ("A100", ["A100-SXM4-40GB", "A100-SXM4-80GB", "A100-PCIE-40GB", "A100-PCIE-80GB"]),  # was A100 40GB SXM
    ("MI300", ["MI300A", "MI300X"]),
    ("NVIDIA H100 80GB HBM3", ["H100-SXM"]),  # a device name: the variant is the trace's to tell
])
def test_an_inexact_key_lists_the_candidates(key: str, candidates: list[str]) -> None:
    with pytest.raises(SpecError) as e:
        resolve([], gpu=key)
    assert e.value.exit_code == 4
    said = str(e.value)
    listed = said.split("could be " if "could be " in said else "did you mean ", 1)[1].split("?", 1)[0].split(", ")
    assert set(candidates) <= set(listed), said
    assert ("ambiguous" if len(listed) > 1 else "inexact") in said


def test_cli_exits_4_with_the_candidates() -> None:
    r = subprocess.run([sys.executable, "-m", "gpuprof.cli", "report", str(SAMPLES / "tiny_eager.json.gz"), "--gpu",
                        "A100", "--format", "json", "--no-cache"], capture_output=True, text=True)
    assert r.returncode == 4 and not r.stdout, r.stdout[:200]
    assert "ambiguous GPU 'A100'" in r.stderr and "A100-PCIE-80GB" in r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1
