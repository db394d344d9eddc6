"""GPU peak rates: vendor datasheet figures, dense (no sparsity), and measured ceilings.

Peaks are TFLOP/s (TOP/s for int8) by math dtype, memory bandwidth in GB/s (10^9 B/s).
``fp32`` is the CUDA-core FP32 rate; ``tf32``, ``bf16``, ``fp16``, ``fp8``, ``int8`` and
``fp64_tc`` are tensor-core rates. Vendor tensor-core figures quoted "with sparsity" are halved
here. A spec file written by ``gpuprof calibrate`` (or by hand, for a GPU not listed) overrides
any of these; the datasheet entry it names, or the one its ``name`` matches, fills the rest.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuprof.errors import SpecError
from gpuprof.files import read_file

DTYPES = ("fp64", "fp64_tc", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    peaks_tflops: dict[str, float]
    hbm_gbps: float
    sm_count: int
    memory_gb: float
    nvlink_gbps: float = 0.0
    pcie_gbps: float = 0.0  # one direction, GB/s (PCIe Gen4 x16: 32, Gen5 x16: 64)
    source: str = "datasheet"
    measured: tuple[str, ...] = field(default_factory=tuple)

    def peak(self, dtype: str) -> float:
        """TFLOP/s for a math dtype; fp64 falls back to the CUDA-core rate."""
        return self.peaks_tflops.get(dtype) or self.peaks_tflops.get("fp32", 0.0)

    @property
    def ridge(self) -> dict[str, float]:
        """FLOP per byte at which each dtype's compute roof meets the memory roof."""
        return {k: v * 1e12 / (self.hbm_gbps * 1e9) for k, v in self.peaks_tflops.items()}


def _spec(key: str, name: str, fp64: float, fp64_tc: float, fp32: float, tf32: float, bf16: float,
          fp8: float, int8: float, hbm: float, sms: int, mem: float, nvlink: float, pcie_gen: int) -> GpuSpec:
    peaks = {"fp64": fp64, "fp64_tc": fp64_tc, "fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": bf16,
             "fp8": fp8, "int8": int8}
    pcie = {4: 32.0, 5: 64.0}[pcie_gen]
    return GpuSpec(key, name, {k: float(v) for k, v in peaks.items() if v}, float(hbm), sms, float(mem), float(nvlink), pcie)


# Datasheet figures (../shared/REFERENCE.md lists their sources). fp8 0 = not supported. The last
# column is the host link's PCIe generation (x16): A100 and L40S Gen4, Hopper and B200 Gen5.
BUILTIN: dict[str, GpuSpec] = {s.key: s for s in (
    _spec("A100-SXM4-40GB", "NVIDIA A100 40GB SXM", 9.7, 19.5, 19.5, 156, 312, 0, 624, 1555, 108, 40, 600, 4),
    _spec("A100-SXM4-80GB", "NVIDIA A100 80GB SXM", 9.7, 19.5, 19.5, 156, 312, 0, 624, 2039, 108, 80, 600, 4),
    _spec("A100-PCIE-40GB", "NVIDIA A100 40GB PCIe", 9.7, 19.5, 19.5, 156, 312, 0, 624, 1555, 108, 40, 600, 4),
    _spec("A100-PCIE-80GB", "NVIDIA A100 80GB PCIe", 9.7, 19.5, 19.5, 156, 312, 0, 624, 1935, 108, 80, 600, 4),
    _spec("H100-SXM", "NVIDIA H100 SXM", 34, 67, 67, 494.5, 989.5, 1979, 1979, 3350, 132, 80, 900, 5),
    _spec("H100-PCIE", "NVIDIA H100 PCIe", 26, 51, 51, 378, 756, 1513, 1513, 2000, 114, 80, 600, 5),
    _spec("H100-NVL", "NVIDIA H100 NVL", 30, 60, 60, 417.5, 835.5, 1670, 1670, 3900, 132, 94, 600, 5),
    _spec("H200-SXM", "NVIDIA H200 SXM", 34, 67, 67, 494.5, 989.5, 1979, 1979, 4800, 132, 141, 900, 5),
    _spec("H200-NVL", "NVIDIA H200 NVL", 30, 60, 60, 417.5, 835.5, 1670, 1670, 4800, 132, 141, 900, 5),
    _spec("L40S", "NVIDIA L40S", 1.4, 0, 91.6, 183, 362, 733, 733, 864, 142, 48, 0, 4),
    _spec("B200", "NVIDIA B200", 37, 37, 75, 1100, 2250, 4500, 4500, 7700, 148, 180, 1800, 5),
)}

# deviceProperties / nvidia-smi names, most specific first. The SXM parts carry no suffix.
_NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"H200.*NVL", "H200-NVL"),
    (r"H200", "H200-SXM"),
    (r"H100.*NVL", "H100-NVL"),
    (r"H100.*PCIE", "H100-PCIE"),
    (r"H100", "H100-SXM"),
    (r"A100.*PCIE.*80|A100.*80.*PCIE", "A100-PCIE-80GB"),
    (r"A100.*PCIE", "A100-PCIE-40GB"),
    (r"A100.*80", "A100-SXM4-80GB"),
    (r"A100", "A100-SXM4-40GB"),
    (r"L40S", "L40S"),
    (r"B200", "B200"),
)


def find_builtin(name: str, total_mem_bytes: int | None = None) -> GpuSpec | None:
    """The datasheet spec for a device name as torch or NVML spell it, or for a key above."""
    norm = name.upper().replace("_", "-")
    for key in BUILTIN:
        if norm == key.upper() or norm == BUILTIN[key].name.upper():
            return BUILTIN[key]
    for pattern, key in _NAME_RULES:
        if re.search(pattern, norm):
            if key == "A100-SXM4-40GB" and total_mem_bytes and total_mem_bytes > 50e9:
                key = "A100-SXM4-80GB"
            return BUILTIN[key]
    return None


def load_spec_file(path: str | Path) -> GpuSpec:
    """Read a spec file (``gpuprof calibrate`` output, or written by hand).

    Fields: ``name``; ``peaks_tflops`` {dtype: TFLOP/s}; ``hbm_gbps``; optional ``base`` (a
    built-in key to inherit unspecified values from), ``sm_count``, ``memory_gb``, ``measured``.
    """
    p = Path(path)
    try:
        raw = json.loads(read_file(p, SpecError).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise SpecError(f"not a JSON spec file ({e.__class__.__name__}: {e})", str(p)) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("name", ""), str):
        raise SpecError("a spec file is a JSON object with a string 'name'", str(p))
    peaks = raw.get("peaks_tflops", {})
    if not isinstance(peaks, dict):
        raise SpecError("'peaks_tflops' must be an object of dtype: TFLOP/s", str(p))
    for k, v in peaks.items():
        if k not in DTYPES:
            raise SpecError(f"unknown dtype {k!r} in peaks_tflops (known: {', '.join(DTYPES)})", str(p))
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            raise SpecError(f"peaks_tflops.{k} must be a positive number, got {v!r}", str(p))
    base = find_builtin(str(raw.get("base") or raw.get("name", "")))
    hbm = raw.get("hbm_gbps", base.hbm_gbps if base else None)
    if not isinstance(hbm, (int, float)) or isinstance(hbm, bool) or hbm <= 0:
        raise SpecError("'hbm_gbps' must be a positive number (or name a known 'base' GPU)", str(p))
    if base is None and not peaks:
        raise SpecError("no 'peaks_tflops' and no known 'base' GPU to take them from", str(p))
    merged = dict(base.peaks_tflops) if base else {}
    merged.update({k: float(v) for k, v in peaks.items()})
    measured = tuple(sorted(peaks)) + (("hbm_gbps",) if "hbm_gbps" in raw else ()) if raw.get("measured") else ()
    return GpuSpec(
        key=base.key if base else "custom",
        name=raw.get("name") or (base.name if base else "custom GPU"),
        peaks_tflops=merged,
        hbm_gbps=float(hbm),
        sm_count=int(raw.get("sm_count", base.sm_count if base else 0) or 0),
        memory_gb=float(raw.get("memory_gb", base.memory_gb if base else 0) or 0),
        nvlink_gbps=float(raw.get("nvlink_gbps", base.nvlink_gbps if base else 0) or 0),
        source=f"spec file {p}",
        measured=measured,
    )


def resolve(device_props: list[dict[str, Any]], gpu: str | None = None, spec_file: str | None = None) -> GpuSpec | None:
    """The spec to analyse against: a spec file, else ``--gpu NAME``, else the trace's device name.

    Returns None when the trace names no GPU gpuprof knows and nothing was given; the roofline
    then reports every kernel as ``unknown`` rather than guess.
    """
    if spec_file:
        return load_spec_file(spec_file)
    if gpu:
        found = find_builtin(gpu)
        if found is None:
            known = ", ".join(BUILTIN)
            raise SpecError(f"unknown GPU {gpu!r}; known: {known}; or pass --gpu-spec FILE")
        return replace(found, source=f"datasheet (--gpu {gpu})")
    for props in device_props:
        name = props.get("name")
        if isinstance(name, str):
            found = find_builtin(name, props.get("totalGlobalMem"))
            if found is not None:
                sms = props.get("numSms")
                return replace(found, sm_count=int(sms)) if isinstance(sms, int) and sms > 0 else found
    return None
