"""Name tables: which runtime/driver calls launch, synchronise, allocate or drive CUDA/HIP graphs,
and which kernel names are communication. One place for CUDA, the CUDA driver and ROCm/HIP, used by
the loader (``trace.runtime["kind"]``, ``kernels["in_graph"]``, ``kernels["is_comm"]``) and
importable by analyzers.

Kineto writes a call under its CUPTI/roctracer name; some carry a version or per-thread-stream
suffix (``cuMemcpyDtoH_v2``, ``cudaStreamGetCaptureInfo_v2``, ``cudaLaunchKernel_ptsz``):
:func:`base_call` strips it before a name is looked up, so each table lists base names only.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

#: Calls that put one kernel on a stream.
LAUNCH_CALLS: frozenset[str] = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
    "cudaLaunchCooperativeKernelMultiDevice", "cudaLaunchDevice",
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernelMultiDevice",
    "hipLaunchKernel", "hipLaunchKernelExC", "hipExtLaunchKernel", "hipModuleLaunchKernel",
    "hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel", "hipLaunchCooperativeKernel",
    "hipLaunchCooperativeKernelMultiDevice", "hipExtLaunchMultiKernelMultiDevice",
    "hipModuleLaunchCooperativeKernel", "hipModuleLaunchCooperativeKernelMultiDevice",
})

#: Calls that replay an instantiated graph: every kernel of the graph carries this call's correlation.
GRAPH_LAUNCH_CALLS: frozenset[str] = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})

#: Calls made only while a graph is being captured or built: a trace holding them records capture
#: (warm-up), not a steady state. Queries that run in any trace (``cudaStreamIsCapturing``,
#: ``cudaStreamGetCaptureInfo``) are deliberately absent.
GRAPH_CAPTURE_CALLS: frozenset[str] = frozenset({
    "cudaStreamBeginCapture", "cudaStreamBeginCaptureToGraph", "cudaStreamEndCapture",
    "cudaGraphInstantiate", "cudaGraphInstantiateWithFlags", "cudaGraphInstantiateWithParams",
    "cuStreamBeginCapture", "cuStreamBeginCaptureToGraph", "cuStreamEndCapture",
    "cuGraphInstantiate", "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithParams",
    "hipStreamBeginCapture", "hipStreamBeginCaptureToGraph", "hipStreamEndCapture",
    "hipGraphInstantiate", "hipGraphInstantiateWithFlags", "hipGraphInstantiateWithParams",
})

#: Calls that block the host until the GPU (a stream, an event, the device) has drained, including
#: the synchronous copies (``hipMemcpyWithStream`` is what PyTorch on ROCm issues for a blocking
#: ``.to()``/``.cpu()``).
SYNC_CALLS: frozenset[str] = frozenset({
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
    "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyPeer", "cudaMemcpyToSymbol", "cudaMemcpyFromSymbol",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
    "cuMemcpy", "cuMemcpyDtoH", "cuMemcpyHtoD", "cuMemcpyDtoD", "cuMemcpyPeer", "cuMemcpy2D", "cuMemcpy3D",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipCtxSynchronize",
    "hipMemcpy", "hipMemcpyWithStream", "hipMemcpyDtoH", "hipMemcpyHtoD", "hipMemcpyDtoD", "hipMemcpy2D",
    "hipMemcpy3D", "hipMemcpyPeer", "hipMemcpyToSymbol", "hipMemcpyFromSymbol", "hipMemcpyHtoA", "hipMemcpyAtoH",
})

#: Device and pinned-host allocation calls (the caching allocator makes them rare inside steps).
MALLOC_CALLS: frozenset[str] = frozenset({
    "cudaMalloc", "cudaMallocHost", "cudaHostAlloc", "cudaMallocManaged", "cudaMallocAsync",
    "cudaMallocFromPoolAsync", "cudaMallocPitch", "cudaMalloc3D",
    "cuMemAlloc", "cuMemAllocHost", "cuMemAllocManaged", "cuMemAllocAsync", "cuMemAllocPitch", "cuMemCreate",
    "hipMalloc", "hipHostMalloc", "hipMallocHost", "hipHostAlloc", "hipMallocManaged", "hipMallocAsync",
    "hipMallocFromPoolAsync", "hipExtMallocWithFlags", "hipMallocPitch", "hipMalloc3D",
})

#: The matching release calls.
FREE_CALLS: frozenset[str] = frozenset({
    "cudaFree", "cudaFreeHost", "cudaFreeAsync", "cuMemFree", "cuMemFreeHost", "cuMemFreeAsync", "cuMemRelease",
    "hipFree", "hipHostFree", "hipFreeHost", "hipFreeAsync",
})


#: What allocator churn counts (``analyzers.allocator``, the idle gaps' ``alloc`` cause, its fix in
#: the replay): the calls that allocate or free device or pinned memory *synchronously*, as named
#: in traces. With PyTorch's caching allocator they happen only while its pool grows; in every step
#: they mean the cache is off (``PYTORCH_NO_CUDA_MEMORY_CACHING``), emptied (``empty_cache()``) or
#: fragmented; ``cudaFree``/``hipFree`` also synchronise the device. The stream-ordered
#: ``cudaMallocAsync``/``cudaFreeAsync`` do neither and are not listed (unlike MALLOC_CALLS and
#: FREE_CALLS, which classify every call's kind); virtual-memory mapping (``cuMemMap``) is.
ALLOCATOR_CALLS: tuple[str, ...] = (
    "cudaMalloc", "cudaFree", "cuMemAlloc_v2", "cuMemFree_v2", "cudaMallocHost", "cudaFreeHost", "cudaHostAlloc",
    "cudaMallocManaged", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "hipMalloc", "hipFree",
    "hipHostMalloc", "hipHostFree", "hipFreeHost", "hipExtMallocWithFlags", "hipMallocManaged")

#: How the replay's dependency graph (:mod:`gpuprof.replay.graph`) tells a call that may wait for
#: the GPU: a synchronising call (``REPLAY_SYNC_CALLS``, exact names) returns once the work it waits
#: for is done; a copy call (``REPLAY_COPY_CALLS``) may return only once its copy is done (pageable
#: memory, device to host). Narrower than SYNC_CALLS, which classifies every call for the analyzers.
REPLAY_SYNC_CALLS: frozenset[str] = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2", "cuMemcpyDtoH",
    "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpy",
})
REPLAY_COPY_CALLS: frozenset[str] = frozenset({
    "cudaMemcpyAsync", "cudaMemcpy", "cudaMemcpy2DAsync", "hipMemcpyAsync", "hipMemcpy", "cuMemcpyAsync",
    "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2"})


def _spellings(base: frozenset[str]) -> frozenset[str]:
    """Base names plus the suffixed spellings traces show (driver ``_v2``, runtime per-thread-stream
    ``_ptsz``/``_ptds``), so that ``names.isin(TABLE)`` works without :func:`base_call`."""
    driver = {n + "_v2" for n in base if n.startswith("cu") and not n.startswith("cuda")}
    runtime = {n + s for n in base if n.startswith("cuda") for s in ("_ptsz", "_ptds")}
    return frozenset(base | driver | runtime)


LAUNCH_CALLS, GRAPH_LAUNCH_CALLS, GRAPH_CAPTURE_CALLS = map(_spellings, (LAUNCH_CALLS, GRAPH_LAUNCH_CALLS,
                                                                         GRAPH_CAPTURE_CALLS))
SYNC_CALLS, MALLOC_CALLS, FREE_CALLS = map(_spellings, (SYNC_CALLS, MALLOC_CALLS, FREE_CALLS))

#: The value of ``runtime["kind"]`` for each table (every other call is "other").
CALL_KINDS: tuple[tuple[str, frozenset[str]], ...] = (
    ("launch", LAUNCH_CALLS), ("graph_launch", GRAPH_LAUNCH_CALLS), ("graph_capture", GRAPH_CAPTURE_CALLS),
    ("sync", SYNC_CALLS), ("malloc", MALLOC_CALLS), ("free", FREE_CALLS),
)

_SUFFIX = re.compile(r"(?:_v\d+)?(?:_ptsz|_ptds|_spt)?$")


def base_call(name: str) -> str:
    """``name`` without a CUPTI version or per-thread-stream suffix (``cuMemcpyDtoH_v2`` → ``cuMemcpyDtoH``)."""
    return _SUFFIX.sub("", name) or name


def call_kind(name: str) -> str:
    """``launch``, ``graph_launch``, ``graph_capture``, ``sync``, ``malloc``, ``free`` or ``other``."""
    b = base_call(name)
    for kind, table in CALL_KINDS:
        if b in table or name in table:
            return kind
    return "other"


#: Communication kernels, by library: a kernel whose name matches any pattern is communication,
#: whatever stream it runs on. Patterns see the name in lower case (a case-insensitive search is
#: several times slower on long C++ kernel names) except those flagged ``True``, which see it as
#: written. Collective words are anchored so that a word ending in "all" (``small_reduce``) is not
#: a collective; CamelCase spellings (``oneShotAllReduce``) are matched as written.
COMM_PATTERNS: tuple[tuple[str, re.Pattern[str], bool], ...] = (
    ("nccl", re.compile(r"nccl"), False),  # NCCL and RCCL both name kernels ncclKernel_/ncclDevKernel_
    ("rccl", re.compile(r"rccl"), False),
    ("deepep", re.compile(r"deep_?ep"), False),
    ("nvshmem", re.compile(r"nvshmem"), False),
    ("mscclpp", re.compile(r"mscclpp"), False),
    ("custom_all_reduce", re.compile(r"cross_device_reduce|quickreduce"), False),  # vLLM/SGLang custom AR
    ("all_to_all", re.compile(r"(?<![a-z0-9])(?:a2a|all_?to_?all)(?![a-z0-9])|pplx"), False),
    ("collective", re.compile(r"(?<![a-z])(?:all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|send_?recv)"),
     False),
    ("collective", re.compile(r"AllReduce|AllGather|ReduceScatter|AllToAll|SendRecv"), True),
)


def _comm(name: str, lower: str) -> str | None:
    for label, pattern, as_written in COMM_PATTERNS:
        if pattern.search(name if as_written else lower):
            return label
    return None


#: Distinct names remembered by each per-name classifier below: a job's ranks share their kernel
#: names, so each name's patterns run once per process, not once per rank. Real programs have a
#: few hundred to a few thousand kernel names; the bound keeps what a hostile trace can leave held
#: to 4,096 names of at most ``MAX_NAME`` (8 KB) each per classifier.
NAME_MEMO = 1 << 12


@functools.lru_cache(maxsize=NAME_MEMO)
def comm_library(name: str) -> str | None:
    """The :data:`COMM_PATTERNS` label a kernel name matches first, or None (not communication)."""
    return _comm(name, name.lower())


def per_category(names: pd.Series, fn: Callable[[str], Any], dtype: Any = object) -> np.ndarray:
    """``fn`` of each distinct value of a name column, evaluated once per distinct name (names
    repeat millions of times in big traces) and broadcast to the rows."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        cats, codes = pd.Index(names.cat.categories), names.cat.codes.to_numpy()
    else:
        cats = pd.Index(names.unique())
        codes = cats.get_indexer(pd.Index(names))
    per = np.array([fn(str(n)) for n in cats], dtype=dtype)
    out: np.ndarray = per[codes] if len(cats) else np.array([], dtype=dtype)
    return out


def text(col: pd.Series) -> pd.Series:
    """``col.astype(str)``, a categorical column's categories converted once and its rows taken
    from them (160k op names: ~2 ms instead of ~10 ms)."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        return col.astype(str)
    cats = col.cat.categories.astype(str)
    return pd.Series(cats.array.take(col.cat.codes.to_numpy(), allow_fill=True), index=col.index, name=col.name)


def text_values(col: pd.Series) -> np.ndarray:
    """``col.astype(str).to_numpy()`` (an object array; NaN where the value is missing), a
    categorical column's categories converted once (160k op names: ~1 ms instead of ~17 ms, which
    build a Python string per row)."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        out: np.ndarray = col.astype(str).to_numpy()
        return out
    cats = np.asarray(col.cat.categories.astype(str).to_numpy(), dtype=object)
    codes = col.cat.codes.to_numpy()
    if not len(cats):
        return np.full(len(codes), np.nan, dtype=object)
    values: np.ndarray = cats[np.maximum(codes, 0)]
    values[codes < 0] = np.nan
    return values


def text_array(values: np.ndarray) -> Any:
    """The column pandas makes of an object array of names (text where every value present is
    text, else the objects as they are), built from its distinct values rather than row by row
    (the roofline's five text columns, 25k kernels: ~10 ms instead of ~13 ms)."""
    if pd.api.types.infer_dtype(values, skipna=True) != "string":
        return values
    codes, uniq = pd.factorize(values)
    return pd.Index(uniq, dtype=str).array.take(codes, allow_fill=True)


def call_kinds(names: pd.Series) -> np.ndarray:
    """:func:`call_kind` of every call in a runtime name column (evaluated once per distinct name)."""
    return per_category(names, call_kind)


def is_comm(names: pd.Series) -> np.ndarray:
    """Whether each kernel name is communication (:data:`COMM_PATTERNS`)."""
    return per_category(names, lambda n: comm_library(n) is not None, dtype=bool)


#: What a kernel does, read from its name alone (for traces without shapes, e.g. GPU-only ones,
#: and to compare vendors' kernels: cuBLAS ``nvjet``/``sm90_xmma_gemm`` and rocBLAS/hipBLASLt
#: ``Cijk_`` are both ``gemm``). First match wins, on the lower-cased name; communication
#: (:data:`COMM_PATTERNS`) comes first.
KERNEL_CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"flash|fmha|attn|attention|sdpa|mha_")),
    ("conv", re.compile(r"conv(?!ert)|wgrad|dgrad|winograd|fft2d_|igemm_(?:fwd|bwd|wrw)")),
    ("gemm", re.compile(r"gemm|nvjet|xmma|cijk_|gemv|wmma|matmul|cublas|hipblaslt|triton_tem|bmm")),
    ("norm", re.compile(r"norm(?!al)|bn_fw|bn_bw|gammabeta")),
    ("softmax", re.compile(r"softmax")),
    ("reduction", re.compile(r"reduce|reduction|triton_red|triton_per|argmax|argmin|topk|sort|scan")),
    ("copy", re.compile(r"copy|memcpy|memset|fill|transpose|catarray|gather|scatter|index|embedding")),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|triton_poi|pointwise|tensorop|act_and_mul|multi_tensor_apply|"
                               r"rotary|silu|gelu|relu")),
)


@functools.lru_cache(maxsize=NAME_MEMO)
def kernel_class(name: str) -> str:
    """``communication``, a :data:`KERNEL_CLASSES` label, or ``other``."""
    lower = name.lower()
    if _comm(name, lower) is not None:
        return "communication"
    for label, pattern in KERNEL_CLASSES:
        if pattern.search(lower):
            return label
    return "other"


def kernel_classes(names: pd.Series) -> np.ndarray:
    """:func:`kernel_class` of every kernel in a name column (once per distinct name)."""
    return per_category(names, kernel_class)
