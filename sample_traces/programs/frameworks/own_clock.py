"""The programs' own steady-state clock, to set beside ``gpuprof record``'s ``unprofiled_step_ms``.

Each program calls :meth:`OwnClock.step_done` at the end of every optimizer step (its own count,
1-based). Over steps ``first..last`` it records one CUDA event at each step end on the current
stream (the GPU timeline, as the recorder times it; on CPU, the host clock), synchronises only
when the program ends, and prints one machine-readable line::

    OWN_CLOCK {"program": ..., "step_ms": ..., "steps": [first, last], "per_step_ms": [...], ...}

and writes the same object to ``--timing-out``. ``step_ms`` is the mean over steps first+1..last
(the time between the ends of steps first and last, divided by their number).

Defaults (GPU): 260 optimizer steps, the clock over steps 60-100: past warm-up and past a
DataLoader's prefetched queue (4 workers x 2 batches drain within ~20-40 steps when the workers
are the bottleneck), and early enough that the recorder's profiled steps (after its timing window)
rarely fall in it in a recorded run. ``--tiny`` (with ``--device cpu``) is a dry run: small
sizes, 30 steps, the clock over steps 10-25.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch


def add_args(p: argparse.ArgumentParser, steps: int = 260, clock: str = "60,100") -> None:
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="a dry run: small sizes, few steps (for --device cpu)")
    p.add_argument("--steps", type=int, default=None, help=f"optimizer steps (default {steps}; --tiny 30)")
    p.add_argument("--clock-steps", default=None, help=f"FIRST,LAST optimizer steps of the own clock "
                                                       f"(default {clock}; --tiny 10,25)")
    p.add_argument("--timing-out", help="JSON file for the own clock")
    p.set_defaults(_steps=steps, _clock=clock)


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    if args.steps is None:
        args.steps = 30 if args.tiny else args._steps
    if args.clock_steps is None:
        args.clock_steps = "10,25" if args.tiny else args._clock
    args.first, args.last = (int(x) for x in args.clock_steps.split(","))
    if not 1 <= args.first < args.last <= args.steps:
        sys.exit(f"--clock-steps {args.clock_steps}: need 1 <= FIRST < LAST <= --steps {args.steps}")
    return args


class OwnClock:
    def __init__(self, name: str, args: argparse.Namespace, **extra: Any) -> None:
        self.name, self.args, self.extra = name, args, extra
        self.cuda = args.device == "cuda"
        self.marks: list[Any] = []
        self.steps = 0
        self.t0 = time.perf_counter()

    def step_done(self, step: int | None = None) -> None:
        """The end of optimizer step ``step`` (default: the next one)."""
        self.steps = step if step is not None else self.steps + 1
        if self.args.first <= self.steps <= self.args.last and len(self.marks) == self.steps - self.args.first:
            if self.cuda:
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                self.marks.append(ev)
            else:
                self.marks.append(time.perf_counter())

    def report(self, **extra: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {"program": self.name, "device": self.args.device, "tiny": self.args.tiny,
                               "optimizer_steps": self.steps, "steps": [self.args.first, self.args.last],
                               "wall_s": round(time.perf_counter() - self.t0, 2), **self.extra, **extra}
        if len(self.marks) == self.args.last - self.args.first + 1:
            if self.cuda:
                self.marks[-1].synchronize()
                per = [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
            else:
                per = [(b - a) * 1000.0 for a, b in zip(self.marks, self.marks[1:])]
            doc.update(step_ms=sum(per) / len(per), median_ms=statistics.median(per),
                       stddev_ms=statistics.stdev(per) if len(per) > 1 else 0.0,
                       per_step_ms=[round(x, 4) for x in per])
        else:
            doc.update(step_ms=None, why=f"the program made {self.steps} optimizer steps, fewer than {self.args.last}")
        print("OWN_CLOCK " + json.dumps({k: v for k, v in doc.items() if k != "per_step_ms"}), flush=True)
        if self.args.timing_out:
            with open(self.args.timing_out, "w") as f:
                json.dump(doc, f, indent=1)
        return doc
