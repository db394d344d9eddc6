"""benchmarks.fix_replay_accuracy's verdicts: which estimate is closer to the realised saving, and
when the timing cannot tell (SYNTHETIC rows: the benchmark's own row dicts, made up here)."""

from __future__ import annotations

from typing import Any

from benchmarks.fix_replay_accuracy import closer, counts


def row(real: float, unc: float, today: float, rep: float | None) -> dict[str, Any]:
    return {"realised_ms": real, "uncertainty_ms": unc, "today_ms": today, "replay_ms": rep}


def test_a_difference_inside_the_realised_noise_is_a_tie() -> None:
    assert closer(row(65.41, 0.39, 64.24, 64.22)) == "tie"  # 0.02 ms apart, known to ±0.39
    assert closer(row(14.54, 0.02, 13.68, 12.22)) == "today"
    assert closer(row(6.97, 0.06, 9.30, 8.16)) == "replay"
    assert closer(row(3.0, 0.0, 2.0, 4.0)) == "replay"  # equally close: at least as close
    assert closer(row(3.0, 1.0, 2.0, None)) == "–"


def test_counts_strict_with_ties_and_within_20_percent() -> None:
    rows = [row(65.41, 0.39, 64.24, 64.22), row(14.54, 0.02, 13.68, 12.22), row(6.97, 0.06, 9.30, 8.16),
            row(3.0, 1.0, 2.0, None)]
    c = counts(rows)
    assert c == {"pairs": 3, "strict": 1, "with_ties": 2, "ties": 1, "within_20pct": 3}
