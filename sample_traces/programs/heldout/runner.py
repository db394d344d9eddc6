"""Records and times every program of sample_traces/h200/heldout_pairs.json within a wall-time budget
(record_heldout.sh runs it; see there for the command).

Interleaved, in rounds: round 1 runs every program once in its own process, timing
``--windows`` unprofiled windows and then recording the trace (OUTDIR/NAME.json.gz); rounds 2, 3, ...
run them again unprofiled, in reverse order every other round (ABBA: a drift of the machine's speed
over the session falls on a pair's two members alike; the members of a group, a pair and its shared
twins, always run next to each other). A round's group is started only if its members' last
measured wall times fit in the budget left, so the number of processes per program is as many as
the budget allows (at least one, unless round 1 itself runs out), and the summary says how many.

One process per run, but not one Python start per run: the runner imports torch, transformers and
timm once (several seconds on the lent machines, a third or more of a short program's process) and
forks a child per run, which initialises CUDA itself (the parent never touches CUDA; a first child
checks that CUDA and the profiler work in a forked child, else every run is started as a fresh
``python`` process, ``--mode proc``). Each child has its own CUDA context, caching allocator and
pinned memory, as a separate process has. Every child runs under a time limit; a failure is logged
and the run goes on.

Writes OUTDIR/raw/NAME.rR.timing.json (each process), OUTDIR/timings/NAME.json (merged by
merge_timings.py: step_ms the mean of every window, step_ms_sem over processes), OUTDIR/logs/NAME.log,
OUTDIR/runs.jsonl (each run: round, rc, wall seconds), OUTDIR/scaled_mm_check.json, and the summary
(OUTDIR/summary.txt, summary.json): per pair, bad and good ms with their noise and the realised
saving; per program, processes, spread, trace size and wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE.parent
PAIRS = PROGRAMS.parent / "h200" / "heldout_pairs.json"
sys.path.insert(0, str(PROGRAMS))

WINDOW_MS = 300.0  # each timed window is about this long: steps = WINDOW_MS / the program's est_step_ms
RESERVE_S = 15.0  # kept back at the end for the merge, the summary and packing


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------- runs

def child(script: Path, argv: list[str], log_path: Path) -> None:
    """In a forked child: run ``script`` as ``__main__`` with ``argv``, output to ``log_path``; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.argv = [str(script), *argv]
        sys.path.insert(0, str(script.parent))
        runpy.run_path(str(script), run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 -- a child reports every failure in its log and exits non-zero
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


CURRENT: list[int] = []  # the process group of the child running now (for the SIGTERM handler)


def on_term(signum: int, _frame: object) -> None:
    """SIGTERM (record_heldout.sh's backstop timeout): end the running child's group, then unwind to
    main's ``finally``, which still writes the summary of what finished."""
    for pid in CURRENT:
        kill_group(pid)
    raise SystemExit(128 + signum)


def run_forked(script: Path, argv: list[str], log_path: Path, limit_s: float) -> int:
    pid = os.fork()
    if pid == 0:
        child(script, argv, log_path)
    CURRENT[:] = [pid]
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child did it already
    end = time.monotonic() + limit_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > end:
            kill_group(pid)
            os.waitpid(pid, 0)
            return 124
        time.sleep(0.02)


def run_process(python: str, script: Path, argv: list[str], log_path: Path, limit_s: float) -> int:
    with open(log_path, "a") as f:
        p = subprocess.Popen([python, str(script), *argv], stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        CURRENT[:] = [p.pid]
        try:
            return p.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            kill_group(p.pid)
            p.wait()
            return 124


def kill_group(pid: int) -> None:
    """SIGKILL the process group this runner made for one of its own children (by its id)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def sanity_child() -> None:
    """In a forked child: CUDA, a cuBLAS product and a profiled kernel must work; exit 0 if so."""
    import torch

    x = torch.randn(512, 512, device="cuda")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        (x @ x).sum().item()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"sanity: {torch.cuda.get_device_name()}, {len(kernels)} GPU events profiled", flush=True)
    os._exit(0 if kernels else 3)


def fork_works(out: Path, dry: bool) -> bool:
    pid = os.fork()
    if pid == 0:
        try:
            fd = os.open(out / "logs" / "sanity.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            if dry:
                import torch

                print("sanity (cpu):", float(torch.randn(64, 64).sum()), flush=True)
                os._exit(0)
            sanity_child()
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
            sys.stdout.flush()
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


# --------------------------------------------------------------------------------------------- plan

def groups_of(programs: dict[str, Any]) -> list[list[str]]:
    """The programs in file order, cut into runs of the same ``group`` (a pair and its shared twins)."""
    out: list[list[str]] = []
    for name, p in programs.items():
        if out and programs[out[-1][0]]["group"] == p["group"]:
            out[-1].append(name)
        else:
            out.append([name])
    return out


def steps_for(est_ms: float) -> int:
    return int(min(60, max(5, round(WINDOW_MS / est_ms))))


class Runner:
    def __init__(self, a: argparse.Namespace, doc: dict[str, Any]) -> None:
        self.a, self.doc = a, doc
        self.out = Path(a.outdir)
        for d in ("raw", "logs", "timings"):
            (self.out / d).mkdir(parents=True, exist_ok=True)
        self.start = a.start or time.time()
        self.end = self.start + a.budget_s
        self.mode = a.mode
        self.wall: dict[str, float] = {}  # the last measured wall time of each program's process
        self.runs: list[dict[str, Any]] = []
        # programs another script records (the framework pairs: their own clock's arguments) are not this runner's
        self.programs = {k: v for k, v in doc["programs"].items()
                         if "recorded_by" not in v and (not a.only or k in a.only.split(","))}

    def left(self) -> float:
        return self.end - time.time()

    def argv(self, name: str, rnd: int) -> list[str]:
        p, a = self.programs[name], self.a
        if a.dry:
            tail = ["--device", "cpu", "--tiny", "--timing-windows", "2", "--timed-steps", "2", "--warmup-steps", "1"]
        else:
            tail = ["--timing-windows", str(a.windows), "--timed-steps", str(steps_for(p["est_step_ms"])),
                    "--warmup-steps", str(a.warmup_steps)]
        trace = self.out / f"{name}.json.gz" if rnd == 1 else Path("/tmp") / f"heldout_unused_{os.getpid()}.json.gz"
        tail += ["--out", str(trace), "--timing-out", str(self.out / "raw" / f"{name}.r{rnd}.timing.json")]
        if rnd > 1:
            tail.append("--no-profile")
        return [*p["args"].split(), *tail]

    def launch(self, script: Path, argv: list[str], log_path: Path, limit_s: float) -> int:
        if self.mode == "fork":
            return run_forked(script, argv, log_path, limit_s)
        return run_process(self.a.python, script, argv, log_path, limit_s)

    def run_one(self, name: str, rnd: int) -> None:
        limit = self.a.timeout_s * (4 if self.a.dry else 1) * (1 if rnd == 1 else 0.75)  # CPU bf16 convs are slow
        limit = max(1.0, min(limit, self.left()))
        logf = self.out / "logs" / f"{name}.log"
        with open(logf, "a") as f:
            f.write(f"\n=== round {rnd} ({self.mode}) {time.strftime('%H:%M:%S')}\n")
        t0 = time.time()
        rc = self.launch(HERE / self.programs[name]["program"], self.argv(name, rnd), logf, limit)
        wall = time.time() - t0
        self.wall[name] = wall
        rec = {"round": rnd, "name": name, "rc": rc, "wall_s": round(wall, 2), "at_s": round(t0 - self.start, 1),
               "mode": self.mode}
        tf = self.out / "raw" / f"{name}.r{rnd}.timing.json"
        if rc == 0 and tf.is_file():
            rec["step_ms"] = json.loads(tf.read_text())["step_ms"]
        self.runs.append(rec)
        with open(self.out / "runs.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        msg = f"r{rnd} {name}: rc {rc}, {wall:.1f} s" + (f", step {rec['step_ms']:.2f} ms" if "step_ms" in rec else "")
        if rc != 0:
            msg += "  FAILED" + (" (time limit)" if rc == 124 else "") + f": see logs/{name}.log"
            with open(self.out / "failures.txt", "a") as f:
                f.write(f"round {rnd} {name} rc={rc}\n")
        log(msg)

    def check_scaled_mm(self) -> None:
        argv = ["--out", str(self.out / "scaled_mm_check.json")] + (["--device", "cpu", "--tiny"] if self.a.dry else [])
        t0 = time.time()
        rc = self.launch(HERE / "scaled_mm_check.py", argv, self.out / "logs" / "scaled_mm_check.log",
                         min(60.0, max(1.0, self.left())))
        log(f"scaled_mm check: rc {rc}, {time.time() - t0:.1f} s")
        if rc:
            with open(self.out / "failures.txt", "a") as f:
                f.write(f"scaled_mm_check rc={rc}\n")

    def record(self) -> None:
        groups = groups_of(self.programs)
        log(f"{len(self.programs)} programs in {len(groups)} groups, budget {self.a.budget_s:.0f} s "
            f"({self.left():.0f} s left), mode {self.mode}")
        for rnd in range(1, self.a.max_rounds + 1):
            order = groups if rnd % 2 else [g[::-1] for g in groups[::-1]]
            ran = 0
            for g in order:
                need = sum(self.wall.get(n, self.a.first_guess_s) for n in g) + RESERVE_S
                if rnd > 1 and need > self.left():
                    log(f"round {rnd}: {self.left():.0f} s left, group {g[0]}.. needs ~{need:.0f} s: stopping")
                    return
                for n in g:
                    if self.left() < RESERVE_S + 2:
                        log(f"round {rnd}: budget spent, {n} not run")
                        with open(self.out / "failures.txt", "a") as f:
                            f.write(f"round {rnd} {n} not run: budget spent\n")
                        continue
                    self.run_one(n, rnd)
                    ran += 1
                if rnd == 1 and g is order[0] and not self.a.skip_check:
                    self.check_scaled_mm()  # after the first group: the GPU clocks are up by then
            log(f"round {rnd} done: {ran} processes, {time.time() - self.start:.0f} s since start")


# ------------------------------------------------------------------------------------------ summary

def noise_ms(doc: dict[str, Any]) -> float:
    """As benchmarks/pairs.step_noise_ms: twice the s.e. over processes, else half the windows' range."""
    if "step_ms_sem" in doc:
        return 2.0 * float(doc["step_ms_sem"])
    runs = [float(x) for x in doc.get("step_ms_runs") or []]
    return (max(runs) - min(runs)) / 2.0 if len(runs) > 1 else 0.0


def summarise(out: Path, doc: dict[str, Any], runs: list[dict[str, Any]], header: str) -> str:
    from merge_timings import merge

    merged: dict[str, dict[str, Any]] = {}
    for name in doc["programs"]:
        if not list((out / "raw").glob(f"{name}.r*.timing.json")):
            continue
        m = merge(out / "raw", name)
        (out / "timings" / f"{name}.json").write_text(json.dumps(m, indent=1))
        merged[name] = m
    lines = [header, "", ("Pairs (realised saving = bad - good; noise: 2 x s.e. over processes, or half the windows' "
                          "range for a program timed in one process; the saving's noise is the two added):"), ""]
    lines.append(f"| {'pair (bad -> good)':58} | {'class':18} | {'bad ms (processes)':>22} | {'good ms (processes)':>22} | {'realised ms':>16} | {'%':>5} |")
    lines.append(f"|{'-' * 60}|{'-' * 20}|{'-' * 24}|{'-' * 24}|{'-' * 18}|{'-' * 7}|")
    rows = []
    for p in doc["pairs"]:
        b, g = merged.get(p["bad"]), merged.get(p["good"])
        label = f"{p['bad']} -> {p['good']}"
        if not b or not g:
            lines.append(f"| {label:58} | {p['expect']:18} | {'missing' if not b else '':>22} | {'missing' if not g else '':>22} | {'':>16} | {'':>5} |")
            rows.append({**p, "realised_ms": None})
            continue
        nb, ng = noise_ms(b), noise_ms(g)
        saved = b["step_ms"] - g["step_ms"]
        pct = 100.0 * saved / b["step_ms"]
        lines.append(f"| {label:58} | {p['expect']:18} | {b['step_ms']:8.2f} ± {nb:7.2f} ({b['rounds']}) | "
                     f"{g['step_ms']:8.2f} ± {ng:7.2f} ({g['rounds']}) | {saved:7.2f} ± {nb + ng:6.2f} | {pct:5.1f} |")
        rows.append({**p, "bad_ms": b["step_ms"], "bad_noise_ms": nb, "bad_processes": b["rounds"],
                     "good_ms": g["step_ms"], "good_noise_ms": ng, "good_processes": g["rounds"],
                     "realised_ms": saved, "realised_noise_ms": nb + ng, "realised_pct": pct})
    lines += ["", "Programs:", ""]
    lines.append(f"| {'program':24} | {'ms':>8} | {'noise':>6} | {'proc':>4} | {'spread %':>8} | {'trace MB':>8} | {'wall s per process':26} |")
    lines.append(f"|{'-' * 26}|{'-' * 10}|{'-' * 8}|{'-' * 6}|{'-' * 10}|{'-' * 10}|{'-' * 28}|")
    walls: dict[str, list[str]] = {}
    for r in runs:
        walls.setdefault(r["name"], []).append(f"{r['wall_s']:.1f}" + ("" if r["rc"] == 0 else f"!{r['rc']}"))
    for name in doc["programs"]:
        m = merged.get(name)
        tr = out / f"{name}.json.gz"
        mb = f"{tr.stat().st_size / 2**20:8.2f}" if tr.is_file() else f"{'none':>8}"
        w = ", ".join(walls.get(name, []))
        if m:
            lines.append(f"| {name:24} | {m['step_ms']:8.2f} | {noise_ms(m):6.2f} | {m['rounds']:4d} | {m['spread_pct']:8.1f} | {mb} | {w:26} |")
        else:
            lines.append(f"| {name:24} | {'—':>8} | {'':>6} | {0:4d} | {'':>8} | {mb} | {w:26} |")
    chk = out / "scaled_mm_check.json"
    if chk.is_file():
        lines += ["", "torch._scaled_mm vs bf16 (scaled_mm_check.json, TFLOP/s):", ""]
        for r in json.loads(chk.read_text())["rows"]:
            errs = "; ".join(f"{k}: {v}" for k, v in r.items() if k.endswith("_error"))
            lines.append(f"  M={r['m']} K={r['k']} N={r['n']}: bf16 {r.get('bf16_tflops', 0):.4g}, fp8 {r.get('fp8_tflops', 0):.4g}, "
                         f"fp8 fast-accum {r.get('fp8_fast_accum_tflops', 0):.4g}, rel. err {r.get('fp8_rel_err', float('nan')):.4f}, "
                         f"e5m2 x e4m3 {r.get('e5m2_x_e4m3')}" + (f"; {errs}" if errs else ""))
    else:
        lines += ["", "scaled_mm check: no result (see logs/scaled_mm_check.log)"]
    fails = out / "failures.txt"
    lines += ["", "Failures:", fails.read_text().rstrip() if fails.is_file() else "none"]
    text = "\n".join(lines) + "\n"
    (out / "summary.txt").write_text(text)
    (out / "summary.json").write_text(json.dumps({"pairs": rows, "runs": runs}, indent=1))
    return text


# --------------------------------------------------------------------------------------------- main

def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir")
    p.add_argument("--pairs", default=str(PAIRS))
    p.add_argument("--budget-s", type=float, default=510.0, help="wall seconds from --start for everything")
    p.add_argument("--start", type=float, default=0.0, help="epoch seconds the budget counts from (default: now)")
    p.add_argument("--mode", choices=["fork", "proc"], default="fork")
    p.add_argument("--python", default=sys.executable, help="the interpreter of --mode proc")
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--max-rounds", type=int, default=6)
    p.add_argument("--timeout-s", type=float, default=90.0, help="one process's time limit in round 1 (later: 3/4 of it)")
    p.add_argument("--first-guess-s", type=float, default=10.0, help="a process's wall time before one is measured")
    p.add_argument("--only", help="comma-separated program names")
    p.add_argument("--skip-check", action="store_true", help="no scaled_mm check")
    p.add_argument("--dry", action="store_true", help="every program with --device cpu --tiny, 2 short windows")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # is_available() without initialising CUDA
    doc = json.loads(Path(a.pairs).read_text())
    r = Runner(a, doc)
    t0 = time.time()
    import torch

    t1 = time.time()
    imported = [f"torch {torch.__version__} {t1 - t0:.1f} s"]
    try:
        import transformers as tf

        for cls in ("GPTNeoXForCausalLM", "WhisperForAudioClassification", "Qwen2ForCausalLM",
                    "DebertaV2ForSequenceClassification"):
            getattr(tf, cls)  # transformers loads each model's module on first use: load them here
        imported.append(f"transformers {tf.__version__} {time.time() - t1:.1f} s")
    except Exception as e:  # noqa: BLE001 -- the programs that need it fail and are logged
        imported.append(f"transformers FAILED ({type(e).__name__}: {e})")
    t2 = time.time()
    try:
        import timm

        imported.append(f"timm {timm.__version__} {time.time() - t2:.1f} s")
    except Exception as e:  # noqa: BLE001
        imported.append(f"timm FAILED ({type(e).__name__}: {e})")
    log("imports: " + ", ".join(imported))
    if r.mode == "fork":
        if torch.cuda.is_initialized():
            log("CUDA was initialised by an import: children could not use it; --mode proc")
            r.mode = "proc"
        elif not fork_works(r.out, a.dry):
            log("CUDA or the profiler failed in a forked child (logs/sanity.log): --mode proc")
            r.mode = "proc"
        else:
            log(f"a forked child ran CUDA and the profiler ({time.time() - t2:.1f} s with the timm import)")
    header = (f"heldout: {len(r.programs)} programs, mode {r.mode}, windows {a.windows}, imports: {', '.join(imported)}")
    try:
        r.record()
    finally:
        text = summarise(r.out, {**doc, "programs": r.programs,
                                 "pairs": [q for q in doc["pairs"] if q["bad"] in r.programs or q["good"] in r.programs]},
                         r.runs, header + f"; {time.time() - r.start:.0f} s since start")
        print(text, flush=True)
        walls = [x["wall_s"] for x in r.runs]
        if walls:
            log(f"{len(walls)} processes, wall per process median {statistics.median(walls):.1f} s, "
                f"total {sum(walls):.0f} s; {time.time() - r.start:.0f} s since start")


if __name__ == "__main__":
    main()
