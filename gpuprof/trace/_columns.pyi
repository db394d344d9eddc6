# The C scanner of gpuprof/trace/_columns.c (see gpuprof.trace.columnar).
from typing import Any

NUMERIC: tuple[str, ...]
BIT_GRID: int
BIT_BLOCK: int

def scan(buffer: bytes, start: int, stop: int, /) -> dict[str, Any] | None: ...
