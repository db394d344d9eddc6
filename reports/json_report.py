"""The JSON report: the document as it is, strict JSON (no NaN), UTF-8."""

from __future__ import annotations

import json
from typing import Any


def render_json(doc: dict[str, Any], indent: int | None = 1) -> str:
    return json.dumps(doc, indent=indent, allow_nan=False, ensure_ascii=False) + "\n"
