"""The programs' own steady-state clock, to set beside ``gpuprof record``'s ``unprofiled_step_ms``.

Each program calls :meth:`OwnClock.step_done` at the end of every optimizer step (its own count,
1-based). From step 1 to the last it records one CUDA event at each step end on the
current stream (the GPU timeline, as the recorder times it; on CPU, the host clock) and whether
torch.profiler was running then, synchronises only when the program ends, and prints one
machine-readable line::

    OWN_CLOCK {"program": ..., "step_ms": ..., "steps": [first, last], "per_step_ms": [...], ...}

and writes the same object to ``--timing-out`` (``per_step_ms[i]`` is step ``per_step_from + i``, so
the recorder's window can be set beside the same steps). ``step_ms`` is the mean over every step after
``first`` that the profiler did not touch: a step is left out when the profiler ran at its start
or its end, and so are the :data:`AFTER_PROFILER` steps after the profiler stopped (its trace is
exported then). So in a recorded run the clock is the program's whole unprofiled steady state,
the same quantity the recorder estimates from its own window.

Defaults (GPU): 260 optimizer steps, the clock from step 60 (past warm-up and past a DataLoader's
prefetched queue: 4 workers x 2 batches drain within 20-40 steps when the workers are the
bottleneck) to the end. ``--tiny`` (with ``--device cpu``) is a dry run: small sizes, 30 steps,
the clock from step 10.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch


#: Steps left out of the clock after the profiler stops: its trace is exported during them.
AFTER_PROFILER = 2


def _profiling() -> bool:
    try:
        return bool(torch.autograd.profiler._is_profiler_enabled)  # type: ignore[attr-defined]
    except AttributeError:
        return False


def add_args(p: argparse.ArgumentParser, steps: int = 260, clock: str = "60,end") -> None:
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="a dry run: small sizes, few steps (for --device cpu)")
    p.add_argument("--steps", type=int, default=None, help=f"optimizer steps (default {steps}; --tiny 30)")
    p.add_argument("--clock-steps", default=None, help=f"FIRST,LAST optimizer steps of the own clock "
                                                       f"(default {clock}; --tiny 10,end)")
    p.add_argument("--timing-out", help="JSON file for the own clock")
    p.set_defaults(_steps=steps, _clock=clock)


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    if args.steps is None:
        args.steps = 30 if args.tiny else args._steps
    if args.clock_steps is None:
        args.clock_steps = "10,end" if args.tiny else args._clock
    first, last = args.clock_steps.split(",")
    args.first, args.last = int(first), args.steps if last == "end" else int(last)
    if not 1 <= args.first < args.last <= args.steps:
        sys.exit(f"--clock-steps {args.clock_steps}: need 1 <= FIRST < LAST <= --steps {args.steps}")
    return args


class OwnClock:
    def __init__(self, name: str, args: argparse.Namespace, **extra: Any) -> None:
        self.name, self.args, self.extra = name, args, extra
        self.cuda = args.device == "cuda"
        self.marks: list[Any] = []
        self.profiled: list[bool] = []
        self.steps = 0
        self.t0 = time.perf_counter()

    def step_done(self, step: int | None = None) -> None:
        """The end of optimizer step ``step`` (default: the next one)."""
        self.steps = step if step is not None else self.steps + 1
        if self.steps <= self.args.last and len(self.marks) == self.steps - 1:  # every step from the first
            if self.cuda:
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                self.marks.append(ev)
            else:
                self.marks.append(time.perf_counter())
            self.profiled.append(_profiling())

    def report(self, **extra: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {"program": self.name, "device": self.args.device, "tiny": self.args.tiny,
                               "optimizer_steps": self.steps, "steps": [self.args.first, self.args.last],
                               "wall_s": round(time.perf_counter() - self.t0, 2), **self.extra, **extra}
        if len(self.marks) == self.args.last:
            if self.cuda:
                self.marks[-1].synchronize()
                every = [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
            else:
                every = [(b - a) * 1000.0 for a, b in zip(self.marks, self.marks[1:])]
            touched = [False] * len(every)  # interval i: from the end of step 1+i to that of step 2+i
            for i in range(len(every)):
                near = self.profiled[max(i + 1 - AFTER_PROFILER, 0):i + 2]
                touched[i] = any(near)
            # the clock: the intervals ending at steps first+1..last that the profiler did not touch
            per = [x for i, (x, t) in enumerate(zip(every, touched)) if not t and i + 2 > self.args.first]
            doc.update(step_ms=sum(per) / len(per) if per else None,
                       median_ms=statistics.median(per) if per else None,
                       stddev_ms=statistics.stdev(per) if len(per) > 1 else 0.0,
                       steps_clocked=len(per), steps_profiled_left_out=sum(touched),
                       per_step_from=2, per_step_ms=[round(x, 4) for x in every], profiled=[bool(t) for t in touched])
        else:
            doc.update(step_ms=None, why=f"the program made {self.steps} optimizer steps, fewer than {self.args.last}")
        print("OWN_CLOCK " + json.dumps({k: v for k, v in doc.items() if k != "per_step_ms"}), flush=True)
        if self.args.timing_out:
            with open(self.args.timing_out, "w") as f:
                json.dump(doc, f, indent=1)
        return doc
