"""Fuzz the C column scanner (gpuprof/trace/_columns.c) under AddressSanitizer: real traces,
mutated (bit flips, truncations, inserted and deleted bytes, spliced tokens, deep nesting, long
strings and numbers, duplicated keys), each loaded by the ASan build; every input must end in
columns identical to the msgspec path's frames, or in the same refusal, never in a memory error.

    python -m benchmarks.fuzz_columns [--iterations 3000] [--seed 1] [TRACE ...]

It compiles ``_columns.c`` with ``-fsanitize=address,undefined`` into a temporary folder, then
runs itself again in a child with ASan's runtime preloaded (``LD_PRELOAD``) and that build loaded
in place of the installed scanner; an ASan report ends the child with a non-zero exit and the
report on stderr.
Needs gcc and Python's headers (what ``pip install`` of gpuprof needs to compile it).
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["sample_traces/h200/tiny_eager.json.gz", "sample_traces/h200/ddp_slow_rank/rank0.json.gz",
           "sample_traces/h200/gpt_host_sync_stack.json.gz"]


def build(out: Path) -> Path:
    """The ASan + UBSan build of the scanner, as ``out/gpuprof/trace/_columns<suffix>``."""
    target = out / "gpuprof" / "trace" / ("_columns" + sysconfig.get_config_var("EXT_SUFFIX"))
    target.parent.mkdir(parents=True)
    cmd = ["gcc", "-shared", "-fPIC", "-g", "-O1", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
           "-fno-sanitize-recover=undefined", f"-I{sysconfig.get_paths()['include']}",
           str(ROOT / "gpuprof" / "trace" / "_columns.c"), "-o", str(target)]
    subprocess.run(cmd, check=True)
    return target


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(9)
        i = rng.randrange(len(b)) if b else 0
        if op == 0 and b:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            del b[i:i + rng.randint(1, 64)]
        elif op == 2:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 3:
            b = b[:i]
        elif op == 4:
            j = rng.randrange(len(b)) if b else 0
            b[i:i] = b[j:j + rng.randint(1, 200)]
        elif op == 5:
            b[i:i] = rng.choice([b"[" * 70, b"{\"a\":" * 70, b"\\u", b"\\ud800", b"\"", b"\\", b",", b"}", b"]",
                                 b"1e400", b"-", b"0" * 400, b"\"x\" " * 3, b"\x00", b"\xff\xfe", b"null",
                                 b"\"ts\": 1, \"ts\": 2", b"\"args\": [1]", b"\"name\": 5", b"9" * 30])
        elif op == 6 and b:
            b[i] = rng.choice(b"{}[]\":,0123456789-+.eEtrufalsn \\")
        elif op == 7:
            b[i:i] = b"\"" + b"a" * rng.randint(1000, 70000) + b"\""
        else:
            j = min(len(b), i + rng.randint(1, 5000))
            b[i:j] = bytes(reversed(b[i:j]))
    return bytes(b)


def mutate_valid(rng: random.Random, doc: dict) -> bytes:
    """``doc`` with a few of its events' values replaced, kept valid JSON: other types, huge or
    odd numbers, long or non-ASCII strings, nested values, events copied, fields dropped."""
    import copy
    import json

    d = copy.deepcopy(doc)
    ev = d.get("traceEvents") or []
    values = [None, True, 0, -1, 2**63, 2**64 + 1, 1e308, -0.0, 1.5e-300, "", "x" * rng.randint(1, 5000),
              "\u00e9\ud83d\ude00", "ü" * 50, [], [1, [2, [3]]], {"a": {"b": [None]}}, "Spans", "1e400"]
    for _ in range(rng.randint(1, 3)):
        if not ev:
            break
        e = rng.choice(ev)
        if not isinstance(e, dict):
            continue
        what = rng.randrange(5)
        keys = list(e) + ["args", "ts", "dur", "pid", "tid", "name", "cat", "ph"]
        if what == 0:
            e[rng.choice(keys)] = rng.choice(values)
        elif what == 1 and isinstance(e.get("args"), dict):
            args = e["args"]
            args[rng.choice(list(args) + ["External id", "correlation", "Input Dims", "stream", "grid"])] = \
                rng.choice(values)
        elif what == 2:
            ev.append(copy.deepcopy(e))
        elif what == 3 and e:
            e.pop(rng.choice(list(e)))
        else:
            e["args"] = rng.choice(values)
    return json.dumps(d, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")


def child(so: str, traces: list[str], iterations: int, seed: int) -> int:
    import importlib.machinery
    import importlib.util

    # the ASan build stands in for the installed scanner before anything imports it
    loader = importlib.machinery.ExtensionFileLoader("gpuprof.trace._columns", so)
    spec = importlib.util.spec_from_file_location("gpuprof.trace._columns", so, loader=loader)
    assert spec is not None
    native = importlib.util.module_from_spec(spec)
    loader.exec_module(native)
    sys.modules["gpuprof.trace._columns"] = native
    from gpuprof.errors import TraceError
    from gpuprof.trace import columnar, load

    import json

    from benchmarks.frames_digest import FRAMES, frame_digest

    seeds, docs = [], []
    for t in traces:
        raw = (ROOT / t).read_bytes()
        seeds.append(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        docs.append(json.loads(seeds[-1]))
    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="gpuprof-fuzz-"))
    scanned = refused = fallback = compared = 0
    t0 = time.perf_counter()
    scan = columnar.scan

    def outcome(path: Path, native: bool) -> tuple[str, ...]:
        columnar.scan = scan if native else (lambda data: None)
        try:
            t = load.load_trace(path)
            return tuple(frame_digest(getattr(t, f)) for f in FRAMES)
        except (TraceError, RecursionError) as e:
            return ("refused", str(e))
        finally:
            columnar.scan = scan

    for n in range(iterations):
        if rng.random() < 0.5:
            data = mutate(rng, rng.choice(seeds)[: rng.choice([2_000, 20_000, 200_000, 10**9])])
        else:
            data = mutate_valid(rng, rng.choice(docs))
        got = scan(data)  # the C scanner on its own: None or columns
        scanned += got is not None
        fallback += got is None
        path = tmp / "t.json"
        path.write_bytes(data)
        native = outcome(path, True)  # the whole loader: native path, or the msgspec fallback
        refused += native[0] == "refused"
        if got is not None:  # where the scanner took it, the frames are the msgspec path's
            compared += 1
            assert native == outcome(path, False), (n, seed)
        if n % 500 == 0:
            print(f"{n} inputs, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{iterations} mutated inputs under ASan+UBSan: {scanned} scanned natively (frames equal to the "
          f"msgspec path's on all {compared}), {fallback} left to the msgspec path, {refused} refused in one line; "
          "no memory error")
    return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="*", default=DEFAULT)
    p.add_argument("--iterations", type=int, default=3000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        sys.exit(child(a.child, a.traces, a.iterations, a.seed))
    out = Path(tempfile.mkdtemp(prefix="gpuprof-asan-"))
    try:
        so = build(out)
        asan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
        ubsan = subprocess.run(["gcc", "-print-file-name=libubsan.so"], capture_output=True, text=True).stdout.strip()
        env = {**os.environ, "LD_PRELOAD": f"{asan}:{ubsan}", "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0"}
        r = subprocess.run([sys.executable, "-m", "benchmarks.fuzz_columns", "--child", str(so), "--iterations",
                            str(a.iterations), "--seed", str(a.seed), *a.traces], env=env, cwd=ROOT)
        sys.exit(r.returncode)
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
