"""``gpuprof diff``: what changed between two runs — the before/after view after applying a fix.

Compares two :class:`~gpuprof.api.Analysis` documents and returns plain data: step time (traced,
and without the profiler when both runs know it: ``step`` leads with that one, from run folders or
``--step-ms-*``), MFU, GPU busy, time by class, each finding category's estimated saving, the
kernels whose time per step changed most, and for each side whether its traced step is the
profiled host's (``host_bound``) and what its fixes were projected to give (``projection``).
"""

from __future__ import annotations

from typing import Any

TOP_KERNELS = 15


def _per_step(doc: dict[str, Any]) -> dict[str, float]:
    steps = max(doc["summary"]["steps"], 1) * max(len(doc["source"]["ranks"]), 1)
    return {k["name"]: k["total_us"] / 1000.0 / steps for k in doc["kernels"]}


def _delta(a: float | None, b: float | None) -> dict[str, float | None]:
    if a is None or b is None:
        return {"before": a, "after": b, "change": None, "change_pct": None}
    return {"before": a, "after": b, "change": b - a, "change_pct": 100.0 * (b - a) / a if a else None}


#: A side whose GPU is idle this share of its traced step, without an unprofiled step time, is
#: host-bound under the profiler: torch.profiler slows the host 1.5-2.5x (README), so its traced
#: step measures the profiled host rather than the program (gpt_bf16: 26.24 ms traced, 8.90 ms
#: without the profiler, the GPU idle 66 % of the trace).
HOST_BOUND_IDLE_PCT = 20.0


def host_bound(doc: dict[str, Any]) -> dict[str, Any] | None:
    """Why a report's traced step time is the profiled host's and not the program's, or None:
    its GPU idles ``HOST_BOUND_IDLE_PCT`` of the step or more and no step time measured without
    the profiler is known (a run folder of ``gpuprof record`` carries one, ``--step-ms`` gives one)."""
    s = doc["summary"]
    idle = float(s["breakdown_pct"].get("idle") or 0.0)
    if s.get("unprofiled_step_time_ms") or idle < HOST_BOUND_IDLE_PCT:
        return None
    return {"idle_pct": idle, "step_time_ms": s["step_time_ms"],
            "gpu_ms": s.get("gpu_kernel_time_ms") or s["step_time_ms"] * (1 - idle / 100.0)}


def _step_basis(sb: dict[str, Any], sa: dict[str, Any]) -> tuple[str, float | None, float | None]:
    """The step times the diff leads with: both without the profiler where both sides know it
    (run folders, --step-ms-before/--step-ms-after), else both as traced."""
    ub, ua = sb.get("unprofiled_step_time_ms"), sa.get("unprofiled_step_time_ms")
    if ub and ua:
        return "without the profiler", ub, ua
    return "traced", sb["step_time_ms"], sa["step_time_ms"]


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The diff document of two JSON report documents (``Analysis.to_dict()``)."""
    sb, sa = before["summary"], after["summary"]
    cats = sorted({f["category"] for f in before["findings"]} | {f["category"] for f in after["findings"]})

    def saving(doc: dict[str, Any], cat: str) -> float:
        return float(sum(f["estimated_savings_ms"] for f in doc["findings"] if f["category"] == cat))

    kb, ka = _per_step(before), _per_step(after)
    names = set(kb) | set(ka)
    moved = sorted(names, key=lambda n: -abs(ka.get(n, 0.0) - kb.get(n, 0.0)))[:TOP_KERNELS]
    basis, step_b, step_a = _step_basis(sb, sa)

    def side(doc: dict[str, Any]) -> dict[str, Any]:
        s = doc["summary"]
        return {"paths": doc["source"]["paths"], "gpu": doc["gpu"]["name"], "warnings": doc.get("warnings", []),
                "run_folder": doc["source"].get("run_folder"),
                "unprofiled_step_time_ms": s.get("unprofiled_step_time_ms"), "host_bound": host_bound(doc),
                "projection": {k: s.get(k) for k in ("projected_from_ms", "projected_step_time_ms",
                                                     "projected_findings")}}

    return {
        "schema_version": 1,
        "before": side(before),
        "after": side(after),
        "step": {"basis": basis, **_delta(step_b, step_a)},
        "step_time_ms": _delta(sb["step_time_ms"], sa["step_time_ms"]),
        "unprofiled_step_time_ms": _delta(sb.get("unprofiled_step_time_ms"), sa.get("unprofiled_step_time_ms")),
        "mfu_pct": _delta(sb.get("mfu_pct"), sa.get("mfu_pct")),
        "mfu_unprofiled_pct": _delta(sb.get("mfu_unprofiled_pct"), sa.get("mfu_unprofiled_pct")),
        "gpu_busy_pct": _delta(sb["gpu_busy_pct"], sa["gpu_busy_pct"]),
        "breakdown_ms": {c: _delta(sb["breakdown_pct"][c] * sb["step_time_ms"] / 100.0,
                                   sa["breakdown_pct"][c] * sa["step_time_ms"] / 100.0) for c in sb["breakdown_pct"]},
        "findings_saving_ms": {c: _delta(saving(before, c), saving(after, c)) for c in cats},
        "kernels_ms_per_step": [{"name": n, **_delta(kb.get(n, 0.0), ka.get(n, 0.0))} for n in moved],
    }
