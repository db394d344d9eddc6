# The replay's rounds in C, gpuprof/replay/native/_solve.c (see gpuprof.replay.simulate._in_order).
from typing import Any

def in_order(hv: Any, av: Any, h_bounds: Any, a_bounds: Any, h_gap: Any, h_dur: Any, h_ts: Any, h_bp: Any, h_bpw: Any,
             h_wait: Any, h_tail: Any, a_sgap: Any, a_dur: Any, a_ts: Any, a_launch: Any, a_lat: Any, a_dep: Any,
             a_depw: Any, a_first: Any, /) -> int: ...

def passes(mode: int, hs: Any, he: Any, as_: Any, ae: Any, h_ranges: Any, a_ranges: Any, h_gap: Any, h_dur: Any,
           h_ts: Any, h_first: Any, h_bp: Any, h_bpw: Any, h_wait: Any, h_tail: Any, a_sgap: Any, a_dur: Any, a_ts: Any,
           a_first: Any, a_launch: Any, a_lat: Any, a_dep: Any, a_depw: Any, a_coll: Any, coll_members: Any,
           coll_bounds: Any, coll_ids: Any, n_coll: int, settled: float, max_passes: int, /) -> int: ...
