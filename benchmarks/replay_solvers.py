"""Checks that the replay's two solvers give the same reports: every input analysed twice in one
process, once with the default solver (:func:`gpuprof.replay.simulate.simulate`: graphs without
collectives solved in dependency order) and once with every graph solved by the windowed passes
(:func:`gpuprof.replay.simulate._by_passes`, the solver before 2026-12-01's third session), and
the outputs compared number by number: the JSON report, the views (timeline, operators, memory)
and the claims frame.

The two solvers compute the same longest-path times but not the same floats: the passes stop
once nothing moves by more than ``SETTLED_US`` (1e-6 µs), so their last bits depend on the path
taken; the in-order solve gives the one fixed point of the whole-chain scans. Unrounded figures
(``replay_step_time_ms``, a claim's ``saved_us``) can therefore differ in their last digits,
which ``benchmarks.report_digest`` (exact hashes) reports as a difference; this says whether
anything differs beyond that.

    python -m benchmarks.replay_solvers sample_traces/h200 [--rel 1e-9]

Exit status 1 when any number differs by more than ``--rel`` (relative) or anything else differs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.report_digest import inputs


def _outputs(path: Path, solver: Callable[..., Any]) -> dict[str, Any]:
    import gpuprof.replay.run
    from gpuprof.api import analyze
    from gpuprof.errors import GpuprofError
    from gpuprof.views import claims

    module = sys.modules["gpuprof.replay.simulate"]
    saved = module.simulate
    # fixes.Plan.by_class_ms imports it from the module; gpuprof.replay.run calls its own name
    setattr(module, "simulate", solver)
    setattr(gpuprof.replay.run, "simulate", solver)
    try:
        a = analyze(path, cache=False)
        out: dict[str, Any] = {"json": json.loads(a.to_json())}
        out.update(json.loads(json.dumps(a.views_detail(), sort_keys=True, default=repr)))
        c = claims(a, a.ranks)
        out["claims"] = c.to_dict(orient="split")  # the frame whose CSV the digest hashes
        return out
    except GpuprofError as e:
        return {"error": str(e)}
    finally:
        setattr(module, "simulate", saved)
        setattr(gpuprof.replay.run, "simulate", saved)


def _diffs(x: Any, y: Any, where: str = "") -> Iterator[tuple[str, Any, Any, float]]:
    """(where, before, after, relative difference; inf: not numbers) for each leaf that differs."""
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y), key=str):
            if k not in x or k not in y:
                yield f"{where}/{k}", x.get(k), y.get(k), math.inf
            else:
                yield from _diffs(x[k], y[k], f"{where}/{k}")
    elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for i, (u, v) in enumerate(zip(x, y)):
            yield from _diffs(u, v, f"{where}[{i}]")
    elif x != y and not (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
        num = all(isinstance(z, (int, float)) and not isinstance(z, bool) for z in (x, y))
        rel = abs(x - y) / max(abs(x), abs(y)) if num else math.inf
        yield where, x, y, rel


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("roots", nargs="+")
    p.add_argument("--rel", type=float, default=1e-9, help="largest relative difference allowed (default 1e-9)")
    a = p.parse_args()
    from gpuprof.replay.simulate import _by_passes, simulate

    bad = same = 0
    worst = 0.0
    for path in inputs(a.roots):
        d = list(_diffs(_outputs(path, _by_passes), _outputs(path, simulate)))
        if not d:
            same += 1
            continue
        top = max(r for *_, r in d)
        worst = max(worst, top)
        over = [x for x in d if x[3] > a.rel]
        bad += bool(over)
        print(f"{path}: {len(d)} numbers differ, largest relative difference {top:.2g}"
              + "".join(f"\n  {w}: {u!r} -> {v!r}" for w, u, v, _ in (over or d)[:5]))
    print(f"{len(inputs(a.roots))} inputs: {same} identical, {bad} beyond {a.rel:g} relative; "
          f"largest relative difference {worst:.2g}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
