"""The ``gpuprof record`` parent: run the program, sample NVML, write the run folder.

The program runs unchanged as a child process (no shell), with the bootstrap directory and
gpuprof's own location prepended to PYTHONPATH. SIGINT and SIGTERM are passed on to it; whatever
happens, the manifest is written and gpuprof exits with the program's exit code (128 + N when a
signal N ended it). An existing non-empty ``--out`` is refused: a run is never overwritten.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprof.errors import UsageError
from gpuprof.record import manifest
from gpuprof.record.nvml import Sampler, load_nvml

BOOT = Path(__file__).resolve().parent / "_boot"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Options:
    out: Path | None = None
    skip: int = 5
    timed: int = 10
    wait: int = 1
    warmup: int = 2
    active: int = 3
    repeat: int = 1
    nvml_hz: float = 20.0
    nvml: bool = True
    gpm: bool = True
    nvml_counters: bool = True
    with_stack: bool = False
    record_shapes: bool = True


def new_run_dir(out: Path | None, base: Path = Path("gpuprof_runs")) -> Path:
    """Create the run folder: ``out`` if new or empty, else a fresh time-stamped one under ``base``."""
    if out is not None:
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise UsageError("exists and is not empty; gpuprof never writes over a run (choose a new --out)", str(out))
        out.mkdir(parents=True, exist_ok=True)
        return out
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in range(1000):
        d = base / (stamp if i == 0 else f"{stamp}-{i}")
        try:
            d.mkdir(parents=True)
            return d
        except FileExistsError:
            continue
    raise UsageError("could not create a new run folder", str(base))


def _gpus(nv: Any) -> list[dict[str, Any]]:
    out = []
    try:
        driver = nv.nvmlSystemGetDriverVersion()
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            out.append({"index": i, "name": nv.nvmlDeviceGetName(h), "uuid": nv.nvmlDeviceGetUUID(h), "driver": driver})
    except Exception as e:
        out.append({"error": str(e)})
    return out


def _visible(env: dict[str, str]) -> list[int] | None:
    v = env.get("CUDA_VISIBLE_DEVICES")
    if v is None or v.strip() == "":
        return None
    try:
        return [int(x) for x in v.split(",") if x.strip()]
    except ValueError:
        return None  # UUIDs or MIG names: sample every GPU


def record(cmd: list[str], opts: Options) -> int:
    """Run ``cmd`` under the recorder; return its exit code (the run folder is always written)."""
    if not cmd:
        raise UsageError("no command to record: gpuprof record [OPTIONS] -- CMD ARGS...")
    run_dir = new_run_dir(opts.out).resolve()
    (run_dir / "traces").mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(BOOT), str(PACKAGE_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(GPUPROF_RUN_DIR=str(run_dir), GPUPROF_RECORD_SHAPES="1" if opts.record_shapes else "0",
               GPUPROF_WITH_STACK="1" if opts.with_stack else "0",
               GPUPROF_SCHEDULE=",".join(str(x) for x in (opts.skip, opts.timed, opts.wait, opts.warmup,
                                                             opts.active, opts.repeat)))
    base: dict[str, Any] = {
        "command": cmd, "cwd": os.getcwd(), "host": platform.node(), "start_ns": time.time_ns(),
        "profiler": {"skip_steps": opts.skip, "timed_steps": opts.timed,
                     "schedule": {"wait": opts.wait, "warmup": opts.warmup, "active": opts.active, "repeat": opts.repeat},
                     "record_shapes": opts.record_shapes, "with_stack": opts.with_stack},
        "failures": [],
    }
    sampler: Sampler | None = None
    nvml_info: dict[str, Any] = {"enabled": opts.nvml}
    if opts.nvml:
        try:
            nv = load_nvml()
            base["gpus"] = _gpus(nv)
            sampler = Sampler(run_dir / "nvml.csv", opts.nvml_hz, nv, _visible(env), gpm=opts.gpm,
                              fields=opts.nvml_counters)
            sampler.start()
            nvml_info.update(path="nvml.csv", hz=opts.nvml_hz, devices=sampler.devices)
        except Exception as e:
            nvml_info["error"] = f"NVML unavailable ({e.__class__.__name__}: {e}); recorded without GPU samples"
            print(f"gpuprof: {nvml_info['error']}", file=sys.stderr)
    code, sig = _run(cmd, env, base)
    base["end_ns"] = time.time_ns()
    if sampler is not None:
        sampler.stop()
        steady = (round(100 * sampler.steady_cpu_seconds / sampler.steady_seconds, 3)
                  if sampler.steady_seconds > 0 else None)
        nvml_info.update(samples=sampler.samples, unavailable=sampler.off, read_periods_s=sampler.periods_s,
                         sampler_cpu_pct_after_first_second=steady,
                         read_cost_us={g: round(v, 1) for g, v in sampler.group_us.items()},
                         sampler_cpu_pct_of_one_core=round(100 * sampler.cpu_seconds /
                                                           max((base["end_ns"] - base["start_ns"]) / 1e9, 1e-9), 3))
    base.update(exit_code=code, signal=sig, nvml=nvml_info)
    doc = manifest.build(run_dir, base, manifest.collect_ranks(run_dir))
    manifest.write_json_atomic(run_dir / "manifest.json", doc)
    print(f"gpuprof: run folder {run_dir} ({len(doc['traces'])} trace(s)); report: gpuprof report {run_dir}",
          file=sys.stderr)
    for f in doc["failures"]:
        print(f"gpuprof: note: {f}", file=sys.stderr)
    return code


def _run(cmd: list[str], env: dict[str, str], base: dict[str, Any]) -> tuple[int, int | None]:
    try:
        # Its own process group: a terminal Ctrl-C reaches only us, and we pass it on exactly once.
        child = subprocess.Popen(cmd, env=env, preexec_fn=os.setpgrp)  # noqa: PLW1509
    except OSError as e:
        base["failures"].append(f"could not start {cmd[0]!r}: {e.strerror}")
        print(f"gpuprof: error: could not start {cmd[0]!r}: {e.strerror}", file=sys.stderr)
        return 127, None

    def forward(signum: int, frame: Any) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = child.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if rc < 0:
        return 128 - rc, -rc
    return rc, None
