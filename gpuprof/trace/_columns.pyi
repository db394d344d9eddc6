# The C scanner of gpuprof/trace/_columns.c (see gpuprof.trace.columnar).
from typing import Any

NUMERIC: tuple[str, ...]
BIT_GRID: int
BIT_BLOCK: int

def scan(document: bytes, /) -> dict[str, Any] | None: ...
