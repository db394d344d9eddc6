"""The :class:`Finding` value every analyzer returns and every report formats."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["high", "medium", "low", "info"]

#: The category vocabulary of the JSON report. Extend only by adding; never rename or reuse.
CATEGORIES = (
    "precision",
    "shape_alignment",
    "attention_fusion",
    "elementwise_fusion",
    "optimizer_fusion",
    "launch_overhead",
    "input_pipeline",
    "host_sync",
    "pageable_memcpy",
    "memory_bound_decode",
    "exposed_communication",
    "rank_imbalance",
    "gpu_throttling",
    "memory_capacity",
    "allocator_churn",
    "host_stall",
    "memory_format",
    "compile",
    "kv_cache",
    "batching",
)


def severity_for(savings_pct: float) -> Severity:
    """Severity follows the estimated saving: high at 10% of step time or more, medium at 3%."""
    if savings_pct >= 10.0:
        return "high"
    if savings_pct >= 3.0:
        return "medium"
    if savings_pct > 0.0:
        return "low"
    return "info"


@dataclass(frozen=True)
class Finding:
    """One defect, what it costs per step, the evidence, and the code-level fix.

    ``estimated_savings_ms`` is per step and computed from the trace and the roofline (time of
    the affected work minus its time after the fix, or idle time that would disappear);
    ``evidence["estimate"]`` says how.
    """

    id: str
    category: str
    title: str
    estimated_savings_ms: float
    estimated_savings_pct: float
    confidence: Literal["high", "medium", "low"]
    recommendation: str
    evidence: dict[str, Any] = field(default_factory=dict)
    severity: Severity | None = None

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"unknown finding category {self.category!r}")
        if self.severity is None:
            object.__setattr__(self, "severity", severity_for(self.estimated_savings_pct))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "category": self.category,
            "title": self.title,
            "severity": self.severity,
            "estimated_savings_ms": round(self.estimated_savings_ms, 4),
            "estimated_savings_pct": round(self.estimated_savings_pct, 3),
            "confidence": self.confidence,
            "evidence": self.evidence,
            "recommendation": self.recommendation,
        }
