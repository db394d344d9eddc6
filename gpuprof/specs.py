"""GPU peak rates: vendor datasheet figures, dense (no sparsity), and measured ceilings.

Peaks are TFLOP/s (TOP/s for int8) by math dtype, memory bandwidth in GB/s (10^9 B/s).
``fp32`` is the CUDA-core (AMD: vector) FP32 rate; ``fp64`` the vector FP64 rate; ``tf32``
(AMD: XF32), ``bf16``, ``fp16``, ``fp8``, ``int8`` and ``fp64_tc`` (AMD: FP64 matrix) are
tensor-core / matrix-core rates. Vendor figures quoted "with sparsity" are halved here. A dtype
a part lacks is absent (V100 and T4 have no BF16, TF32 or FP8; only Hopper, Ada, Blackwell and
MI300 onwards have FP8). GeForce and some Ada parts run FP16/BF16 tensor math at half rate with
FP32 accumulation, which is what PyTorch uses: those FP32-accumulate figures are the ones kept.

Each entry carries the datasheet it comes from (``source``). A device is matched from the
trace's name as torch, NVML or ROCm spell it; where the name is empty (vLLM on ROCm writes
none), from its architecture (compute capability or gfx name, SM/CU count, memory). A device
with fewer SMs/CUs than its part (an MI250X GCD, an MI300X CPX partition, a MIG slice) gets
the part's peaks scaled to its share. A spec file written by ``gpuprof calibrate`` (or by hand,
for a GPU not listed) overrides any of these; the datasheet entry it names fills the rest.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuprof.errors import SpecError
from gpuprof import files

DTYPES = ("fp64", "fp64_tc", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    peaks_tflops: dict[str, float]
    hbm_gbps: float
    sm_count: int
    memory_gb: float
    nvlink_gbps: float = 0.0  # GPU-to-GPU link, total both directions as vendors quote it (NVLink, Infinity Fabric)
    pcie_gbps: float = 0.0  # one direction, GB/s (PCIe Gen3 x16: 16, Gen4: 32, Gen5: 64)
    source: str = "datasheet"
    measured: tuple[str, ...] = field(default_factory=tuple)
    boost_mhz: float = 0.0
    interconnect: str = ""
    vendor: str = ""  # "nvidia" or "amd"
    arch: str = ""  # compute capability ("9.0") or gfx name ("gfx942")
    #: Aligned GEMMs measured on this GPU (``gpuprof calibrate --gemm-table``): (dtype, m, n, k, TFLOP/s).
    gemm_table: tuple[tuple[str, int, int, int, float], ...] = ()

    def peak(self, dtype: str) -> float:
        """TFLOP/s for a math dtype; a dtype the part lacks falls back to the CUDA-core FP32 rate."""
        return self.peaks_tflops.get(dtype) or self.peaks_tflops.get("fp32", 0.0)

    def has(self, dtype: str) -> bool:
        """Whether the part runs this math dtype at a rate of its own (tensor/matrix cores for
        tf32, bf16, fp16, fp8): V100, T4 and the RTX 2080 Ti have FP16 tensor cores and no BF16,
        TF32 or FP8."""
        return bool(self.peaks_tflops.get(dtype))

    @property
    def half_dtype(self) -> str | None:
        """The 16-bit dtype autocast should use here: ``bf16`` where the part has it (Ampere and
        newer, CDNA2 and newer), else ``fp16`` (Volta, Turing: FP16 tensor cores only), else None."""
        return "bf16" if self.has("bf16") else "fp16" if self.has("fp16") else None

    @property
    def fp8_tensor_cores(self) -> bool:
        """FP8 tensor cores on Hopper or newer (compute capability 9+) or an AMD part with FP8."""
        if not self.has("fp8"):
            return False
        if self.vendor == "amd" or self.arch.startswith("gfx"):
            return True
        try:
            return float(self.arch.split(".")[0]) >= 9
        except ValueError:
            return False

    @property
    def ridge(self) -> dict[str, float]:
        """FLOP per byte at which each dtype's compute roof meets the memory roof."""
        return {k: v * 1e12 / (self.hbm_gbps * 1e9) for k, v in self.peaks_tflops.items()}


_PCIE = {3: 16.0, 4: 32.0, 5: 64.0, 6: 128.0}


def _e(key: str, name: str, arch: str, sms: int, boost: float, mem: float, bw: float, link: str, link_gbps: float,
       pcie: int, source: str, **peaks: float) -> GpuSpec:
    vendor = "amd" if arch.startswith("gfx") else "nvidia"
    return GpuSpec(key, name, {k: float(v) for k, v in peaks.items() if v}, float(bw), sms, float(mem),
                   float(link_gbps), _PCIE[pcie], source, boost_mhz=float(boost), interconnect=link, vendor=vendor,
                   arch=arch)


_V100 = "NVIDIA Tesla V100 datasheet (July 2017); FP16 = tensor cores, no BF16/TF32/INT8 tensor math"
_V100_PCIE = "NVIDIA V100 PCIe datasheet (2018); FP16 = tensor cores, no BF16/TF32/INT8 tensor math"
_DGXS = ("NVIDIA DGX Station datasheet (4 V100 at SXM2 clocks, 500 TFLOPS tensor FP16 in all; NVLink rate per "
         "GPU not given); no BF16/TF32")
_A100 = "NVIDIA A100 datasheet (2021, r4)"
_A800 = "NVIDIA A800 datasheet (2022): A100 rates, NVLink 400 GB/s"
_H100 = "NVIDIA H100 datasheet (2023)"
_H800 = "NVIDIA H800 datasheet (2023): H100 rates, FP64 1 TFLOPS, NVLink 400 GB/s"
_H200 = "NVIDIA H200 datasheet (2024)"
_GH200 = "NVIDIA GH200 Grace Hopper Superchip datasheet (2024), GPU part"
_BLACKWELL = "NVIDIA HGX B200/B100 datasheet (2024), per GPU"
_B_FP32 = ("; FP32 is not on the datasheet: taken as 2x FP64, B200's ratio (75/37); SM count and boost clock "
           "unpublished (B200's 148 SMs)")
_GB200 = "NVIDIA GB200 NVL72 datasheet (2024), per GPU (superchip figures / 2)"
_ADA_WP = "NVIDIA Ada Lovelace architecture whitepaper v1.03 (FP32-accumulate tensor rates)"
_AMP_WP = "NVIDIA Ampere GA102 whitepaper v2.1 (FP32-accumulate tensor rates)"
_TURING_WP = "NVIDIA Turing architecture whitepaper (reference clocks; FP16 tensor with FP32 accumulate)"
_BW_WP = "NVIDIA RTX Blackwell GPU architecture whitepaper v1.0 (FP32-accumulate tensor rates)"
_FP64_GUIDE = "FP64 from the CUDA C++ Programming Guide throughput table ({} of FP32)"
_MI300X = "AMD Instinct MI300X data sheet (2023); TF32 = XF32"

# Every GPU a PyTorch user trains or serves on since Volta. Columns: key, name, arch, SMs/CUs,
# boost MHz, memory GB, bandwidth GB/s, interconnect, link GB/s, PCIe gen, source; then dense peaks.
BUILTIN: dict[str, GpuSpec] = {s.key: s for s in (
    # Volta (cc 7.0)
    _e("V100-SXM2-16GB", "NVIDIA V100 SXM2 16GB", "7.0", 80, 1530, 16, 900, "NVLink 2.0", 300, 3, _V100,
       fp64=7.8, fp32=15.7, fp16=125),
    _e("V100-SXM2-32GB", "NVIDIA V100 SXM2 32GB", "7.0", 80, 1530, 32, 900, "NVLink 2.0", 300, 3, _V100,
       fp64=7.8, fp32=15.7, fp16=125),
    _e("V100-PCIE-16GB", "NVIDIA V100 PCIe 16GB", "7.0", 80, 1380, 16, 900, "PCIe Gen3", 0, 3, _V100_PCIE,
       fp64=7, fp32=14, fp16=112),
    _e("V100-PCIE-32GB", "NVIDIA V100 PCIe 32GB", "7.0", 80, 1380, 32, 900, "PCIe Gen3", 0, 3, _V100_PCIE,
       fp64=7, fp32=14, fp16=112),
    _e("V100-DGXS-16GB", "NVIDIA V100 DGXS 16GB", "7.0", 80, 1530, 16, 900, "NVLink 2.0", 0, 3, _DGXS,
       fp64=7.8, fp32=15.7, fp16=125),
    _e("V100-DGXS-32GB", "NVIDIA V100 DGXS 32GB", "7.0", 80, 1530, 32, 900, "NVLink 2.0", 0, 3, _DGXS,
       fp64=7.8, fp32=15.7, fp16=125),
    # Turing (cc 7.5)
    _e("T4", "NVIDIA T4", "7.5", 40, 1590, 16, 320, "PCIe Gen3", 0, 3,
       "NVIDIA T4 datasheet (2019): FP16/FP32 mixed 65 TFLOPS, INT8 130 TOPS; no BF16/TF32; "
       + _FP64_GUIDE.format("1/32"), fp64=0.25, fp32=8.1, fp16=65, int8=130),
    _e("RTX-2080-Ti", "NVIDIA GeForce RTX 2080 Ti", "7.5", 68, 1545, 11, 616, "NVLink bridge", 100, 3,
       _TURING_WP + "; FP16 accumulate is 107.6; no BF16/TF32; " + _FP64_GUIDE.format("1/32"),
       fp64=0.42, fp32=13.4, fp16=53.8, int8=215.2),
    # Ampere (cc 8.0 / 8.6)
    _e("A100-SXM4-40GB", "NVIDIA A100 40GB SXM", "8.0", 108, 1410, 40, 1555, "NVLink 3.0", 600, 4, _A100,
       fp64=9.7, fp64_tc=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
    _e("A100-SXM4-80GB", "NVIDIA A100 80GB SXM", "8.0", 108, 1410, 80, 2039, "NVLink 3.0", 600, 4, _A100,
       fp64=9.7, fp64_tc=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
    _e("A100-PCIE-40GB", "NVIDIA A100 40GB PCIe", "8.0", 108, 1410, 40, 1555, "NVLink bridge", 600, 4, _A100,
       fp64=9.7, fp64_tc=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
    _e("A100-PCIE-80GB", "NVIDIA A100 80GB PCIe", "8.0", 108, 1410, 80, 1935, "NVLink bridge", 600, 4, _A100,
       fp64=9.7, fp64_tc=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
    _e("A800-SXM4-80GB", "NVIDIA A800 80GB SXM", "8.0", 108, 1410, 80, 2039, "NVLink 3.0", 400, 4, _A800,
       fp64=9.7, fp64_tc=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
    _e("A800-PCIE-80GB", "NVIDIA A800 80GB PCIe", "8.0", 108, 1410, 80, 1935, "NVLink bridge", 400, 4, _A800,
       fp64=9.7, fp64_tc=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
    _e("A800-PCIE-40GB", "NVIDIA A800 40GB PCIe", "8.0", 108, 1410, 40, 1555, "NVLink bridge", 400, 4, _A800,
       fp64=9.7, fp64_tc=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
    _e("A30", "NVIDIA A30", "8.0", 56, 1440, 24, 933, "NVLink bridge", 200, 4, "NVIDIA A30 datasheet (2021)",
       fp64=5.2, fp64_tc=10.3, fp32=10.3, tf32=82, bf16=165, fp16=165, int8=330),
    _e("A10", "NVIDIA A10", "8.6", 72, 1695, 24, 600, "PCIe Gen4", 0, 4,
       "NVIDIA A10 datasheet (2021); " + _FP64_GUIDE.format("1/64"),
       fp64=0.49, fp32=31.2, tf32=62.5, bf16=125, fp16=125, int8=250),
    _e("A10G", "NVIDIA A10G", "8.6", 80, 1710, 24, 600, "PCIe Gen4", 0, 4,
       "no NVIDIA datasheet: AWS EC2 G5 (A10G 24 GB, 600 GB/s) with the A10 datasheet's tensor rates; "
       "80 SMs as the device reports; " + _FP64_GUIDE.format("1/64"),
       fp64=0.49, fp32=31.2, tf32=62.5, bf16=125, fp16=125, int8=250),
    _e("A40", "NVIDIA A40", "8.6", 84, 1740, 48, 696, "NVLink bridge", 112.5, 4,
       "NVIDIA A40 datasheet (2021); " + _FP64_GUIDE.format("1/64"),
       fp64=0.58, fp32=37.4, tf32=74.8, bf16=149.7, fp16=149.7, int8=299.3),
    _e("RTX-A6000", "NVIDIA RTX A6000", "8.6", 84, 1800, 48, 768, "NVLink bridge", 112.5, 4,
       "NVIDIA RTX A6000 datasheet (2021): 309.7 TFLOPS tensor with sparsity; " + _FP64_GUIDE.format("1/64"),
       fp64=0.6, fp32=38.7, tf32=77.4, bf16=154.8, fp16=154.8, int8=309.7),
    _e("RTX-3090", "NVIDIA GeForce RTX 3090", "8.6", 82, 1695, 24, 936, "NVLink bridge", 112.5, 4,
       _AMP_WP + "; FP16 accumulate is 142; " + _FP64_GUIDE.format("1/64"),
       fp64=0.56, fp32=35.6, tf32=35.6, bf16=71, fp16=71, int8=284),
    # Ada (cc 8.9)
    _e("L4", "NVIDIA L4", "8.9", 58, 2040, 24, 300, "PCIe Gen4", 0, 4,
       "NVIDIA L4 datasheet (2023); " + _FP64_GUIDE.format("1/64"),
       fp64=0.47, fp32=30.3, tf32=60, bf16=121, fp16=121, fp8=242.5, int8=242.5),
    _e("L40", "NVIDIA L40", "8.9", 142, 2490, 48, 864, "PCIe Gen4", 0, 4,
       "NVIDIA L40 datasheet (2022); " + _FP64_GUIDE.format("1/64"),
       fp64=1.41, fp32=90.5, tf32=90.5, bf16=181.05, fp16=181.05, fp8=362, int8=362),
    _e("L40S", "NVIDIA L40S", "8.9", 142, 2520, 48, 864, "PCIe Gen4", 0, 4,
       "NVIDIA L40S datasheet (2023); " + _FP64_GUIDE.format("1/64"),
       fp64=1.43, fp32=91.6, tf32=183, bf16=362.05, fp16=362.05, fp8=733, int8=733),
    _e("RTX-6000-Ada", "NVIDIA RTX 6000 Ada Generation", "8.9", 142, 2505, 48, 960, "PCIe Gen4", 0, 4,
       "NVIDIA RTX 6000 Ada datasheet (2022): 1,457 TFLOPS FP8 with sparsity; " + _ADA_WP + "; "
       + _FP64_GUIDE.format("1/64"), fp64=1.42, fp32=91.1, tf32=182.1, bf16=364.2, fp16=364.2, fp8=728.5,
       int8=728.5),
    _e("RTX-4090", "NVIDIA GeForce RTX 4090", "8.9", 128, 2520, 24, 1008, "PCIe Gen4", 0, 4,
       _ADA_WP + "; FP16 accumulate is 330.3; " + _FP64_GUIDE.format("1/64"),
       fp64=1.29, fp32=82.6, tf32=82.6, bf16=165.2, fp16=165.2, fp8=330.3, int8=660.6),
    # Hopper (cc 9.0)
    _e("H100-SXM", "NVIDIA H100 SXM", "9.0", 132, 1980, 80, 3350, "NVLink 4.0", 900, 5, _H100,
       fp64=34, fp64_tc=67, fp32=67, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979, int8=1979),
    _e("H100-PCIE", "NVIDIA H100 PCIe", "9.0", 114, 1755, 80, 2000, "NVLink bridge", 600, 5, _H100,
       fp64=26, fp64_tc=51, fp32=51, tf32=378, bf16=756, fp16=756, fp8=1513, int8=1513),
    _e("H100-NVL", "NVIDIA H100 NVL", "9.0", 132, 1785, 94, 3900, "NVLink bridge", 600, 5, _H100,
       fp64=30, fp64_tc=60, fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670, int8=1670),
    _e("H800-SXM", "NVIDIA H800 SXM", "9.0", 132, 1980, 80, 3350, "NVLink 4.0", 400, 5, _H800,
       fp64=1, fp64_tc=1, fp32=67, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979, int8=1979),
    _e("H800-PCIE", "NVIDIA H800 PCIe", "9.0", 114, 1755, 80, 2000, "NVLink bridge", 400, 5, _H800,
       fp64=0.8, fp64_tc=0.8, fp32=51, tf32=378, bf16=756, fp16=756, fp8=1513, int8=1513),
    _e("H20", "NVIDIA H20", "9.0", 78, 0, 96, 4000, "NVLink 4.0", 900, 5,
       "NVIDIA H20 product brief (2024, China only; as published by partners): FP8/INT8 296, BF16 148, TF32 74, "
       "FP32 44, FP64 1; 78 SMs as devices report; boost clock unpublished", fp64=1, fp64_tc=1, fp32=44, tf32=74, bf16=148, fp16=148, fp8=296, int8=296),
    _e("H200-SXM", "NVIDIA H200 SXM", "9.0", 132, 1980, 141, 4800, "NVLink 4.0", 900, 5, _H200,
       fp64=34, fp64_tc=67, fp32=67, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979, int8=1979),
    _e("H200-NVL", "NVIDIA H200 NVL", "9.0", 132, 1785, 141, 4800, "NVLink bridge", 900, 5, _H200,
       fp64=30, fp64_tc=60, fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670, int8=1670),
    _e("GH200-96GB", "NVIDIA GH200 96GB HBM3", "9.0", 132, 1980, 96, 4000, "NVLink 4.0 + NVLink-C2C 900", 900, 5,
       _GH200, fp64=34, fp64_tc=67, fp32=67, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979, int8=1979),
    _e("GH200-144GB", "NVIDIA GH200 144GB HBM3e", "9.0", 132, 1980, 144, 4900, "NVLink 4.0 + NVLink-C2C 900", 900,
       5, _GH200, fp64=34, fp64_tc=67, fp32=67, tf32=494.5, bf16=989.5, fp16=989.5, fp8=1979, int8=1979),
    # Blackwell (cc 10.0 / 12.0)
    _e("B100", "NVIDIA B100", "10.0", 148, 0, 192, 8000, "NVLink 5.0", 1800, 5, _BLACKWELL + _B_FP32,
       fp64=30, fp64_tc=30, fp32=60, tf32=875, bf16=1750, fp16=1750, fp8=3500, int8=3500),
    _e("B200", "NVIDIA B200", "10.0", 148, 1965, 180, 7700, "NVLink 5.0", 1800, 5, _BLACKWELL,
       fp64=37, fp64_tc=37, fp32=75, tf32=1100, bf16=2250, fp16=2250, fp8=4500, int8=4500),
    _e("GB200", "NVIDIA GB200", "10.0", 148, 0, 186, 8000, "NVLink 5.0 + NVLink-C2C 900", 1800, 6, _GB200 + _B_FP32,
       fp64=45, fp64_tc=45, fp32=90, tf32=1250, bf16=2500, fp16=2500, fp8=5000, int8=5000),
    _e("RTX-5090", "NVIDIA GeForce RTX 5090", "12.0", 170, 2407, 32, 1792, "PCIe Gen5", 0, 5,
       _BW_WP + "; FP16 accumulate is 419; " + _FP64_GUIDE.format("1/64"),
       fp64=1.64, fp32=104.8, tf32=104.8, bf16=209.5, fp16=209.5, fp8=419, int8=838),
    # AMD Instinct: CDNA 1-4. Peaks are per package; a MI250/MI250X shows each of its two GCDs as a device.
    _e("MI100", "AMD Instinct MI100", "gfx908", 120, 1502, 32, 1228.8, "Infinity Fabric (3 links)", 276, 4,
       "AMD Instinct MI100 data sheet (2020): FP32 matrix 46.1, no TF32/FP8",
       fp64=11.5, fp32=23.1, bf16=92.3, fp16=184.6, int8=184.6),
    _e("MI210", "AMD Instinct MI210", "gfx90a", 104, 1700, 64, 1638.4, "Infinity Fabric bridge (3 links)", 300, 4,
       "AMD Instinct MI210 data sheet (2022): FP32 matrix 45.3, no TF32/FP8",
       fp64=22.6, fp64_tc=45.3, fp32=22.6, bf16=181, fp16=181, int8=181),
    _e("MI250", "AMD Instinct MI250", "gfx90a", 208, 1700, 128, 3276.8, "Infinity Fabric (6 links)", 600, 4,
       "AMD Instinct MI250 data sheet (2021), package of 2 GCDs: FP32 matrix 90.5, no TF32/FP8",
       fp64=45.3, fp64_tc=90.5, fp32=45.3, bf16=362.1, fp16=362.1, int8=362.1),
    _e("MI250X", "AMD Instinct MI250X", "gfx90a", 220, 1700, 128, 3276.8, "Infinity Fabric (8 links)", 800, 4,
       "AMD Instinct MI250X data sheet (2021), package of 2 GCDs: FP32 matrix 95.7, no TF32/FP8",
       fp64=47.9, fp64_tc=95.7, fp32=47.9, bf16=383, fp16=383, int8=383),
    _e("MI300A", "AMD Instinct MI300A", "gfx942", 228, 2100, 128, 5300, "Infinity Fabric", 768, 5,
       "AMD Instinct MI300A data sheet (2023), 128 GB unified with the CPU; TF32 = XF32",
       fp64=61.3, fp64_tc=122.6, fp32=122.6, tf32=490.3, bf16=980.6, fp16=980.6, fp8=1961.2, int8=1961.2),
    _e("MI300X", "AMD Instinct MI300X", "gfx942", 304, 2100, 192, 5300, "Infinity Fabric (7 links)", 896, 5,
       _MI300X, fp64=81.7, fp64_tc=163.4, fp32=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4, fp8=2614.9,
       int8=2614.9),
    _e("MI325X", "AMD Instinct MI325X", "gfx942", 304, 2100, 256, 6000, "Infinity Fabric (7 links)", 896, 5,
       "AMD Instinct MI325X data sheet (2024); TF32 = XF32",
       fp64=81.7, fp64_tc=163.4, fp32=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4, fp8=2614.9, int8=2614.9),
    _e("MI355X", "AMD Instinct MI355X", "gfx950", 256, 2400, 288, 8000, "Infinity Fabric (7 links)", 1075, 5,
       "AMD Instinct MI355X data sheet (2025): no TF32/XF32 (CDNA 4)",
       fp64=78.6, fp64_tc=78.6, fp32=157.3, bf16=2516.6, fp16=2516.6, fp8=5033.2, int8=5033.2),
)}

# Device names as torch, NVML and ROCm spell them (upper-cased, "_" read as "-"), most specific
# first. Several candidates: the one whose SM/CU count and memory fit the device (see _pick).
_NAME_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (r"GH200(?![0-9]).*(?:144|HBM3E)", ("GH200-144GB",)),
    (r"GH200(?![0-9])", ("GH200-96GB", "GH200-144GB")),
    (r"GB200(?![0-9])", ("GB200",)),
    (r"B200(?![0-9])", ("B200",)),
    (r"B100(?![0-9])", ("B100",)),
    (r"H200(?![0-9]).*NVL", ("H200-NVL",)),
    (r"H200(?![0-9])", ("H200-SXM", "H200-NVL")),
    (r"H100(?![0-9]).*NVL", ("H100-NVL",)),
    (r"H100(?![0-9]).*PCIE", ("H100-PCIE",)),
    (r"H100(?![0-9])", ("H100-SXM", "H100-PCIE")),
    (r"H800(?![0-9]).*PCIE", ("H800-PCIE",)),
    (r"H800(?![0-9])", ("H800-SXM", "H800-PCIE")),
    (r"H20(?![0-9])", ("H20",)),
    (r"A100(?![0-9]).*PCIE.*80|A100(?![0-9]).*80.*PCIE", ("A100-PCIE-80GB",)),
    (r"A100(?![0-9]).*PCIE.*40|A100(?![0-9]).*40.*PCIE", ("A100-PCIE-40GB",)),
    (r"A100(?![0-9]).*PCIE", ("A100-PCIE-40GB", "A100-PCIE-80GB")),
    (r"A100(?![0-9]).*80", ("A100-SXM4-80GB",)),
    (r"A100(?![0-9]).*40", ("A100-SXM4-40GB",)),
    (r"A100(?![0-9])", ("A100-SXM4-40GB", "A100-SXM4-80GB")),
    (r"A800(?![0-9]).*40", ("A800-PCIE-40GB",)),
    (r"A800(?![0-9]).*PCIE", ("A800-PCIE-80GB", "A800-PCIE-40GB")),
    (r"A800(?![0-9])", ("A800-SXM4-80GB", "A800-PCIE-80GB")),
    (r"A10G", ("A10G",)),
    (r"(?<![0-9A-Z])A10(?![0-9A-Z])", ("A10",)),
    (r"(?<![0-9A-Z])A30(?![0-9A-Z])", ("A30",)),
    (r"(?<![0-9A-Z])A40(?![0-9A-Z])", ("A40",)),
    (r"RTX A6000$", ("RTX-A6000",)),
    (r"L40S", ("L40S",)),
    (r"(?<![0-9A-Z])L40(?![0-9A-Z])", ("L40",)),
    (r"(?<![0-9A-Z])L4(?![0-9A-Z])", ("L4",)),
    (r"RTX 6000 ADA", ("RTX-6000-Ada",)),
    (r"RTX 2080 TI$", ("RTX-2080-Ti",)),
    (r"RTX 3090$", ("RTX-3090",)),
    (r"RTX 4090$", ("RTX-4090",)),
    (r"RTX 5090$", ("RTX-5090",)),
    (r"V100-?(SXM2|PCIE|DGXS)-?(16|32)GB", ()),  # the key is the name itself (handled in _by_name)
    (r"V100(?!S).*DGXS", ("V100-DGXS-32GB", "V100-DGXS-16GB")),
    (r"V100(?!S).*PCIE", ("V100-PCIE-16GB", "V100-PCIE-32GB")),
    (r"V100(?!S)", ("V100-SXM2-16GB", "V100-SXM2-32GB")),
    (r"(?<![0-9A-Z])T4(?![0-9A-Z])", ("T4",)),
    (r"MI355X", ("MI355X",)),
    (r"MI325X", ("MI325X",)),
    (r"MI300A", ("MI300A",)),
    (r"MI300X", ("MI300X",)),
    (r"MI250X/MI250", ("MI250X", "MI250")),  # older ROCm names both parts alike: told apart by CUs
    (r"MI250X", ("MI250X",)),
    (r"MI250(?![0-9X])", ("MI250",)),
    (r"MI210(?![0-9])", ("MI210",)),
    (r"MI100(?![0-9])", ("MI100",)),
)

_GFX_ARCH = {"gfx908": "9.0", "gfx90a": "9.0", "gfx942": "9.4", "gfx950": "9.5"}  # HIP's major.minor for each


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _fits(spec: GpuSpec, sms: int | None, mem_bytes: int | None) -> tuple[int, float]:
    """How well a part fits a device (lower is better): SM/CU count equal (0), a whole share of
    the part (1: a GCD or partition), else 2; then how far the memory is from the part's."""
    if sms is None:
        fit = 1
    elif sms == spec.sm_count:
        fit = 0
    elif sms < spec.sm_count and spec.sm_count % sms == 0:
        fit = 1
    else:
        fit = 2
    gib = mem_bytes / 2**30 if mem_bytes else None
    return fit, abs(math.log(gib / spec.memory_gb)) if gib and spec.memory_gb else 0.0


def _pick(keys: tuple[str, ...], props: dict[str, Any]) -> GpuSpec | None:
    specs = [BUILTIN[k] for k in keys]
    if not specs:
        return None
    sms, mem = _int(props.get("numSms")), _int(props.get("totalGlobalMem"))
    return min(specs, key=lambda s: _fits(s, sms, mem))  # ties keep table order: the mainstream part first


def _by_name(name: str, props: dict[str, Any]) -> GpuSpec | None:
    norm = " ".join(name.upper().replace("_", "-").split())
    for key, spec in BUILTIN.items():
        if norm in (key.upper(), spec.name.upper()):
            return spec
    for pattern, keys in _NAME_RULES:
        m = re.search(pattern, norm)
        if m:
            if not keys:  # V100-SXM2-32GB and the like: the key is in the name
                return BUILTIN[f"V100-{m.group(1)}-{m.group(2)}GB"]
            return _pick(keys, props)
    return None


def _by_arch(props: dict[str, Any]) -> GpuSpec | None:
    """The part whose architecture, SM/CU count and memory match a device that names none: the gfx
    name (``gcnArchName``) or compute capability, with warp size 64 telling AMD from NVIDIA
    (both report 9.0 for different parts). None unless the SM/CU count fits a part exactly or as
    a whole share of one."""
    gfx = props.get("gcnArchName") if isinstance(props.get("gcnArchName"), str) else ""
    gfx = str(gfx).split(":")[0].lower()
    major, minor = props.get("computeMajor"), props.get("computeMinor")
    if gfx:
        vendor, arch = "amd", gfx
    elif _int(major) is not None and isinstance(minor, int):
        vendor = "amd" if props.get("warpSize") == 64 else "nvidia"
        arch = f"{major}.{minor}"
    else:
        return None
    if vendor == "amd":
        cands = tuple(k for k, s in BUILTIN.items() if s.vendor == "amd" and (s.arch == arch or _GFX_ARCH[s.arch] == arch))
    else:
        cands = tuple(k for k, s in BUILTIN.items() if s.vendor == "nvidia" and s.arch == arch)
    best = _pick(cands, props)
    if best is None or _fits(best, _int(props.get("numSms")), None)[0] == 2 or _int(props.get("numSms")) is None:
        return None
    return replace(best, source=f"{best.source}; matched by architecture ({arch}, {props.get('numSms')} SMs/CUs, "
                                f"{(_int(props.get('totalGlobalMem')) or 0) / 2**30:.0f} GiB): the trace names no GPU")


def _for_device(spec: GpuSpec, props: dict[str, Any]) -> GpuSpec:
    """``spec`` for a device with fewer SMs/CUs than the part (a GCD, a partition, a MIG slice):
    compute peaks scale with its share of SMs, bandwidth with its share of memory."""
    sms, mem = _int(props.get("numSms")), _int(props.get("totalGlobalMem"))
    if sms is None or sms >= spec.sm_count:
        return spec
    share = sms / spec.sm_count
    mem_share = min(1.0, mem / 2**30 / spec.memory_gb) if mem and spec.memory_gb else share
    if abs(mem_share - share) < 0.1 * share:  # a GCD: half the CUs and (a little under) half the memory
        mem_share = share
    elif mem_share > 0.95:  # all the memory (an MI300X CPX partition in NPS1 mode): its full bandwidth
        mem_share = 1.0
    return replace(spec, peaks_tflops={k: v * share for k, v in spec.peaks_tflops.items()},
                   hbm_gbps=spec.hbm_gbps * mem_share, sm_count=sms, memory_gb=spec.memory_gb * mem_share,
                   source=f"{spec.source}; scaled to this device's {sms} of {spec.sm_count} SMs/CUs")


def find_builtin(name: str, total_mem_bytes: int | None = None, props: dict[str, Any] | None = None) -> GpuSpec | None:
    """The datasheet spec for a device name as torch, NVML or ROCm spell it, or for a key above."""
    p = dict(props or {})
    if total_mem_bytes and "totalGlobalMem" not in p:
        p["totalGlobalMem"] = total_mem_bytes
    return _by_name(name, p) if name.strip() else None


def _number(raw: dict[str, Any], name: str, p: Path, default: float, positive: bool = False) -> float:
    v = raw.get(name, default)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 if positive else v >= 0)
    if not ok:
        raise SpecError(f"'{name}' must be a {'positive' if positive else 'non-negative'} finite number, got {v!r}",
                        str(p))
    return float(v)


def load_spec_file(path: str | Path) -> GpuSpec:
    """Read a spec file (``gpuprof calibrate`` output, or written by hand).

    Fields: ``name``; ``peaks_tflops`` {dtype: TFLOP/s}; ``hbm_gbps``; optional ``base`` (a
    built-in key to inherit unspecified values from), ``sm_count``, ``memory_gb``,
    ``nvlink_gbps``, ``measured`` (true for measured ceilings), ``gemm_table`` (rows of
    ``calibrate --gemm-table``: dtype, m, n, k, aligned, tflops; the aligned rows become the GEMM
    reference, :mod:`gpuprof.gemmref`). Any field of the wrong type is one error naming the file
    and the field.
    """
    p = Path(path)
    try:
        raw = json.loads(files.read(p, error=SpecError, max_bytes=files.SMALL_FILE_BYTES).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise SpecError(f"not a JSON spec file ({e.__class__.__name__}: {e})", str(p)) from None
    if not isinstance(raw, dict):
        raise SpecError("a spec file is a JSON object with a string 'name'", str(p))
    for f in ("name", "base"):
        if f in raw and not isinstance(raw[f], str):
            raise SpecError(f"'{f}' must be a string, got {raw[f]!r}", str(p))
    if "measured" in raw and not isinstance(raw["measured"], bool):
        raise SpecError(f"'measured' must be true or false, got {raw['measured']!r}", str(p))
    peaks = raw.get("peaks_tflops", {})
    if not isinstance(peaks, dict):
        raise SpecError("'peaks_tflops' must be an object of dtype: TFLOP/s", str(p))
    for k, v in peaks.items():
        if k not in DTYPES:
            raise SpecError(f"unknown dtype {k!r} in peaks_tflops (known: {', '.join(DTYPES)})", str(p))
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise SpecError(f"peaks_tflops.{k} must be a positive finite number, got {v!r}", str(p))
    base = find_builtin(str(raw.get("base") or raw.get("name", "")))
    if raw.get("base") and base is None:
        raise SpecError(f"unknown 'base' GPU {raw['base']!r}; known: {', '.join(BUILTIN)}", str(p))
    if "hbm_gbps" not in raw and base is None:
        raise SpecError("'hbm_gbps' must be a positive number (or name a known 'base' GPU)", str(p))
    hbm = _number(raw, "hbm_gbps", p, base.hbm_gbps if base else 0.0, positive=True)
    if base is None and not peaks:
        raise SpecError("no 'peaks_tflops' and no known 'base' GPU to take them from", str(p))
    sms = raw.get("sm_count", base.sm_count if base else 0)
    if not isinstance(sms, int) or isinstance(sms, bool) or sms < 0:
        raise SpecError(f"'sm_count' must be a non-negative integer, got {sms!r}", str(p))
    merged = dict(base.peaks_tflops) if base else {}
    merged.update({k: float(v) for k, v in peaks.items()})
    measured = tuple(sorted(peaks)) + (("hbm_gbps",) if "hbm_gbps" in raw else ()) if raw.get("measured") else ()
    return GpuSpec(
        key=base.key if base else "custom",
        name=raw.get("name") or (base.name if base else "custom GPU"),
        peaks_tflops=merged,
        hbm_gbps=hbm,
        sm_count=sms,
        memory_gb=_number(raw, "memory_gb", p, base.memory_gb if base else 0.0),
        nvlink_gbps=_number(raw, "nvlink_gbps", p, base.nvlink_gbps if base else 0.0),
        pcie_gbps=base.pcie_gbps if base else 0.0,
        source=f"spec file {p}",
        measured=measured,
        boost_mhz=base.boost_mhz if base else 0.0,
        interconnect=base.interconnect if base else "",
        vendor=base.vendor if base else "",
        arch=base.arch if base else "",
        gemm_table=_gemm_rows(raw.get("gemm_table", []), p),
    )


def _gemm_rows(rows: Any, p: Path) -> tuple[tuple[str, int, int, int, float], ...]:
    """The aligned rows of a spec file's ``gemm_table``; a malformed row is one error naming it."""
    if not isinstance(rows, list):
        raise SpecError("'gemm_table' must be a list of rows (gpuprof calibrate --gemm-table)", str(p))
    out = []
    for i, r in enumerate(rows):
        ok = isinstance(r, dict) and r.get("dtype") in DTYPES and isinstance(r.get("aligned", True), bool) and all(
            isinstance(r.get(d), int) and not isinstance(r.get(d), bool) and r[d] > 0 for d in ("m", "n", "k"))
        t = r.get("tflops") if isinstance(r, dict) else None
        if not ok or not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t <= 0:
            raise SpecError(f"gemm_table[{i}] needs dtype, positive integer m, n, k and positive tflops, got {r!r}",
                            str(p))
        if r.get("aligned", True):
            out.append((str(r["dtype"]), int(r["m"]), int(r["n"]), int(r["k"]), float(t)))
    return tuple(out)


def _compact(s: str) -> str:
    return re.sub(r"[\s_\-]", "", s.upper())


def by_key(gpu: str) -> GpuSpec:
    """The entry ``--gpu`` names: its key or its full name exactly, case, spaces, '-' and '_'
    aside (``h100-sxm``, ``H100 SXM``, ``NVIDIA H100 SXM``). Anything else is a
    :class:`SpecError` (exit 4) listing the candidates, never a guess: ``A100`` is four parts and
    ``H100-PCI`` is not ``H100-PCIE``, and MFU and every roofline % rest on the part's peaks
    (756 against 989 TFLOP/s BF16 between H100 PCIe and SXM)."""
    want = _compact(gpu)
    for key, spec in BUILTIN.items():
        if want in (_compact(key), _compact(spec.name)):
            return spec
    keys = list(BUILTIN)
    # the keys holding what was typed (those starting with it first), the part a trace naming
    # this device would get, and only when neither finds one, the keys spelled most alike
    near = sorted((k for k in keys if want and want in _compact(k)), key=lambda k: not _compact(k).startswith(want))
    guess = _by_name(gpu, {}) if gpu.strip() else None
    if guess is not None:
        near.append(guess.key)
    if not near:
        by_compact = {_compact(k): k for k in keys}
        near = [by_compact[c] for c in difflib.get_close_matches(want, list(by_compact), n=4, cutoff=0.7)]
    near = list(dict.fromkeys(near))
    if not near:
        raise SpecError(f"unknown GPU {gpu!r}; known: {', '.join(keys)}; or pass --gpu-spec FILE")
    one = len(near) == 1
    raise SpecError(f"{'inexact' if one else 'ambiguous'} GPU {gpu!r}: {'did you mean' if one else 'it could be'} "
                    f"{', '.join(near)}? Pass {'it' if one else 'one'} exactly as written (--gpu "
                    f"{near[0]}; every key: {', '.join(keys)}), or --gpu-spec FILE")


def resolve(device_props: list[dict[str, Any]], gpu: str | None = None, spec_file: str | None = None) -> GpuSpec | None:
    """The spec to analyse against: a spec file, else ``--gpu NAME``, else the trace's device
    (by name, else by architecture; scaled to a partial device, see :func:`_for_device`).

    Returns None when the trace names no GPU gpuprof knows and nothing was given; the roofline
    then reports every kernel as ``unknown`` rather than guess.
    """
    if spec_file:
        return load_spec_file(spec_file)
    if gpu:
        named = by_key(gpu)
        return replace(named, source=f"{named.source} (--gpu {gpu})")
    for props in device_props:
        name = props.get("name")
        found = find_builtin(name, props=props) if isinstance(name, str) else None
        if found is None and not (isinstance(name, str) and name.strip()):
            found = _by_arch(props)  # no name: vLLM on ROCm writes ""
        if found is not None:
            return _for_device(found, props)
    return None
