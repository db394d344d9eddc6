"""Estimated savings vs. realised step-time differences, for every bad/good sample-trace pair.

For each pair: analyse the bad trace (with its unprofiled step time, as `gpuprof record` or
`--step-ms` supplies it), take the finding of the pair's category, and compare its estimated
saving (replayed together with the findings whose fix the good member also applies, where the
pair says so: ``also``) with the realised difference of the unprofiled step times (bad − good,
each the mean of two runs, in sample_traces/h200/timings/). Also checks the category is in the
bad trace's top 3 and not raised with ≥ 5 % by the good trace. Prints the tables of docs/accuracy.md.

    python -m benchmarks.estimate_accuracy              # every table of docs/accuracy.md
    python -m benchmarks.estimate_accuracy --heldout    # the held-out pairs and the by-class table only
    python -m benchmarks.estimate_accuracy --json OUT   # the rows as JSON too (to compare two versions)

The held-out pairs (sample_traces/h200/heldout_pairs.json, issue #24) are evaluated the same way
and kept apart in every table: they check the estimates and never tune them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gpuprof
from benchmarks.pairs import (also, depth_pairs, family, heldout_pairs, home, input_wait_ms, pairs, realised_ms,
                              realised_noise_ms, step_ms, trace_path)


def row(cat: str, bad: str, good: str, with_step_ms: bool = True, comparable: bool = True) -> dict[str, object]:
    """One pair: the bad trace's finding of ``cat`` against the realised saving (per the bad step's
    work: decode pairs per token, see ``realised_ms``), compared only within one device session."""
    a = gpuprof.analyze(trace_path(bad), step_ms=step_ms(bad) if with_step_ms else None,
                        input_wait_ms=input_wait_ms(bad) if with_step_ms else None)
    # a good member timed but not recorded (round 5's vision_light) has no trace to raise anything
    b = gpuprof.analyze(trace_path(good), step_ms=step_ms(good) if with_step_ms else None,
                        input_wait_ms=input_wait_ms(good) if with_step_ms else None) \
        if trace_path(good).exists() else None
    cats = [f.category for f in a.findings]
    mine = next((f for f in a.findings if f.category == cat), None)
    good_f = next((f for f in b.findings if f.category == cat), None) if b is not None else None
    same = session(bad) == session(good)  # host-bound savings compare only within one session
    realised = realised_ms(bad, good)
    ok = comparable and same
    est, applied = alone_ms(mine), []
    if mine is not None:  # a good member that also applies other findings' fixes: those replayed with it
        applied = [f for f in (next((f for f in a.findings if f.category == c), None) for c in also(bad, good)) if f]
        if applied and all(f.evidence.get("estimate") == "replay" for f in [mine, *applied]):
            w = a.what_if([mine.id] + [f.id for f in applied])  # replayed together, as each was alone
            est = float(w["before_ms"]) - float(w["step_time_ms"])
        elif applied:  # an estimate that is not the replay (a host-side fix on a bare trace): added
            est += sum(alone_ms(f) for f in applied)
    return {
        "category": cat, "bad": bad, "good": good, "rank_in_bad": cats.index(cat) + 1 if cat in cats else None,
        "bad_top1": cats[0] if cats else None,
        "estimated_ms": est,
        "also": [f.category for f in applied],
        "estimated_pct": (mine.estimated_savings_pct * est / mine.estimated_savings_ms
                          if mine and mine.estimated_savings_ms else 0.0),
        "realised_ms": realised if ok else None,
        "realised_pct": 100 * realised / step_ms(bad) if ok else None,
        "why": None if not comparable or same else "other sessions",
        "noise_ms": realised_noise_ms(bad, good),
        "error_pct": 100 * (est - realised) / realised if ok and realised > 0 else None,
        "good_pct": good_f.estimated_savings_pct if good_f else 0.0,
        "bad_step_ms": step_ms(bad), "good_step_ms": step_ms(good),
        # where the trace does not identify the host: the fix's saving on the host floor and with no host
        "bounds": (mine.evidence.get("replay_saving_bounds_ms") if mine else None),
        "floor_us": (mine.evidence.get("host_floor_us_per_event") if mine else None),
    }


def evaluate(with_step_ms: bool = True) -> list[dict[str, object]]:
    """Every pair of pairs.json and depth_pairs.json."""
    return [row(cat, bad, good, with_step_ms, comparable)
            for cat, bad, good, comparable in pairs() + [(c, b, g, True) for _, c, b, g in depth_pairs()]]


def session(name: str) -> object:
    """The device session a sample's step time was measured in (timings' ``session``; None for the
    samples recorded before sessions were noted): host-bound savings compare only within one."""
    f = home(name) / "timings" / f"{name}.json"
    return json.loads(f.read_text()).get("session") if f.is_file() else None


def alone_ms(f: gpuprof.Finding | None) -> float:
    """A finding's saving as the fix applied alone, which is what a pair realises: its
    ``estimated_saving_alone_ms`` where it claims after other findings (compile, whose reported
    saving is what it adds to the fusions ranked with it), else its reported saving."""
    if f is None:
        return 0.0
    return float(f.evidence.get("estimated_saving_alone_ms", f.estimated_savings_ms))


def evaluate_depth(expect: tuple[str, ...] | None = None) -> list[dict[str, object]]:
    """The same comparison on sample_traces/h200/depth_pairs.json (issue #12's classes)."""
    return [{**row(cat, bad, good), "class": klass} for klass, cat, bad, good in depth_pairs(expect)]


#: Held-out pairs whose fixed twin ran another fix than the one the finding estimates: shown, not
#: counted. The FP8 twin wrote its scaling casts in eager PyTorch around ``torch._scaled_mm`` (an
#: amax reduction and a cast per operand, per product); the finding prices FP8 with the casts fused
#: (Transformer Engine, torchao float8 under torch.compile), and says eager casts can eat the gain.
#: The cheaper-augmentation twin of round 5 made its loader about 1.28x faster, where the finding
#: prices a loader that keeps up and says it needs 4.9x: the twin still waits (29.3 ms a step
#: against the 8.1 ms the finding prices), so it realised part of the fix (docs/accuracy.md).
OTHER_FIX = {("ho_mlp_bf16", "ho_mlp_fp8"): "other fix (eager casts)",
             ("ld5_vision_w4", "ld5_vision_light"): "part of the fix (the loader still falls behind)"}


def evaluate_heldout() -> list[dict[str, object]]:
    """The held-out pairs (sample_traces/h200/heldout_pairs.json), with the unprofiled step time."""
    out = []
    for klass, cat, bad, good in heldout_pairs():
        other = OTHER_FIX.get((bad, good))
        r = {**row(cat, bad, good, comparable=other is None), "class": klass}
        if other:
            r["why"] = other
            r["realised_as_measured_ms"] = realised_ms(bad, good)
        out.append(r)
    return out


def within(r: dict[str, object], pct: float = 20.0) -> bool | None:
    """Whether a row's estimate is within ``pct`` % of the realised saving, or within the pair's
    own timing noise of it (None: no comparable realised saving)."""
    if r["realised_ms"] is None:
        return None
    est, real, noise = float(r["estimated_ms"]), float(r["realised_ms"]), float(r["noise_ms"])  # type: ignore[arg-type]
    return (real > 0 and abs(est - real) <= pct / 100.0 * real) or abs(est - real) <= noise


def by_class(rows: list[dict[str, object]]) -> str:
    """Per category: pairs compared, within ±20 %, within ±20 % or the noise, the mean signed error
    (the bias, issue #24's measure) over the pairs whose realised saving is positive, and beside it
    the same pairs' estimated ms summed over their realised ms summed, less one: the bias in
    milliseconds, which a pair whose realised saving is near zero (inside its timing noise) cannot
    swing the way it swings the mean of percentages."""
    out = ["| category | pairs | families | within ±20 % | within ±20 % or noise | mean error (bias) "
           "| Σ estimated / Σ realised − 1 |",
           "|---|---|---|---|---|---|---|"]
    cats: dict[str, list[dict[str, object]]] = {}
    for r in rows:
        if r["realised_ms"] is not None:
            cats.setdefault(str(r["category"]), []).append(r)
    tot = [0, 0, 0]
    fams: set[str] = set()
    for cat, rs in sorted(cats.items()):
        pos = [r for r in rs if r["error_pct"] is not None]
        errs = [float(r["error_pct"]) for r in pos]  # type: ignore[arg-type]
        strict = sum(e is not None and abs(float(e)) <= 20 for e in (r["error_pct"] for r in rs))  # type: ignore[arg-type]
        loose = sum(bool(within(r)) for r in rs)
        f = {family(str(r["bad"])) for r in rs}
        fams |= f
        tot = [tot[0] + len(rs), tot[1] + strict, tot[2] + loose]
        bias = f"{sum(errs) / len(errs):+.0f}%" if errs else "–"
        real = sum((float(r["realised_ms"]) for r in pos), 0.0)  # type: ignore[arg-type]
        est = sum((float(r["estimated_ms"]) for r in pos), 0.0)  # type: ignore[arg-type]
        ms_bias = f"{100 * (est / real - 1):+.0f}%" if real > 0 else "–"
        out.append(f"| {cat} | {len(rs)} | {len(f)} | {strict} | {loose} | {bias} | {ms_bias} |")
    out.append(f"| **all** | {tot[0]} | {len(fams)} | {tot[1]} ({100 * tot[1] / max(tot[0], 1):.0f}%) "
               f"| {tot[2]} ({100 * tot[2] / max(tot[0], 1):.0f}%) | | |")
    return "\n".join(out)


def markdown(rows: list[dict[str, object]]) -> str:
    out = ["| category | bad → good | rank in bad | estimated ms (%) | realised ms (%) | error | good raises |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        real = ((r.get("why") or "not run") if r["realised_ms"] is None
                else f"{r['realised_ms']:.2f} ({r['realised_pct']:.0f}%)")
        err = "–" if r["error_pct"] is None else f"{r['error_pct']:+.0f}%"
        extra: list[str] = r.get("also") or []  # type: ignore[assignment]
        cat = " + ".join([str(r["category"]), *extra])
        out.append(f"| {cat} | {r['bad']} ({r['bad_step_ms']:.2f} ms) → {r['good']} ({r['good_step_ms']:.2f} ms) "
                   f"| {r['rank_in_bad'] or '–'} | {r['estimated_ms']:.2f} ({r['estimated_pct']:.0f}%) | {real} | {err} "
                   f"| {r['good_pct']:.1f}% |")
    return "\n".join(out)


def bounds_markdown(rows: list[tuple[str, dict[str, object]]]) -> str:
    """The pairs priced between the host floor and no host (docs/replay.md, "The host floor")."""
    out = ["| real step | category | bad → good | floor µs/event | saving on the floor | with no host | "
           "estimate | realised | error |", "|---|---|---|---|---|---|---|---|---|"]
    inside = 0
    for label, r in rows:
        b = r["bounds"]
        assert isinstance(b, dict)
        lo, hi = sorted((float(b["host_floor"]), float(b["no_host"])))
        real = r["realised_ms"]
        inside += real is not None and lo <= float(real) <= hi  # type: ignore[arg-type]
        err = "–" if r["error_pct"] is None else f"{r['error_pct']:+.0f}%"
        out.append(f"| {label} | {r['category']} | {r['bad']} → {r['good']} | {r['floor_us']} | {float(b['host_floor']):.2f} "
                   f"| {float(b['no_host']):.2f} | {r['estimated_ms']:.2f} | "
                   f"{'–' if real is None else f'{real:.2f}'} | {err} |")
    return "\n".join(out) + f"\n\nThe realised saving lies between the bounds on {inside} of the {len(rows)} rows.\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heldout", action="store_true", help="only the held-out pairs and the by-class tables")
    ap.add_argument("--json", type=Path, help="also write every row as JSON here")
    args = ap.parse_args()
    dump: dict[str, object] = {}
    held = evaluate_heldout()
    dump["heldout"] = held
    held_part = (f"### Held-out pairs (`heldout_pairs.json`), with the unprofiled step time\n\n{markdown(held)}\n\n"
                 f"By class:\n\n{by_class(held)}\n")
    if args.heldout:
        print(held_part)
        if args.json:
            args.json.write_text(json.dumps(dump, indent=1, default=str))
        return
    parts = []
    bounded: list[tuple[str, dict[str, object]]] = []
    for with_step_ms, title in ((True, "With the unprofiled step time (`--step-ms`, or a `gpuprof record` run)"),
                                (False, "From the bare traces alone")):
        rows = evaluate(with_step_ms)
        bounded += [("step" if with_step_ms else "bare", r) for r in rows if r["bounds"]]
        compared = [r for r in rows if r["error_pct"] is not None]
        ok = sum(abs(float(r["error_pct"])) <= 35 for r in compared)  # type: ignore[arg-type]
        ok20 = sum(abs(float(r["error_pct"])) <= 20 for r in compared)  # type: ignore[arg-type]
        noisy = sum(abs(float(r["error_pct"])) <= 20  # type: ignore[arg-type]
                    or abs(float(r["estimated_ms"]) - float(r["realised_ms"])) <= float(r["noise_ms"])  # type: ignore[arg-type]
                    for r in compared)
        parts.append(f"### {title}\n\n{markdown(rows)}\n\nWithin ±35 %: {ok} of {len(compared)} pairs; "
                     f"within ±20 %: {ok20}; within ±20 % or the pair's own timing noise: {noisy}.\n")
        if with_step_ms:
            dump["tuned"] = rows
            parts.append(f"By class:\n\n{by_class(rows)}\n")
    parts.append(held_part)
    parts.append(f"All pairs with a comparable realised saving, tuned and held-out together:\n\n"
                 f"{by_class(list(dump['tuned']) + held)}\n")  # type: ignore[call-overload]
    rows = evaluate_depth()
    compared = [r for r in rows if r["error_pct"] is not None]
    ok = sum(abs(float(r["error_pct"])) <= 20 for r in compared)  # type: ignore[arg-type]
    parts.append(f"### Issue #12 depth pairs (`depth_pairs.json`), with the unprofiled step time\n\n{markdown(rows)}\n\n"
                 f"Within ±20 %: {ok} of {len(compared)} pairs.\n")
    parts.append(f"### Priced between the host floor and no host\n\n{bounds_markdown(bounded)}")
    print("\n".join(parts))
    if args.json:
        args.json.write_text(json.dumps(dump, indent=1, default=str))


if __name__ == "__main__":
    main()
