# The replay's rounds in C, gpuprof/replay/native/_solve.c (see gpuprof.replay.simulate._in_order).
from typing import Any

def in_order(hv: Any, av: Any, h_bounds: Any, a_bounds: Any, acc_h: Any, acc_a: Any, const_h: Any, const_a: Any,
             src_h: Any, w_h: Any, from_h: Any, src_a: Any, w_a: Any, from_a: Any, /) -> int: ...
