"""The JSON report: the document as it is, strict JSON (no NaN), UTF-8.

A non-finite number (a NaN or inf that reached the document from damaged input) is written as
``null``, "not known": strict JSON has no other spelling for it, and failing the whole report over
one number would lose the rest.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def render_json(doc: dict[str, Any], indent: int | None = 1) -> str:
    return json.dumps(_finite(doc), indent=indent, allow_nan=False, ensure_ascii=False) + "\n"
