"""Kineto's event categories and the limits both trace decoders share (:mod:`gpuprof.trace.chunks`,
the msgspec path, and :mod:`gpuprof.trace.native`, the C scanner's): what an event's bucket is,
which times are damage, and what a decoder hands to :func:`gpuprof.trace.load.load_trace`."""

from __future__ import annotations

from typing import Any

import numpy as np

#: PyTorch's own record_function ranges. Since torch 1.10 Kineto files them as user_annotation;
#: torch 1.8-1.9 wrote them as Operator events like any op, so they are moved to the annotations
#: there (steps, DataLoader and optimizer spans are read from the annotations).
RECORD_FUNCTIONS = ("ProfilerStep#", "enumerate(DataLoader)#", "Optimizer.step#", "Optimizer.zero_grad#")
#: No profiler records a time this far from its origin, or a span this long: µs (about 3,000
#: years, and 11.5 days). Numbers beyond are damage, not times, and would poison every sum.
MAX_ABS_TS_US = 1e17
MAX_DUR_US = 1e12

#: Kineto's event categories, lower case since torch 1.10 and capitalised in 1.8-1.9.
BUCKETS = {
    "Kernel": "kernels",
    "Memcpy": "memcpys",
    "Memset": "memcpys",
    "Operator": "ops",
    "Runtime": "runtime",
    "kernel": "kernels",
    "gpu_memcpy": "memcpys",
    "gpu_memset": "memcpys",
    "cpu_op": "ops",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "user_annotation": "annotations",
    "gpu_user_annotation": "annotations",
    "python_function": "python",
}
#: Each category's code (its place in ``BUCKETS``; -1: not a bucket), and each code's bucket.
CAT_CODE = {c: i for i, c in enumerate(BUCKETS)}
BUCKET_NAMES = sorted(set(BUCKETS.values()))
BUCKET_OF = np.array([BUCKET_NAMES.index(b) for b in BUCKETS.values()] + [-1])  # (code -1: the last, no bucket)
OPS, ANNOTATIONS = BUCKET_NAMES.index("ops"), BUCKET_NAMES.index("annotations")


def to_int64(a: np.ndarray) -> np.ndarray:
    """Integral floats within int64's range as int64, others (NaN, inf, 2.5, 1e300) -1."""
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(a) & (a == np.floor(a)) & (np.abs(a) < 2.0**63)
    out: np.ndarray = np.where(ok, a, -1.0).astype(np.int64)
    return out


#: What a loader hands on: the document's metadata, its number of events, each bucket's columns
#: (a dict of columns per chunk), each bucket's names (name -> code, in order of first
#: appearance) and the ``[memory]`` instants' columns (per chunk).
Parts = tuple[Any, int, dict[str, list[dict[str, Any]]], dict[str, dict[str, int]], list[dict[str, np.ndarray]]]
