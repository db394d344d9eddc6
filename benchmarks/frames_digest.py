"""A digest of every frame the loader builds, per trace: checks a loader change is byte-for-byte neutral.

For each trace, every frame of :class:`gpuprof.trace.model.RankTrace` (kernels, memcpys, ops,
runtime, annotations, steps, collectives, python, memory) is hashed column by column: the column
names and order, each dtype, the raw bytes of numeric columns (NaN bit patterns included), the
categories in order and the codes of categoricals, the values of object columns (their ``repr``,
type included), and the index; plus the trace's metadata. Two loaders that give equal digests
built equal frames.

    python -m benchmarks.frames_digest sample_traces/h200 ../shared/traces/public --out before.json
    (change the loader)
    python -m benchmarks.frames_digest sample_traces/h200 ../shared/traces/public --compare before.json

Directories are searched for ``*.json`` / ``*.json.gz`` traces (run folders' manifests and other
JSON files that are not traces are skipped: a file the loader refuses is recorded as its error,
which must also stay the same).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

FRAMES = ("kernels", "memcpys", "ops", "runtime", "annotations", "steps", "collectives", "python", "memory")


def _column_digest(h: Any, s: pd.Series) -> None:
    h.update(f"{s.name}|{s.dtype}|".encode())
    if isinstance(s.dtype, pd.CategoricalDtype):
        h.update(repr(list(s.cat.categories)).encode())
        h.update(s.cat.codes.to_numpy().tobytes())
    elif s.dtype == object or not isinstance(s.dtype, np.dtype):
        h.update(repr([(type(v).__name__, v) for v in s.tolist()]).encode())
    else:
        h.update(np.ascontiguousarray(s.to_numpy()).tobytes())


def frame_digest(df: pd.DataFrame) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(list(df.columns)).encode())
    h.update(repr(df.index).encode())
    for c in df.columns:
        _column_digest(h, df[c])
    return h.hexdigest()


def trace_digest(path: Path) -> dict[str, str]:
    from gpuprof.errors import TraceError
    from gpuprof.trace.load import load_trace

    try:
        t = load_trace(path)
    except TraceError as e:
        return {"error": str(e)}
    out = {f: frame_digest(getattr(t, f)) for f in FRAMES}
    out["meta"] = hashlib.blake2b(repr(dataclasses.asdict(t.meta)).encode(), digest_size=16).hexdigest()
    return out


def traces(roots: list[str]) -> list[Path]:
    found: list[Path] = []
    for r in map(Path, roots):
        if r.is_file():
            found.append(r)
            continue
        found.extend(p for p in sorted(r.rglob("*")) if p.is_file() and p.name.endswith((".json", ".json.gz"))
                     and not p.name.startswith(("manifest", "MANIFEST")) and "pairs" not in p.name)
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("roots", nargs="+", help="trace files or folders")
    p.add_argument("--out", help="write the digests here (JSON)")
    p.add_argument("--compare", help="compare with digests written earlier; exit 1 on any difference")
    a = p.parse_args()
    digests = {str(t): trace_digest(t) for t in traces(a.roots)}
    if a.out:
        Path(a.out).write_text(json.dumps(digests, indent=1, sort_keys=True))
    if a.compare:
        before = json.loads(Path(a.compare).read_text())
        bad = 0
        for t, d in digests.items():
            if t not in before:
                print(f"{t}: not in {a.compare}")
                continue
            diff = [k for k in sorted(set(d) | set(before[t])) if d.get(k) != before[t].get(k)]
            if diff:
                bad += 1
                print(f"{t}: differs in {', '.join(diff)}")
        missing = sorted(set(before) - set(digests))
        for t in missing:
            print(f"{t}: in {a.compare} but not found now")
        print(f"{len(digests)} traces compared, {bad} differ, {len(missing)} missing")
        sys.exit(1 if bad or missing else 0)
    print(f"{len(digests)} traces digested")


if __name__ == "__main__":
    main()
