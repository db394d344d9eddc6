"""How far a sample's unprofiled step lies from its trace's host-free replay (issue #24).

For every sample trace with an unprofiled step time (``benchmarks.pairs.step_ms``): the traced
replay's steady step, the host-free replay's (``gpuprof.replay.fixes.host_free``) and the ratio of
the unprofiled step to the host-free one. Where the *traced* step already equals the host-free one
(the host kept up even under the profiler), that ratio can only measure the GPU's own spread between
the profiled process and the timed ones, plus the replay's error: the figure ``HOST_SEEN`` must
cover (docs/accuracy.md, "kv_cache: the slower host is the launch queue's back-pressure").

    python -m benchmarks.gpu_spread [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.pairs import H200, HELD_OUT_DIRS, step_ms
from gpuprof.replay.fixes import host_free
from gpuprof.replay.graph import build
from gpuprof.replay.run import steady_ms
from gpuprof.trace.load import load_trace


def rows() -> list[dict[str, float | str]]:
    out: list[dict[str, float | str]] = []
    for f in sorted([*H200.glob("*.json.gz"), *(p for d in HELD_OUT_DIRS for p in d.glob("*.json.gz"))]):
        name = f.name[:-len(".json.gz")]
        try:
            unprofiled = step_ms(name)
        except (OSError, KeyError, ValueError):
            continue  # no unprofiled timing for this trace
        g = build([load_trace(f)])
        traced, free = steady_ms(g), steady_ms(host_free(g))
        out.append({"trace": name, "unprofiled_ms": unprofiled, "traced_ms": traced, "host_free_ms": free,
                    "traced_over_free": traced / free, "unprofiled_over_free": unprofiled / free})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    got = rows()
    for r in got:
        kept_up = "  host kept up under the profiler" if float(r["traced_over_free"]) <= 1.001 else ""
        print(f"{r['trace']:32s} unprofiled {r['unprofiled_ms']:8.2f}  traced {r['traced_ms']:8.2f}  host-free "
              f"{r['host_free_ms']:8.2f}  unprofiled/free {r['unprofiled_over_free']:.3f}{kept_up}")
    if a.json:
        a.json.write_text(json.dumps(got, indent=1))


if __name__ == "__main__":
    main()
