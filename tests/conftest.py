"""Shared test helpers.

``TraceBuilder`` makes SYNTHETIC Kineto traces in code, for unit tests only: every event is
written by the test that needs it, in the schema torch.profiler 2.4+ writes (relative µs with
``baseTimeNanoseconds``). Functional tests use the real traces in ``sample_traces/`` instead.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

# The suite's own parse cache, so tests never write into the user's ~/.cache (subprocesses inherit it).
os.environ["GPUPROF_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpuprof-test-cache-")

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces" / "h200"

_SAMPLE_ANALYSES: dict[tuple[str, bool], Any] = {}


def sample_analysis(name: str, with_step: bool = True) -> Any:
    """A shipped sample's analysis (a pair member of benchmarks.pairs), with its unprofiled step
    time unless ``with_step`` is False; made once per test session, as several test files read
    the same samples."""
    key = (name, with_step)
    if key not in _SAMPLE_ANALYSES:
        import gpuprof
        from benchmarks.pairs import step_ms, trace_path

        _SAMPLE_ANALYSES[key] = gpuprof.analyze(trace_path(name), step_ms=step_ms(name) if with_step else None)
    return _SAMPLE_ANALYSES[key]


def views(a: Any) -> list[Any]:
    """Each rank's view (:class:`gpuprof.rank.RankView`) of an analysis, as the analyzers see it."""
    from gpuprof.rank import RankView

    return [RankView(r, a.spec) for r in a.ranks]


def gpu_busy_ms(name: str) -> float:
    """A shipped sample's GPU busy time per step (ms, the step less its idle share), from its
    analysis with the unprofiled step time."""
    s = sample_analysis(name).summary
    return float(s["step_time_ms"]) * (1 - float(s["breakdown_pct"]["idle"]) / 100)

H200_PROPS = {"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320, "computeMajor": 9,
              "computeMinor": 0, "numSms": 132, "maxThreadsPerMultiprocessor": 2048}


class TraceBuilder:
    """Build a synthetic Kineto trace event by event (times in µs from the trace start)."""

    def __init__(self, base_ns: int = 1_790_000_000_000_000_000, device: dict[str, Any] | None = H200_PROPS,
                 offset_us: float = 5_000_000.0) -> None:
        self.events: list[dict[str, Any]] = []
        self.base_ns = base_ns
        self.device = device
        self.offset = offset_us  # Kineto's ts are large numbers relative to baseTimeNanoseconds
        self._ext = 1
        self._corr = 100
        self.top: dict[str, Any] = {}

    def _x(self, cat: str, name: str, ts: float, dur: float, pid: Any, tid: Any, args: dict[str, Any]) -> dict[str, Any]:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": self.offset + ts, "dur": dur, "args": args}
        self.events.append(ev)
        return ev

    def op(self, name: str, ts: float, dur: float, dims: list[Any] | None = None, types: list[Any] | None = None,
           concrete: list[Any] | None = None, tid: int = 1) -> int:
        ext = self._ext
        self._ext += 1
        args: dict[str, Any] = {"External id": ext}
        if dims is not None:
            args["Input Dims"] = dims
            args["Input type"] = types or []
            args["Concrete Inputs"] = concrete or [""] * len(dims)
        self._x("cpu_op", name, ts, dur, 10, tid, args)
        return ext

    def annotation(self, name: str, ts: float, dur: float, gpu: bool = False, tid: int = 1) -> None:
        self._x("gpu_user_annotation" if gpu else "user_annotation", name, ts, dur, 0 if gpu else 10,
                7 if gpu else tid, {"External id": self._next_ext()})

    def _next_ext(self) -> int:
        self._ext += 1
        return self._ext - 1

    def launch(self, kernel: str, cpu_ts: float, gpu_ts: float, dur: float, ext: int | None, grid: tuple[int, int, int] = (1024, 1, 1),
               block: tuple[int, int, int] = (256, 1, 1), stream: int = 7, tid: int = 1, api: str = "cudaLaunchKernel",
               kernel_ext: bool = True) -> None:
        corr = self._corr
        self._corr += 1
        rt_args: dict[str, Any] = {"correlation": corr}
        if ext is not None:
            rt_args["External id"] = ext
        self._x("cuda_driver" if api.startswith("cu") and not api.startswith("cuda") else "cuda_runtime",
                api, cpu_ts, 3.0, 10, tid, rt_args)
        k_args: dict[str, Any] = {"device": 0, "stream": stream, "correlation": corr, "grid": list(grid),
                                  "block": list(block), "registers per thread": 32, "shared memory": 0,
                                  "est. achieved occupancy %": 50}
        if ext is not None and kernel_ext:
            k_args["External id"] = ext
        self._x("kernel", kernel, gpu_ts, dur, 0, stream, k_args)

    def memcpy(self, name: str, cpu_ts: float, gpu_ts: float, dur: float, nbytes: int, ext: int | None = None) -> None:
        corr = self._corr
        self._corr += 1
        self._x("cuda_runtime", "cudaMemcpyAsync", cpu_ts, 3.0, 10, 1, {"correlation": corr, "External id": ext or 0})
        self._x("gpu_memcpy", name, gpu_ts, dur, 0, 7, {"device": 0, "stream": 7, "correlation": corr, "bytes": nbytes})

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schemaVersion": 1, "baseTimeNanoseconds": self.base_ns, "displayTimeUnit": "ms",
                               "traceEvents": self.events, "traceName": "synthetic"}
        if self.device is not None:
            doc["deviceProperties"] = [self.device]
        doc.update(self.top)
        return doc

    def write(self, path: Path, gz: bool = False) -> Path:
        data = json.dumps(self.document()).encode()
        path.write_bytes(gzip.compress(data) if gz else data)
        return path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests run only when asked for (`-m gpu`, on a GPU machine); otherwise they are
    deselected, so a CPU run never counts them as passed."""
    if "gpu" in (config.getoption("-m") or ""):
        return
    keep = [i for i in items if "gpu" not in i.keywords]
    dropped = [i for i in items if "gpu" in i.keywords]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture
def builder() -> TraceBuilder:
    return TraceBuilder()


def simple_training_trace(b: TraceBuilder, steps: int = 3, step_us: float = 1000.0, gpu_lag: float = 0.0) -> TraceBuilder:
    """SYNTHETIC: ``steps`` ProfilerStep windows, each a bf16 GEMM and an elementwise add."""
    for s in range(steps):
        t = s * step_us
        b.annotation(f"ProfilerStep#{s + 3}", t, step_us - 1.0)
        mm = b.op("aten::mm", t + 10, 20, [[4096, 4096], [4096, 4096]], ["c10::BFloat16", "c10::BFloat16"])
        b.launch("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", t + 12, t + 50 + gpu_lag, 300.0, mm, grid=(132, 1, 1))
        add = b.op("aten::add", t + 40, 10, [[4096, 4096], [4096, 4096], []], ["c10::BFloat16", "c10::BFloat16", "Scalar"])
        b.launch("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>",
                 t + 42, t + 360 + gpu_lag, 40.0, add, grid=(8192, 1, 1))
    return b
