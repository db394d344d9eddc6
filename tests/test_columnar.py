"""The native column scanner (gpuprof/trace/_columns.c, gpuprof.trace.columnar) against the msgspec path.

Every check loads one input both ways, the scanner's path and the msgspec path it stands in for
(``columnar.scan`` switched off), and requires the same frames byte for byte (the digest of
``benchmarks.frames_digest``) or the same error. Traces are SYNTHETIC, built in code here, or
real samples from ``sample_traces/`` damaged in code; none is written back to the samples.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
import struct
from pathlib import Path
from typing import Any

import pytest

from benchmarks.frames_digest import FRAMES, frame_digest
from gpuprof import files
from gpuprof.errors import TraceError
from gpuprof.trace import chunks, columnar, kineto, load, native
from tests.conftest import SAMPLES, TraceBuilder, simple_training_trace

pytestmark = pytest.mark.skipif(not columnar.AVAILABLE, reason="the C scanner is not compiled (pip install -e .)")


def _digest(path: Path) -> dict[str, str]:
    try:
        t = load.load_trace(path)
    except TraceError as e:
        return {"error": str(e)}
    out = {f: frame_digest(getattr(t, f)) for f in FRAMES}
    out["meta"] = repr(dataclasses.asdict(t.meta))
    return out


def _native(path: Path) -> bool:
    """Whether the scanner's path takes this file (rather than handing it to msgspec)."""
    return native.from_columns([files.read(path)]) is not None


def _both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, str], dict[str, str]]:
    native = _digest(path)
    with monkeypatch.context() as m:
        m.setattr(columnar, "scan", lambda data: None)
        old = _digest(path)
    return native, old


def _write(path: Path, doc: Any, text: str | None = None) -> Path:
    path.write_text(text if text is not None else json.dumps(doc))
    return path


@pytest.mark.parametrize("name", ["gpt_bf16", "tiny_graph", "tiny_eager", "vision_pinned", "ddp_manual_allreduce/rank0",
                                  "gpt_host_sync"])
def test_real_samples_take_the_native_path_to_the_same_frames(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = SAMPLES / f"{name}.json.gz"
    assert _native(path)
    native, old = _both(path, monkeypatch)
    assert native == old


def test_synthetic_training_trace_pretty_printed_and_bare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kineto writes one field per line (newlines inside events); a bare event array has no header."""
    doc = simple_training_trace(TraceBuilder()).document()
    pretty = _write(tmp_path / "pretty.json", doc, json.dumps(doc, indent=2))
    bare = _write(tmp_path / "bare.json", doc["traceEvents"], json.dumps(doc["traceEvents"], separators=(",", ":")))
    for p in (pretty, bare):
        assert _native(p)
        native, old = _both(p, monkeypatch)
        assert native == old and "error" not in native


def test_names_with_escapes_and_unicode_decode_as_msgspec_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = simple_training_trace(TraceBuilder())
    b.op("aten::\u00e9\"quoted\"\\back\tslash", 5.0, 1.0)
    b.op("aten::mm", 6.0, 1.0)
    b.op("aten::\u006dm", 7.0, 1.0)  # the same name spelled with an escape in the file: one category
    p = b.write(tmp_path / "t.json")
    text = p.read_text().replace('"aten::mm", "pid": 10, "tid": 1, "ts": 5000006.0', '"aten::\\u006dm", "pid": 10, '
                                 '"tid": 1, "ts": 5000006.0')
    p.write_text(text)
    assert _native(p)
    native, old = _both(p, monkeypatch)
    assert native == old
    names = list(load.load_trace(p).ops["name"].cat.categories)
    assert names.count("aten::mm") == 1 and "aten::\u00e9\"quoted\"\\back\tslash" in names


def test_torch_18_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Capitalised categories, 'external id' in lower case, 'Input dims', record_function ranges as
    Operators (moved to the annotations), integer µs since the epoch, no baseTimeNanoseconds."""
    t0 = 1_600_000_000_000_000
    ev = [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#1", "pid": 5, "tid": 6, "ts": t0, "dur": 1000},
        {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 5, "tid": 6, "ts": t0 + 10, "dur": 100,
         "args": {"Input dims": [[8, 8], [8, 8]], "External id": 2}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 5, "tid": 6, "ts": t0 + 20, "dur": 5,
         "args": {"correlation": 7, "external id": 2}},
        {"ph": "X", "cat": "Kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": t0 + 30, "dur": 50,
         "args": {"correlation": 7, "external id": 2, "stream": 7, "device": 0}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7, "ts": t0 + 90,
         "dur": 5, "args": {"bytes": 1024, "correlation": 8}},
    ]
    p = _write(tmp_path / "old.json", {"traceEvents": ev})
    assert _native(p)
    native, old = _both(p, monkeypatch)
    assert native == old
    t = load.load_trace(p)
    assert t.ops["input_dims"].tolist() == [b"[[8, 8], [8, 8]]"] and "ProfilerStep#1" in list(t.annotations["name"])
    assert t.kernels["external_id"].tolist() == [2]


def test_collective_fields_of_any_type(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Collective strings kept as strings (anything else: None); the process group named by
    'Process Group Name', else 'Process Group ID' (an int, a list...) as text."""
    b = simple_training_trace(TraceBuilder())
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    for i, extra in enumerate([{"Collective name": "allreduce", "dtype": "Float", "Process Group Name": "0"},
                               {"Collective name": 5, "dtype": None, "Process Group ID": 3},
                               {"Process Group Name": None, "Process Group ID": [1, "a"]},
                               {"Process Group ID": 2.5e20, "In msg nelems": 10, "Out msg nelems": 10.5,
                                "Group size": 2, "Seq": 4}]):
        b.launch(nccl, 500.0 + i, 600.0 + 10 * i, 5.0, None)
        b.events[-1]["args"].update(extra)
    p = b.write(tmp_path / "t.json")
    assert _native(p)
    native, old = _both(p, monkeypatch)
    assert native == old
    k = load.load_trace(p).kernels
    assert k["process_group"].astype(object).tolist()[-4:] == ["0", "3", "[1, 'a']", "2.5e+20"]


def test_numbers_convert_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Times in every spelling JSON allows (3 decimals as Kineto writes, 17 significant digits,
    exponents, integers, -0.0) read as the float msgspec reads, bit for bit."""
    rng = random.Random(26)
    b = TraceBuilder(offset_us=0.0)
    spellings: list[str] = []
    for i in range(3000):
        x = rng.uniform(0, 1e13)
        spellings.append(rng.choice([f"{x:.3f}", repr(x), f"{x:.6e}", str(int(x)), f"{x:.0f}.0", f"{x / 1e9:.17g}",
                                     f"{rng.random():.20f}", f"{struct.unpack('d', struct.pack('Q', rng.getrandbits(62)))[0]!r}"
                                     .replace("inf", "1").replace("nan", "1")]))
        b.op("aten::add", float(i), 1.0)
    doc = b.document()
    text = json.dumps(doc)
    for i, s in enumerate(spellings):
        text = text.replace(f'"ts": {float(i)!r},', f'"ts": {s},', 1)
    p = _write(tmp_path / "t.json", None, text)
    if _native(p):  # a spelling outside float range or subnormal sends the file to msgspec, also fine
        native, old = _both(p, monkeypatch)
        assert native == old
    s_ = columnar.scan(files.read(p))
    assert s_ is not None
    want = [float(s) for s in spellings]
    got = s_.num["ts"].tolist()
    exact = [(w, g) for w, g, r in zip(want, got, s_.rare.tolist()) if not r & columnar.RARE_BITS["ts"]]
    assert len(exact) > 2900 and all(struct.pack("d", w) == struct.pack("d", g) for w, g in exact)


def _set(**fields: Any) -> Any:
    return lambda e: e.update(fields)


def _set_args(**fields: Any) -> Any:
    return lambda e: e["args"].update({k.replace("_", " "): v for k, v in fields.items()})


DAMAGE: dict[str, tuple[Any, dict[str, str], str]] = {
    # the first op's edit, placeholders for JSON text Python does not write (@XFF: the byte 0xff),
    # and the path it takes
    "duplicated key": (_set(dur="@D"), {'"dur": "@D"': '"dur": 20, "dur": 3'}, "msgspec"),
    "escaped key": (_set(dur="@D"), {'"dur": "@D"': '"d\\u0075r": 20'}, "msgspec"),
    "escaped category": (_set(cat="@C"), {'"@C"': '"cpu\\u005fop"'}, "msgspec"),
    "string pid": (_set(pid="10"), {}, "msgspec"),
    "string pid of an event no bucket reads it from": (_set(ph="M", pid="Spans"), {}, "native"),
    "name a number": (_set(name=5), {}, "msgspec"),
    "args a list": (_set(args=[1]), {}, "msgspec"),
    "lone surrogate in a name": (_set(name="@S"), {'"@S"': '"a\\ud800"'}, "msgspec"),
    "ts beyond float range": (_set(ts="@T"), {'"@T"': "1e400"}, "msgspec"),
    "ts 1e300": (_set(ts=1e300), {}, "msgspec"),
    "no ts": (_set(ts=None), {}, "msgspec"),
    "dur a bool": (_set(dur=True), {}, "msgspec"),
    "dur null": (_set(dur=None), {}, "native"),
    "20-digit External id": (_set_args(External_id="@E"), {'"@E"': "12345678901234567890"}, "msgspec"),
    "Input Dims null and odd": (_set_args(Input_Dims=None, Input_type={"a": [1, "]"]}), {}, "native"),
    "Input Dims absent": (lambda e: e["args"].pop("Input Dims"), {}, "native"),
    # values msgspec decodes in every event, bucket or not, so may refuse there
    "pid invalid UTF-8 in an event of no bucket": (_set(ph="M", pid="@P"), {'"@P"': '"@XFF"'}, "msgspec"),
    "tid a lone surrogate in an event of no bucket": (_set(ph="M", tid="@P"), {'"@P"': '"\\udc00"'}, "msgspec"),
    "ts beyond float range in an event of no bucket": (_set(ph="M", ts="@T"), {'"@T"': "1e400"}, "msgspec"),
    "cat a list": (_set(cat=[1, [2]]), {}, "msgspec"),
    "a key not in ASCII": (_set(**{"\u00fcber": 1}), {}, "msgspec"),
    "args of a stream beyond float range in an op (not read)": (_set_args(stream="@S"), {'"@S"': "1e400"}, "native"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_events_load_as_the_msgspec_path_loads_them(tmp_path: Path, case: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    edit, raw, way = DAMAGE[case]
    doc = simple_training_trace(TraceBuilder()).document()
    edit(next(e for e in doc["traceEvents"] if e["cat"] == "cpu_op"))
    text = json.dumps(doc)
    for k, v in raw.items():
        assert k in text
        text = text.replace(k, v, 1)
    p = tmp_path / "t.json"
    p.write_bytes(text.encode().replace(b"@XFF", b"\xff"))  # a byte no UTF-8 text holds
    assert _native(p) == (way == "native"), case
    native, old = _both(p, monkeypatch)
    assert native == old


VALUES: list[Any] = [None, "x", "", "12", -1, 0, -0.0, 1.5, -1e9, 1e300, 10 ** 30, 2 ** 63, [], {}, True, [1, [2]],
                     [1, 2, 3], [1.5, 2, 3], "ü\"\\", {"a": None}]
FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]
ARGS = ["External id", "external id", "correlation", "stream", "device", "grid", "block", "registers per thread",
        "shared memory", "Input Dims", "Input dims", "Input type", "Concrete Inputs", "Input Strides", "bytes",
        "Collective name", "dtype", "Process Group Name", "Process Group ID", "Group size", "In msg nelems", "Seq",
        "est. achieved occupancy %", "Sequence number", "Fwd thread id", "Bytes", "Device Id"]


def test_fuzzed_real_traces_load_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fields of a real trace set to wrong types, signs and sizes (a seeded sample): both paths
    give the same frames or the same error, whichever path the scanner chooses."""
    rng = random.Random(26)
    src = json.loads(gzip.decompress((SAMPLES / "tiny_graph.json.gz").read_bytes()))
    ways = {"native": 0, "msgspec": 0}
    for i in range(40):
        doc = json.loads(json.dumps(src))
        cats = sorted({e.get("cat") for e in doc["traceEvents"] if isinstance(e.get("cat"), str)})
        cat, value = rng.choice(cats), rng.choice(VALUES)
        evs = [e for e in doc["traceEvents"] if e.get("cat") == cat]
        for e in rng.sample(evs, min(len(evs), rng.choice([1, 3, 1000]))):
            if rng.random() < 0.4:
                e[rng.choice(FIELDS)] = value
            elif isinstance(e.get("args"), dict):
                e["args"][rng.choice(ARGS)] = value
        p = _write(tmp_path / f"fuzz{i}.json", doc)
        ways["native" if _native(p) else "msgspec"] += 1
        native, old = _both(p, monkeypatch)
        assert native == old, (i, cat, value)
    assert ways["native"] >= 10 and ways["msgspec"] >= 5, ways


MALFORMED = ['"x\x01y"', '"\\q"', '"\\u12G4"', '"\\ud800"', '"\\udc00\\ud800"', "tru", "nul", "01", "1.", "-", "1e",
             "+1", ".5", "[1,]", '{"a" 1}', '{"a": 1,}', "[1 2]", "\x0b1", "1\x00", "[" * 70 + "]" * 70,
             "[" * 2000 + "]" * 2000, '"\xff"', "1e400", '"\\ud83d\\ude00"', "[]]", "{}}", '"a\\"']


@pytest.mark.parametrize("where", ["an unknown field", "Input Dims", "a name", "the header"])
def test_malformed_json_is_refused_or_read_as_msgspec_does(tmp_path: Path, where: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The scanner validates the events array itself (msgspec decodes the rest of the document):
    JSON that msgspec refuses must never load, and what it accepts must load alike, whatever the
    damage and wherever it is (synthetic trace; the damaged text is written byte for byte)."""
    doc = simple_training_trace(TraceBuilder()).document()
    op = next(e for e in doc["traceEvents"] if e["cat"] == "cpu_op")
    if where == "an unknown field":
        op["args"]["Record function id"] = "@V"
    elif where == "Input Dims":
        op["args"]["Input Dims"] = "@V"
    elif where == "a name":
        op["name"] = "@N"
    else:
        doc["traceName"] = "@V"
    for i, bad in enumerate(MALFORMED):
        text = json.dumps(doc).encode()
        value = bad.encode("utf-8", "surrogateescape").replace("\xff".encode(), b"\xff")
        text = text.replace(b'"@V"', value).replace(b'"@N"', b'"' + value.strip(b'"') + b'"')
        p = tmp_path / f"bad{i}.json"
        p.write_bytes(text)
        native, old = _both(p, monkeypatch)
        assert native == old, (where, bad)


def test_ids_beyond_int64_become_minus_one_without_a_warning() -> None:
    """A pid of 1e300 or 2**63 (a fuzzed or damaged trace) is no id: -1, as NaN and 2.5 are, and
    no cast of an out-of-range float (undefined in C, a RuntimeWarning in numpy)."""
    import warnings

    import numpy as np
    values = [7, 2.5, 1e300, -1e300, float(2 ** 63), float(-2 ** 63), float(2 ** 62), None, "12", "x"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = chunks._ids(values).tolist()
        num = chunks._num(values[:8], "int64").tolist()
    assert got == [7, -1, -1, -1, -1, -1, 2 ** 62, -1, 12, -1]
    assert num == got[:8]
    assert kineto.to_int64(np.array([3.0, np.inf, 1e19])).tolist() == [3, -1, -1]
