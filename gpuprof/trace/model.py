"""The read-only trace model: one :class:`RankTrace` per Kineto file, its columns documented here.

Times are float microseconds since the rank's time origin ``t0``; ``t0_epoch_ns`` is that origin
in Unix nanoseconds (``baseTimeNanoseconds + first ts``; old traces carry absolute µs), so NVML
samples and other ranks line up. Integer ids that a trace lacks are -1; missing numbers are NaN.
Analyzers must not mutate these frames (``tests/test_readonly.py`` checks it).

kernels
    name (category), ts, dur, end, device, stream, correlation, external_id, grid_x/y/z,
    block_x/y/z, blocks (grid size), threads_per_block, registers, shared_mem, occupancy
    (est. achieved %, NaN where the trace has 0: cluster launches such as nvjet and NCCL),
    is_comm (communication kernel by name: NCCL, RCCL, DeepEP, custom all-reduce/all-to-all;
    ``gpuprof.trace.names.COMM_PATTERNS``), name_class (what the name says it does: gemm, conv,
    attention, norm, softmax, reduction, copy, elementwise, communication, other;
    ``names.kernel_class``, for traces without shapes and across vendors),
    collective, coll_dtype, in_nelems, out_nelems, group_size, process_group, coll_seq (a
    collective's sequence number in its process group, Kineto's ``Seq``; -1 where the trace has none),
    and, from links: launch_ts, launch_tid, launch_api (cudaLaunchKernel, cuLaunchKernelEx,
    hipExtModuleLaunchKernel, cudaGraphLaunch...), in_graph (bool: launched by a graph replay,
    ``cudaGraphLaunch``/``hipGraphLaunch``, whose correlation every kernel of the graph carries),
    op (row of ``ops``, -1 if none: the op whose External id the kernel or its launch call carries
    if the launch call lies inside that op's span on its thread, else the innermost op around the
    launch call; for graph kernels, the op around the graph launch), step (-1 outside any step).
memcpys
    name, kind (HtoD, DtoH, DtoD, PtoP, Memset), src, dst (Pageable, Pinned, Device, ...),
    bytes, ts, dur, end, device, stream, correlation, external_id, launch_ts, launch_tid,
    launch_api, in_graph, op, step (as for kernels).
ops
    name (category), ts, dur, end, pid, tid, external_id, sequence_number, fwd_thread_id,
    input_dims, input_types, input_strides, concrete_inputs (the JSON bytes Kineto recorded, None
    when not recorded; ``gpuprof.trace.load.parse_arg`` turns one into Python lists),
    depth (nesting depth on its thread, 0 = top level), parent (row of ``ops``, -1), step.
runtime
    name (category), api (runtime or driver), ts, dur, end, pid, tid, correlation, external_id,
    kind (launch, graph_launch, graph_capture, sync, malloc, free or other: the tables of
    ``gpuprof.trace.names``, CUDA, driver and HIP), op (row of ``ops``: the innermost op on the
    call's thread whose span holds its start, -1), step.
annotations
    name, ts, dur, end, pid, tid, on_gpu (gpu_user_annotation), device, stream, external_id.
    torch 1.8-1.9 wrote record_function ranges as ops; PyTorch's own (ProfilerStep#N,
    enumerate(DataLoader)#..., Optimizer.step#/zero_grad#) are moved here, as later versions file them.
steps
    step (the N of ProfilerStep#N, or an ordinal), name, cpu_start, cpu_end (the window: CPU
    time, or GPU time when ``meta.steps_source`` is "ProfilerStep (GPU)"), gpu_start,
    gpu_end, start (the step's start on the GPU timeline), end, time (µs), kernels.
python
    name (category: ``file.py(line): function`` or ``<built-in method ...>``), ts, dur, end, tid:
    the ``python_function`` events of a ``with_stack=True`` trace (empty without stacks).
memory
    the ``[memory]`` instants of ``profile_memory=True`` (empty without): ts, bytes (allocated,
    negative when freed), total_allocated and total_reserved (bytes on that device after the
    event), device (-1 for the CPU), device_type (0 CPU, 1 CUDA), pid, tid, step.
collectives
    kernel (row of ``kernels``), name, collective, dtype, in_nelems, out_nelems, group_size,
    process_group, ts, dur, step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd


@dataclass(frozen=True)
class TraceMeta:
    path: str
    rank: int
    world_size: int
    device_properties: list[dict[str, Any]]
    distributed_info: dict[str, Any] | None
    t0_epoch_ns: int
    time_origin: str  # "baseTimeNanoseconds", "absolute-us" (Unix µs) or "trace-clock-us" (not Unix time)
    schema_version: Any
    trace_name: str | None
    record_shapes: bool
    with_stack: bool
    steps_source: str  # "ProfilerStep", "ProfilerStep (GPU)", "optimizer", or "whole trace"
    events: int
    warnings: tuple[str, ...] = field(default_factory=tuple)
    content_key: str | None = None  # the cache key of the bytes these frames were parsed from (None: no cache)
    #: Graph capture/instantiation calls (``cudaStreamBeginCapture``, ``cudaGraphInstantiate``,
    #: HIP alike: ``gpuprof.trace.names.GRAPH_CAPTURE_CALLS``). Non-zero: the trace records capture
    #: (warm-up), not a steady-state profile.
    graph_capture_calls: int = 0
    #: Graph replays (``cudaGraphLaunch``/``hipGraphLaunch``); their kernels have ``in_graph``.
    graph_launch_calls: int = 0
    cpu_events: int = 0  # CPU ops + CPU annotations (0: a GPU-only trace, activities=[CUDA])
    runtime_calls: int = 0  # CUDA/HIP runtime and driver calls (0: no launch times)

    @property
    def gpu_name(self) -> str | None:
        for p in self.device_properties:
            if isinstance(p.get("name"), str):
                return str(p["name"])
        return None


@dataclass(frozen=True)
class RankTrace:
    """One rank's trace as columnar frames (see the module docstring for the columns)."""

    meta: TraceMeta
    kernels: pd.DataFrame
    memcpys: pd.DataFrame
    ops: pd.DataFrame
    runtime: pd.DataFrame
    annotations: pd.DataFrame
    steps: pd.DataFrame
    collectives: pd.DataFrame
    python: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        {"name": pd.Categorical([]), "ts": [], "dur": [], "end": [], "tid": pd.Series([], dtype="int64")}))
    memory: pd.DataFrame = field(default_factory=lambda: empty_memory())

    @property
    def has_gpu(self) -> bool:
        return len(self.kernels) + len(self.memcpys) > 0


def empty_memory() -> pd.DataFrame:
    """The ``memory`` frame of a trace without ``[memory]`` events."""
    return pd.DataFrame({"ts": pd.Series(dtype="float64"), "bytes": pd.Series(dtype="float64"),
                         "total_allocated": pd.Series(dtype="float64"), "total_reserved": pd.Series(dtype="float64"),
                         "device": pd.Series(dtype="int64"), "device_type": pd.Series(dtype="int64"),
                         "pid": pd.Series(dtype="int64"), "tid": pd.Series(dtype="int64"),
                         "step": pd.Series(dtype="int64")})
