"""``gpuprof diff``: what changed between two runs — the before/after view after applying a fix.

Compares two :class:`~gpuprof.api.Analysis` documents and returns plain data: step time (traced,
and without the profiler when both runs know it), MFU, GPU busy, time by class, each finding
category's estimated saving, and the kernels whose time per step changed most.
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


def compare(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The diff document of two JSON report documents (``Analysis.to_dict()``)."""
    sb, sa = before["summary"], after["summary"]
    cats = sorted({f["category"] for f in before["findings"]} | {f["category"] for f in after["findings"]})

    def saving(doc: dict[str, Any], cat: str) -> float:
        return float(sum(f["estimated_savings_ms"] for f in doc["findings"] if f["category"] == cat))

    kb, ka = _per_step(before), _per_step(after)
    names = set(kb) | set(ka)
    moved = sorted(names, key=lambda n: -abs(ka.get(n, 0.0) - kb.get(n, 0.0)))[:TOP_KERNELS]
    return {
        "schema_version": 1,
        "before": {"paths": before["source"]["paths"], "gpu": before["gpu"]["name"],
                   "warnings": before.get("warnings", [])},
        "after": {"paths": after["source"]["paths"], "gpu": after["gpu"]["name"],
                  "warnings": after.get("warnings", [])},
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
