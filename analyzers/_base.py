"""Helpers every analyzer shares: the evidence rows (heaviest kernel names, shapes parsed once per
distinct value), the confidence of a GPU-side saving, and the note bare traces carry.

The rank's view the analyzers read is :class:`gpuprof.rank.RankView`; the idle gaps are
:mod:`gpuprof.idle`; what a finding claims, and how findings share it, is :mod:`gpuprof.claims`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.rank import RankView

HOST_NOTE = ("host gaps are deflated by the profiler's cost per event estimated from the trace's own op brackets, "
             "a floor that takes out less than the profiler added; torch.profiler slows the host, so pass --step-ms "
             "with the step time measured without the profiler to scale this estimate")


def ms(us: float) -> float:
    return us / 1000.0


def shape_codes(ops: pd.DataFrame, rows: np.ndarray | pd.Series | Iterable[int], fn: Any, by_name: bool = False
                ) -> tuple[np.ndarray, list[Any]]:
    """For each op row in ``rows`` (repeats allowed; negative: no op), the code of its distinct
    recorded input dims (with the op name, with ``by_name``) and ``fn(dims)`` (``fn(name, dims)``)
    of each distinct value; code -1 for no op. ``fn`` runs once per distinct value, the rest is
    whole-column work: a step repeats the same shapes thousands of times."""
    from gpuprof.trace.load import parse_arg

    r = np.asarray(rows if isinstance(rows, (np.ndarray, pd.Index, pd.Series)) else list(rows), dtype=np.int64)
    ok = (r >= 0) & (r < len(ops))
    sub = r[ok]
    values = ops["input_dims"].to_numpy()[sub]
    vcodes, uniq = pd.factorize(values, use_na_sentinel=False)
    key = vcodes.astype(np.int64)
    names = ops["name"].to_numpy()[sub] if by_name else None
    if names is not None:
        ncodes, _ = pd.factorize(names, use_na_sentinel=False)
        key = ncodes.astype(np.int64) * max(len(uniq), 1) + key
    codes, _ = pd.factorize(key)
    _, first = np.unique(codes, return_index=True)  # the first row holding each distinct value
    results = []
    for i in first:  # once per distinct value; the row's own value (factorize turns None into NaN)
        dims = parse_arg(values[i])
        results.append(fn(str(names[i]), dims) if names is not None else fn(dims))
    out = np.full(len(r), -1, dtype=np.int64)
    out[ok] = codes
    return out, results


def per_shape(ops: pd.DataFrame, rows: Iterable[int], fn: Any, by_name: bool = False) -> pd.Series:
    """``fn(input dims)`` (or ``fn(op name, input dims)`` with ``by_name``) of the given op rows,
    indexed by op row (each row once), computed once per distinct recorded value."""
    r = np.unique(np.asarray(rows if isinstance(rows, (np.ndarray, pd.Index, pd.Series)) else list(rows),
                             dtype=np.int64))
    r = r[(r >= 0) & (r < len(ops))]
    codes, results = shape_codes(ops, r, fn, by_name)
    table = np.empty(len(results), dtype=object)
    for i, x in enumerate(results):  # (a slice assignment would unpack tuples)
        table[i] = x
    return pd.Series(table[codes], index=r, dtype=object)


def top_names(k: pd.DataFrame, n: int = 5, by: str = "dur") -> list[dict[str, Any]]:
    """The heaviest kernel names in ``k``: name, count, total µs (evidence rows)."""
    names = k["name"].astype("category")
    codes = names.cat.codes.to_numpy()
    # grouped by category code, not by the names as text (a conversion per row): the same groups,
    # then ordered by name as a groupby on the text orders them, so ties keep their order
    g = k[by].groupby(codes).agg(["size", "sum"])
    g = g[g.index >= 0]
    g.index = names.cat.categories.astype(str)[g.index.to_numpy()]
    g = g.sort_index().sort_values("sum", ascending=False).head(n)
    return [{"kernel": name, "count": int(row["size"]), "total_us": round(float(row["sum"]), 1)} for name, row in g.iterrows()]


def gpu_side_confidence(v: RankView, saved_us_per_step: float) -> tuple[str, float]:
    """Confidence of a saving made by faster GPU work, and the GPU's idle ms per step: a faster
    GPU shortens the step only where the GPU is the bottleneck, so when the GPU already idles
    (host-bound) for longer than the saving, the step may not shorten ("medium")."""
    idle = float(v.gaps["real_dur"].sum()) / v.n_steps if len(v.gaps) else 0.0
    return ("medium" if idle > saved_us_per_step else "high"), round(ms(idle), 3)
