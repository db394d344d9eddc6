"""The corpus table: gpuprof on every real public trace in ``../shared/traces/public``.

For each trace (MANIFEST.json order): its GPU (the spec gpuprof resolved, else the trace's own
name), the torch version its source states (else the range its format implies), gpuprof's top
finding (category and % of the step), what the source documents about it (MANIFEST
``known_bottleneck``) and whether gpuprof names that first, with why. Only three kinds of
documented fact are judged, each by the rule that checks it (``CHECKS``): a DataLoader-bound run
(input pipeline first), its fixed twin (input pipeline not raised at 5 % or more), allocator
churn (allocator_churn first), a GPU-only trace (it reports and says why the host analyzers
were skipped) and the tutorial transformer whose README names its GPU idling first (launch
overhead first; the other two facts are reported where they rank). A trace whose source
documents no bottleneck says "no documented bottleneck".

    python -m benchmarks.corpus_table            # writes docs/corpus.md
    python -m benchmarks.corpus_table --print    # prints the table only
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ROOT / ".." / "shared" / "traces" / "public"
OUT = ROOT / "docs" / "corpus.md"

Row = dict[str, Any]


def _pct(findings: list[Any], category: str) -> float:
    return max((f.estimated_savings_pct for f in findings if f.category == category), default=0.0)


def _top(findings: list[Any]) -> str:
    return findings[0].category if findings else "(none)"


def _dataloader_bound(a: Any) -> tuple[bool, str]:
    f = a.findings
    inp, top = _pct(f, "input_pipeline"), _top(f)
    if top == "input_pipeline":
        return True, f"input_pipeline first ({inp:.1f} %)"
    return False, f"{top} first; input_pipeline {inp:.1f} %"


def _fixed_twin(a: Any) -> tuple[bool, str]:
    inp = _pct(a.findings, "input_pipeline")
    return inp < 5.0, f"input_pipeline {inp:.1f} % ({'not raised' if inp < 5.0 else 'raised'}, threshold 5 %)"


def _allocator(a: Any) -> tuple[bool, str]:
    top = _top(a.findings)
    return top == "allocator_churn", f"{top} first ({_pct(a.findings, top):.1f} %)"


def _gpu_only(a: Any) -> tuple[bool, str]:
    skipped = [s for s in a.skipped if s.get("reason")]
    ok = bool(skipped) and any(s.get("analyzer") == "input_pipeline" for s in skipped)
    return ok, f"reports GPU-side classes; {len(skipped)} host analyzers skipped with the reason"


def _small_transformer(a: Any) -> tuple[bool, str]:
    cats = [f.category for f in a.findings]
    rank = {c: (cats.index(c) + 1 if c in cats else None) for c in ("attention_fusion", "precision")}
    later = ", ".join(f"{c} {'#' + str(r) if r else 'not raised'}" for c, r in rank.items())
    top = _top(a.findings)
    return top == "launch_overhead", f"(1) GPU idle: {top} first; (2)/(3): {later}"


#: Documented fact (a pattern of MANIFEST ``known_bottleneck``) -> the check of gpuprof's findings.
CHECKS: list[tuple[str, Callable[[Any], tuple[bool, str]]]] = [
    (r"DataLoader-bound", _dataloader_bound),
    (r"^fixed twin", _fixed_twin),
    (r"hipFree/hipMalloc", _allocator),
    (r"GPU-only trace", _gpu_only),
    (r"Baby's First Optimization", _small_transformer),
]


def torch_version(entry: dict[str, Any]) -> str:
    """The torch version the source states (``produced_by``), else the range the format implies."""
    m = re.search(r"torch\s*(~?\s*[0-9][0-9.]*)", str(entry.get("produced_by", "")))
    if m:
        return m.group(1).replace(" ", "")
    style = str(entry.get("category_style", ""))
    return "<=1.9 (format)" if "<=1.9" in style else ">=1.10 (format)" if ">=1.10" in style else "?"


def row_of(entry: dict[str, Any]) -> Row:
    import gpuprof

    path = PUBLIC / entry["file"]
    a = gpuprof.analyze(path, cache=False)
    doc = a.to_dict()
    f = a.findings
    gpu = doc["gpu"]["name"] if doc["gpu"].get("name") not in (None, "unknown") else \
        (doc["gpu"].get("device_name") or "unknown (no device info)")
    top = f"{f[0].category} {f[0].estimated_savings_pct:.1f} %" if f else "(no finding)"
    documented = str(entry.get("known_bottleneck") or "")
    check = next((fn for pat, fn in CHECKS if re.search(pat, documented)), None)
    if check is None:
        right, why = None, "no documented bottleneck"
        if any(r.trace.meta.graph_capture_calls for r in a.ranks):
            why += "; the trace records CUDA-graph capture: gpuprof says so and claims no launch saving"
    else:
        right, why = check(a)
    return {"trace": entry["file"], "gpu": gpu, "torch": torch_version(entry), "top": top,
            "documented": documented or "none stated", "right": right, "why": why,
            "findings": [(x.category, round(x.estimated_savings_pct, 1)) for x in f[:4]]}


def rows() -> list[Row]:
    manifest = json.loads((PUBLIC / "MANIFEST.json").read_text())
    return [row_of(e) for e in manifest["entries"]]


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def markdown(rs: list[Row]) -> str:
    judged = [r for r in rs if r["right"] is not None]
    lines = [
        "# gpuprof on the public trace corpus",
        "",
        "Every real trace in `../shared/traces/public` (MANIFEST.json: where each came from), as "
        "`python -m benchmarks.corpus_table` analyses it (no `--step-ms`: none of these sources gives the "
        "unprofiled step time). *Right?* judges only what the source documents "
        f"({sum(bool(r['right']) for r in judged)} of {len(judged)} documented facts named as documented).",
        "",
        "| trace | GPU | torch | top finding | what the source documents | right? | why |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rs:
        verdict = "—" if r["right"] is None else ("yes" if r["right"] else "**no**")
        lines.append("| " + " | ".join(_cell(str(x)) for x in (
            r["trace"], r["gpu"], r["torch"], r["top"], r["documented"], verdict, r["why"])) + " |")
    twins = _twins(rs)
    if twins:
        lines += ["", "## One program on two GPUs", "",
                  "Traces whose names differ only in the GPU prefix (`h100__`, `mi300__`): one program, so where "
                  "the defect is the same the diagnosis should be.", "",
                  "| program | top findings on each GPU | same top? |", "|---|---|---|"]
        for program, by_gpu in twins:
            tops = {g: r["findings"][0][0] if r["findings"] else "(none)" for g, r in by_gpu.items()}
            cells = "; ".join(f"{g}: " + ", ".join(f"{c} {x:.1f} %" for c, x in r["findings"][:3])
                              for g, r in by_gpu.items())
            lines.append(f"| {_cell(program)} | {_cell(cells)} | {'yes' if len(set(tops.values())) == 1 else '**no**'} |")
    return "\n".join(lines) + "\n"


def _twins(rs: list[Row]) -> list[tuple[str, dict[str, Row]]]:
    """Rows grouped by the trace name after its GPU prefix (``tracelens/h100__X`` and
    ``tracelens/mi300__X``), where two or more GPUs ran it."""
    groups: dict[str, dict[str, Row]] = {}
    for r in rs:
        m = re.match(r"(?:.*/)?(h100|h200|mi300|mi210|b200)__(.+)$", r["trace"])
        if m:
            groups.setdefault(m.group(2), {})[m.group(1)] = r
    return sorted((k, dict(sorted(v.items()))) for k, v in groups.items() if len(v) >= 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--print", action="store_true", help="print the table instead of writing docs/corpus.md")
    args = ap.parse_args()
    if not (PUBLIC / "MANIFEST.json").is_file():
        raise SystemExit(f"corpus_table: {PUBLIC} is absent (the shared corpus of public traces)")
    text = markdown(rows())
    if args.print:
        print(text)
    else:
        OUT.write_text(text)
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
