"""benchmarks.matrix's schedule of HTA runs between gpuprof's rounds (--hta-repeat)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.matrix import hta_rounds, median


@pytest.mark.parametrize(("repeat", "hta_repeat", "rounds"), [
    (5, 1, [2]),  # one run: the middle round, as before --hta-repeat
    (3, 1, [1]),
    (5, 3, [0, 2, 4]),  # spread over the rounds, first to last
    (3, 3, [0, 1, 2]),
    (3, 5, [0, 0, 1, 2, 2]),  # more HTA runs than rounds: several after some rounds, every one run
    (1, 2, [0, 0]),
])
def test_hta_runs_are_spread_over_gpuprofs_rounds(repeat: int, hta_repeat: int, rounds: list[int]) -> None:
    got = hta_rounds(repeat, hta_repeat)
    assert got == rounds and len(got) == hta_repeat and all(0 <= i < repeat for i in got)


def test_the_median_run_is_kept_and_failed_runs_are_left_out() -> None:
    runs: list[dict[str, Any]] = [{"seconds": 3.0, "cpu_seconds": 3.1}, {"error": "exit 1"}, {"seconds": 1.0, "cpu_seconds": 1.2},
            {"seconds": 2.0, "cpu_seconds": 2.2}]
    assert median(runs) == {"seconds": 2.0, "cpu_seconds": 2.2, "all_seconds": [1.0, 2.0, 3.0]}
    assert median([{"error": "exit 1"}]) == {"error": "exit 1"}
