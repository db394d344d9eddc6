"""The bad/good sample-trace pairs (sample_traces/h200/pairs.json) and their unprofiled timings.

Shared by benchmarks/estimate_accuracy.py and tests/test_analyzers.py.
"""

from __future__ import annotations

import json
from pathlib import Path

H200 = Path(__file__).resolve().parents[1] / "sample_traces" / "h200"


def pairs() -> list[tuple[str, str, str, bool]]:
    """(category, bad, good, realised saving measured) for every pair."""
    doc = json.loads((H200 / "pairs.json").read_text())
    return [(p["category"], p["bad"], p["good"], bool(p["realised_saving"])) for p in doc["pairs"]]


#: Where the held-out pairs' traces and timings are kept (issue #24: recorded for checking the
#: estimates, never for tuning them), apart so that the tests that walk every sample do not.
HELD_OUT = H200 / "heldout"
#: Held-out pairs recorded on a lent H100 when no H200 came (round 6): both members of a pair on
#: one GPU in one device call, so the pair is as good a check; kept under the GPU's own name.
HELD_OUT_H100 = H200.parent / "h100" / "heldout"
HELD_OUT_DIRS = (HELD_OUT, HELD_OUT_H100)


def home(name: str) -> Path:
    """The folder holding a pair member's trace (and its ``timings/``)."""
    for d in HELD_OUT_DIRS:
        if ((d / f"{name}.json.gz").is_file() or (d / name / "manifest.json").is_file()
                or (d / "timings" / f"{name}.json").is_file()):  # a member timed, not recorded
            return d
    return H200


def input_wait_ms(name: str) -> float | None:
    """A member kept as a `gpuprof record` run folder: its recorded DataLoader waits per unprofiled
    step (``unprofiled_input_wait_ms``), given with the plain processes' step time as a user gives
    both (``--step-ms``, ``--input-wait-ms``); None for a trace file."""
    from gpuprof.steptime import recorded_input_wait

    m = home(name) / name / "manifest.json"
    return recorded_input_wait(None, json.loads(m.read_text())) if m.is_file() else None


def trace_path(name: str) -> Path:
    """A pair member's trace: a folder of rank traces, or one file."""
    h = home(name)
    return h / name if (h / name).is_dir() else h / f"{name}.json.gz"


def step_ms(name: str) -> float:
    """The member's step time measured without the profiler (rank 0 for folders)."""
    f = home(name) / "timings" / (f"{name}_rank0.json" if (H200 / name).is_dir() else f"{name}.json")
    return float(json.loads(f.read_text())["step_ms"])


def step_noise_ms(name: str) -> float:
    """How well the member's unprofiled step time is known (ms). Host-bound programs on the lent
    machine spread 12-35 % within one session (sample_traces/README.md), so a realised saving is
    only known to within the sum of its two members' noise. For a program timed in many processes
    interleaved with its twins (``record_interleaved.sh``: ``step_ms_sem``, the standard error of the
    mean over processes) it is twice that error (about 95 %); for one timed in one or two
    processes, half the range of its timed windows (how far its step time moved between repeats)."""
    f = home(name) / "timings" / (f"{name}_rank0.json" if (H200 / name).is_dir() else f"{name}.json")
    doc = json.loads(f.read_text())
    if "step_ms_sem" in doc:
        return 2.0 * float(doc["step_ms_sem"])
    runs = [float(x) for x in doc.get("step_ms_runs") or []]
    return (max(runs) - min(runs)) / 2.0 if len(runs) > 1 else 0.0


def realised_noise_ms(bad: str, good: str) -> float:
    """The uncertainty of a pair's realised saving: the two members' timing noise added."""
    return step_noise_ms(bad) + step_noise_ms(good)


def tokens(name: str) -> float | None:
    """New tokens per step of a decode sample (timings' ``new_tokens``), None for other samples."""
    f = home(name) / "timings" / f"{name}.json"
    v = json.loads(f.read_text()).get("new_tokens") if f.is_file() else None
    return float(v) if v else None


def realised_ms(bad: str, good: str) -> float:
    """The bad step's time less the fixed program's time for the same work: for decode samples
    that make different numbers of tokens per step, the good one's time per token × the bad's tokens."""
    tb, tg = tokens(bad), tokens(good)
    scale = tb / tg if tb and tg else 1.0
    return step_ms(bad) - step_ms(good) * scale


def heldout_pairs() -> list[tuple[str, str, str, str]]:
    """(class, expected category, bad, good) of sample_traces/h200/heldout_pairs.json (issue #24):
    recorded to check the estimates, never to tune them."""
    doc = json.loads((H200 / "heldout_pairs.json").read_text())
    return [(p["class"], p["expect"], p["bad"], p["good"]) for p in doc["pairs"]]


def also(bad: str, good: str) -> tuple[str, ...]:
    """The finding categories whose fix the pair's good member applies besides the expected one
    (a pair's ``also`` in pairs.json, depth_pairs.json or heldout_pairs.json): vision_workers and
    the 12-worker loaders also pin memory and copy ``non_blocking``, the bf16 CNN twins are
    channels-last too. Empty for a pair that changes one thing."""
    for f in ("pairs.json", "depth_pairs.json", "heldout_pairs.json"):
        for p in json.loads((H200 / f).read_text())["pairs"]:
            if p.get("bad") == bad and p.get("good") == good and p.get("also"):
                return tuple(str(c) for c in p["also"])
    return ()


def family(name: str) -> str:
    """The model family a pair member belongs to (held-out programs: heldout_pairs.json's
    ``family``; tuned samples: the program the name starts with)."""
    doc = json.loads((H200 / "heldout_pairs.json").read_text())
    if name in doc["programs"]:
        return str(doc["programs"][name]["family"])
    for prefix, fam in (("gpt_", "gpt.py GPT"), ("two_", "gpt.py GPT"), ("ddp_", "gpt.py GPT"), ("tiny_", "gpt.py GPT"),
                        ("decode_", "gpt.py GPT"), ("llama_", "HF Llama"), ("resnet50_", "torchvision ResNet-50"),
                        ("convnext_", "torchvision ConvNeXt-T"), ("vision_", "vision.py CNN"),
                        ("mlp_", "mlp.py MLP"), ("bert_", "HF BERT")):
        if name.startswith(prefix):
            return fam
    return name


def depth_pairs(expect: tuple[str, ...] | None = None) -> list[tuple[str, str, str, str]]:
    """(class, expected category, bad, good) of sample_traces/h200/depth_pairs.json's pairs with an
    expected category and a good twin (only those expecting one of ``expect``, when given)."""
    doc = json.loads((H200 / "depth_pairs.json").read_text())
    return [(p["class"], p["expect"], p["bad"], p["good"]) for p in doc["pairs"]
            if p["expect"] and p["good"] and (expect is None or p["expect"] in expect)]
