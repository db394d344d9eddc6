"""Digests of what a report shows, per trace or run folder: checks a speed change leaves every output as it was.

For each input: the JSON report, the terminal summary at 80 and 200 columns, the whole HTML page,
the views it draws (:meth:`gpuprof.api.Analysis.views_detail`: timeline, operators, memory), the
claims frame (:func:`gpuprof.views.claims`) and the annotated trace data, each hashed apart,
analysed without any cache (``cache=False``). Two versions of gpuprof that give equal digests give
equal reports. ``--workers N`` analyses several-rank inputs with N local processes (1: in this
process); the annotated data comes from the ``keep_traces`` path ``gpuprof annotate`` takes.

    python -m benchmarks.report_digest sample_traces/h200 --out before.json
    (change gpuprof)
    python -m benchmarks.report_digest sample_traces/h200 --compare before.json

A folder is analysed as one input when it is a run folder (``manifest.json``) or holds rank
traces (``rank*.json*``) and no subfolder; otherwise each trace file and such folder under it is one input.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any


def _h(text: str) -> str:
    """A hash of ``text`` with the checkout's own folder written as ``<cwd>``, so that two
    checkouts of the same code (before and after a change) digest alike."""
    return hashlib.blake2b(text.replace(str(Path.cwd().resolve()), "<cwd>").encode(), digest_size=16).hexdigest()


def _frame_text(v: Any) -> str:
    """A frame in full (its ``repr`` elides rows), anything else as its ``repr``."""
    return str(v.to_csv()) if hasattr(v, "to_csv") else repr(v)


def digest(path: Path, workers: int | None = None) -> dict[str, str]:
    """Each output's hash; an output that fails is recorded as its error (a crash too: a digest
    must run through every input, and a crash that moves is a difference)."""
    from gpuprof.api import analyze
    from gpuprof.errors import GpuprofError
    from gpuprof.views import annotation_data, claims

    try:
        a = analyze(path, cache=False, workers=workers)
    except GpuprofError as e:
        return {"error": str(e)}
    except Exception as e:  # noqa: BLE001 - a crash is recorded like any output
        return {"error": f"crash: {type(e).__name__}: {e}"}
    out: dict[str, str] = {}

    def put(key: str, make: Any) -> None:
        try:
            out[key] = _h(make())
        except Exception as e:  # noqa: BLE001 - recorded, compared like any output
            out[key] = f"error: {type(e).__name__}: {e}"

    put("json", a.to_json)
    put("text80", lambda: a.to_text(width=80))
    put("text200", lambda: a.to_text(width=200))
    put("html", a.to_html)
    try:
        detail = a.views_detail()
        for k, v in detail.items():
            out[k] = _h(json.dumps(v, sort_keys=True, default=repr))
    except Exception as e:  # noqa: BLE001
        out["views"] = f"error: {type(e).__name__}: {e}"
    put("claims", lambda: claims(a, a.ranks).to_csv())

    def annotated() -> str:
        kept = analyze(path, cache=False, keep_traces=True)
        return json.dumps(annotation_data(kept, kept.ranks), sort_keys=True, default=_frame_text)

    put("annotate", annotated)
    return out


def inputs(roots: list[str]) -> list[Path]:
    found: list[Path] = []

    def walk(d: Path) -> None:
        subdirs = [p for p in sorted(d.iterdir()) if p.is_dir()]
        if (d / "manifest.json").exists() or (any(d.glob("rank*.json*")) and not subdirs):
            found.append(d)
            return
        for p in sorted(d.iterdir()):
            if p.is_file() and p.name.endswith((".json", ".json.gz")) and p.name.endswith(".gz"):
                found.append(p)
        for p in subdirs:
            walk(p)

    for r in map(Path, roots):
        if r.is_file():
            found.append(r)
        else:
            walk(r)
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("roots", nargs="+")
    p.add_argument("--out")
    p.add_argument("--compare")
    p.add_argument("--workers", type=int, help="local processes for several-rank inputs (1: this process)")
    a = p.parse_args()
    got: dict[str, Any] = {}
    for i in inputs(a.roots):
        got[str(i)] = digest(i, a.workers)
        print(f"{i}: {'error' if 'error' in got[str(i)] else 'ok'}", file=sys.stderr, flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(got, indent=1, sort_keys=True))
    if a.compare:
        before = json.loads(Path(a.compare).read_text())
        bad = [k for k in got if got[k] != before.get(k)]
        for k in bad:
            diff = sorted(x for x in set(got[k]) | set(before.get(k, {})) if got[k].get(x) != before.get(k, {}).get(x))
            print(f"{k}: differs in {', '.join(diff)}")
        print(f"{len(got)} inputs compared, {len(bad)} differ")
        sys.exit(1 if bad else 0)
    print(f"{len(got)} inputs digested")


if __name__ == "__main__":
    main()
