"""The parse cache: same frames as a fresh parse, and a bad entry is rebuilt, never trusted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from gpuprof.api import load_traces
from gpuprof.errors import GpuprofWarning
from gpuprof.trace import cache
from tests.conftest import SAMPLES


@pytest.fixture
def trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path / "cache"))
    p = tmp_path / "t.json.gz"
    shutil.copy(SAMPLES / "gpt_manual_attn.json.gz", p)
    return p


def _entry(p: Path) -> Path:
    return cache.cache_dir() / "frames" / cache.content_key(p)


def test_cached_frames_equal_a_fresh_parse(trace: Path) -> None:
    fresh = load_traces([trace], cache=False)[0]
    assert not _entry(trace).exists()
    load_traces([trace])  # writes the entry
    assert (_entry(trace) / "meta.json").is_file()
    cached = load_traces([trace])[0]
    from dataclasses import replace

    assert cached.meta == replace(fresh.meta, content_key=cache.content_key(trace))
    for name in cache.FRAMES:
        a, b = getattr(fresh, name), getattr(cached, name)
        assert list(a.columns) == list(b.columns), name
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_categorical=False)


def test_corrupt_or_mismatched_entries_are_rebuilt(trace: Path) -> None:
    load_traces([trace])
    entry = _entry(trace)
    (entry / "kernels.parquet").write_bytes(b"not parquet")
    assert cache.load(trace, cache.content_key(trace)) is None and not entry.exists()  # dropped
    load_traces([trace])
    meta = json.loads((entry / "meta.json").read_text())
    meta["key"] = "something else"
    (entry / "meta.json").write_text(json.dumps(meta))
    assert cache.load(trace, cache.content_key(trace)) is None
    assert len(load_traces([trace])[0].kernels) > 0


def test_key_follows_content_and_version(trace: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.json.gz"
    shutil.copy(trace, other)
    assert cache.content_key(other) == cache.content_key(trace)  # same bytes, same entry
    other.write_bytes(trace.read_bytes()[:-10] + b"0123456789")
    assert cache.content_key(other) != cache.content_key(trace)
    assert f"-v{cache.gpuprof.__version__}-f{cache.FORMAT}" in cache.content_key(trace)
    import blake3

    assert cache.content_key(trace).startswith(blake3.blake3(trace.read_bytes()).hexdigest() + "-")


def test_results_are_keyed_by_the_shipped_tables_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The results and stored reports are keyed by gpuprof's source; the measured tables it ships
    (gpuprof/data: GEMM and layout tables) change results as code does, so they are hashed too: a
    new table is never answered from results the old one priced. Checked on a copy of a package:
    the hash source_hash() gives changes with a table's bytes, not only with a .py file's."""
    import importlib.util
    from importlib.machinery import ModuleSpec

    from gpuprof import cache_keys

    root = Path(cache_keys.__file__).resolve().parent
    shipped = sorted((root / "data").glob("*.json"))
    assert shipped and all(f in cache_keys.source_files(root) for f in shipped)
    pkg = tmp_path / "pkg"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    table = pkg / "data" / "t.json"
    table.write_text('{"rows": [1]}\n')
    spec = ModuleSpec("gpuprof", None, origin=str(pkg / "__init__.py"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)

    def fresh_hash() -> str:
        monkeypatch.setattr(cache_keys, "_SOURCE_HASH", None)
        return cache_keys.source_hash()

    before = fresh_hash()
    assert fresh_hash() == before  # stable
    table.write_text('{"rows": [2]}\n')
    assert fresh_hash() != before
    table.write_text('{"rows": [1]}\n')
    assert fresh_hash() == before


def test_no_cache_writes_nothing(trace: Path) -> None:
    load_traces([trace], cache=False)
    assert not cache.cache_dir().exists() or not any(cache.cache_dir().iterdir())


@pytest.mark.parametrize("folder", ["ddp_good", "ddp_manual_allreduce", "ddp_slow_rank"])
def test_ranks_analysed_apart_match_ranks_in_memory(folder: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounded memory (each rank reduced to a summary in a worker process, cross-rank findings
    planned from the summaries) gives the same report as every rank's frames in one process,
    with and without the real step time (which turns on the slow rank's event deflation)."""
    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path / "cache"))
    import gpuprof

    memory = gpuprof.analyze(SAMPLES / folder, workers=1, keep_traces=True)
    seen: list[tuple[int, int, str]] = []
    apart = gpuprof.analyze(SAMPLES / folder, workers=2, progress=lambda *a: seen.append(a))
    assert apart.frames is None and memory.frames is not None
    assert seen == [(1, 2, "summarised"), (2, 2, "summarised"), (1, 2, "analysed"), (2, 2, "analysed")]
    one = apart.rank(1)  # one rank's frames, loaded alone
    assert one.trace.meta.rank == 1 and "ranks" not in apart.__dict__
    assert memory.to_dict() == apart.to_dict()
    real = 0.7 * memory.summary["step_time_ms"]
    a = gpuprof.analyze(SAMPLES / folder, workers=1, keep_traces=True, step_ms=real).to_dict()
    b = gpuprof.analyze(SAMPLES / folder, workers=2, step_ms=real).to_dict()
    assert a == b and a["findings"]


def test_ranks_apart_without_the_cache_leave_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--no-cache with several ranks: the second pass uses a private cache for the call, gone
    afterwards; nothing lands in the user's cache, and the frames can still be loaded later."""
    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path / "cache"))
    import gpuprof

    a = gpuprof.analyze(SAMPLES / "ddp_good", workers=2, cache=False)
    assert not (tmp_path / "cache").exists()
    assert all(not j.cache and j.cache_root is None for j in a.jobs)
    assert len(a.kernels) and sorted(a.kernels["rank"].unique()) == [0, 1]
    assert not (tmp_path / "cache").exists()
    assert a.to_dict() == gpuprof.analyze(SAMPLES / "ddp_good", workers=1, keep_traces=True).to_dict()


def _eight_ranks(tmp_path: Path, pair: str = "ddp_good") -> Path:
    """Eight rank traces derived in test code from a real 2-rank DDP pair: copies with
    distributedInfo set to ranks 0-7 of 8 (the events are the recorded ones)."""
    import gzip

    d = tmp_path / "eight"
    d.mkdir()
    for r in range(8):
        doc = json.loads(gzip.decompress((SAMPLES / pair / f"rank{r % 2}.json.gz").read_bytes()))
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": 8}
        (d / f"rank{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return d


def test_dask_local_cluster_on_eight_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("distributed", reason="dask.distributed is part of the test extra")
    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path / "cache"))
    import gpuprof

    folder = _eight_ranks(tmp_path)
    seen: list[tuple[int, int, str]] = []
    on_dask = gpuprof.analyze(folder, dask="local", workers=2, cache=False, progress=lambda *a: seen.append(a))
    assert [x for x in seen if x[0] == x[1]] == [(8, 8, "summarised"), (8, 8, "analysed")] and len(seen) == 16
    local = gpuprof.analyze(folder, workers=1, cache=False)
    assert [p.rank for p in on_dask.parts] == list(range(8)) and on_dask.frames is None
    a, b = on_dask.to_dict(), local.to_dict()
    assert a["summary"] == b["summary"] and a["kernels"] == b["kernels"] and a["findings"] == b["findings"]
    assert len(a["summary"]["per_rank"]) == 8


def test_unreachable_dask_scheduler_is_one_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    import gpuprof
    from gpuprof.errors import GpuprofError

    with pytest.raises(GpuprofError, match="Dask scheduler"):
        gpuprof.analyze(SAMPLES / "ddp_good", dask="tcp://127.0.0.1:9", cache=False)


def test_results_cache_skips_loading_an_unchanged_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second report of the same trace with the same options reads the cached result (no frames
    loaded, same report); a different option, an edited trace or edited gpuprof code recompute,
    and an unreadable entry is recomputed and replaced."""
    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path / "cache"))
    import gpuprof

    src = tmp_path / "t.json.gz"
    src.write_bytes((SAMPLES / "gpt_bf16.json.gz").read_bytes())
    first = gpuprof.analyze(src)
    assert first.frames is not None
    results = tmp_path / "cache" / "results"
    assert len(list(results.glob("*.msgpack"))) == 2  # its part and its findings
    second = gpuprof.analyze(src)
    assert second.frames is None and second.to_dict() == first.to_dict()
    assert len(second.kernels) == len(first.kernels)  # frames still there on demand
    other = gpuprof.analyze(src, step_ms=8.9)  # its real step time (timings/gpt_bf16.json)
    assert other.frames is not None and len(list(results.glob("*.msgpack"))) == 4
    monkeypatch.setattr(cache, "_CODE_HASH", "edited")
    assert gpuprof.analyze(src).frames is not None  # new code: computed again
    monkeypatch.setattr(cache, "_CODE_HASH", None)
    for f in results.glob("*.msgpack"):
        f.write_bytes(b"\x80garbage")
    again = gpuprof.analyze(src)
    assert again.frames is not None and again.to_dict() == first.to_dict()
    assert gpuprof.analyze(src).frames is None  # replaced by a good entry


def test_results_cache_for_ranks_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path / "cache"))
    import gpuprof

    a = gpuprof.analyze(SAMPLES / "ddp_slow_rank", workers=1)
    n = len(list((tmp_path / "cache" / "results").glob("*.msgpack")))
    assert n == 5  # a part and the contributions per rank, and the job's cross-rank replay
    b = gpuprof.analyze(SAMPLES / "ddp_slow_rank", workers=1)
    assert b.to_dict() == a.to_dict() and len(list((tmp_path / "cache" / "results").glob("*.msgpack"))) == n


def test_cache_keeps_to_its_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPUPROF_CACHE_MAX_GB bounds the cache: the least recently used entries go first."""
    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path / "cache"))
    import gpuprof

    files = []
    for name in ("a", "b"):
        f = tmp_path / f"{name}.json.gz"
        f.write_bytes((SAMPLES / ("gpt_bf16.json.gz" if name == "a" else "gpt_fp32.json.gz")).read_bytes())
        files.append(f)
        gpuprof.analyze(f)
    root = tmp_path / "cache"
    entries = list((root / "frames").iterdir())
    assert len(entries) == 2
    a_entry = next(e for e in entries if cache.content_key(files[0]) == e.name)
    b_entry = next(e for e in entries if e != a_entry)
    results = sorted((root / "results").glob("*.msgpack"), key=lambda f: f.stat().st_mtime)
    a_part, a_found, b_part, b_found = results  # made in that order (each trace's part, then its findings)
    gpuprof.analyze(files[0], step_ms=9.0)  # reads a's frames: a is now used more recently than b
    size = lambda e: sum(f.stat().st_size for f in e.iterdir()) if e.is_dir() else e.stat().st_size
    total = sum(size(e) for e in (root / "frames").iterdir())
    total += sum(size(f) for f in (root / "results").glob("*.msgpack"))
    gone = cache.prune(root, limit=total - size(a_part) - size(a_found) - size(b_entry))
    assert gone == [a_part, a_found, b_entry]  # the least recently used, oldest first
    assert a_entry.exists() and b_part.exists() and b_found.exists() and not b_entry.exists()


def test_several_slow_ranks_share_the_lost_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight ranks derived from the real slow-rank DDP pair (odd ranks are copies of the slow
    one): every slow rank's idle time inside the others' waits belongs to the imbalance finding,
    so no other finding claims it again (the launch-overhead saving stays what the 2-rank pair
    shows, about 1 ms, instead of the 56 ms of the slow ranks' sleeps)."""
    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path / "cache"))
    import gpuprof

    eight = gpuprof.analyze(_eight_ranks(tmp_path, "ddp_slow_rank"), workers=2)
    pair = gpuprof.analyze(SAMPLES / "ddp_slow_rank", workers=1)
    top = eight.findings[0]
    assert top.category == "rank_imbalance" and top.evidence["slow_ranks"] == [1, 3, 5, 7]
    assert top.title.startswith("4 ranks are slow (1, 3, 5, 7)")
    launch = {f.category: f.estimated_savings_ms for f in eight.findings}.get("launch_overhead", 0.0)
    launch_pair = {f.category: f.estimated_savings_ms for f in pair.findings}.get("launch_overhead", 0.0)
    assert launch < launch_pair + 1.0


def test_files_claiming_one_rank_are_told_apart_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two files that both say rank 0 (here: copies of a real DDP rank trace) become ranks 0 and 1
    by order, with their collectives, the same way whether ranks are analysed apart or in memory."""
    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path / "cache"))
    import gpuprof

    d = tmp_path / "same"
    d.mkdir()
    for name in ("a.json.gz", "b.json.gz"):
        (d / name).write_bytes((SAMPLES / "ddp_good" / "rank0.json.gz").read_bytes())
    apart = gpuprof.analyze(d, workers=2, as_ranks=True)  # two copies of one trace: only when told
    memory = gpuprof.analyze(d, workers=1, keep_traces=True, as_ranks=True)
    assert [p.rank for p in apart.parts] == [0, 1]
    assert [sorted(p.collectives["rank"].unique().tolist()) for p in apart.parts] == [[0], [1]]
    assert apart.to_dict() == memory.to_dict()


def test_a_bad_rank_trace_on_dask_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    import subprocess
    import sys

    d = tmp_path / "ranks"
    d.mkdir()
    (d / "rank0.json.gz").write_bytes((SAMPLES / "ddp_good" / "rank0.json.gz").read_bytes())
    (d / "rank1.json.gz").write_bytes((SAMPLES / "ddp_good" / "rank1.json.gz").read_bytes()[:20000])
    import os

    # distributed warns on stderr when another process holds its dashboard port (8787): not gpuprof's output
    env = {**os.environ, "PYTHONWARNINGS": "ignore:Port 8787 is already in use"}
    r = subprocess.run([sys.executable, "-m", "gpuprof.cli", "report", str(d), "--format", "json", "--dask", "local",
                        "--no-cache"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 3 and r.stdout == ""
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "rank1.json.gz: truncated gzip stream" in lines[0], r.stderr[-2000:]


# --- hostile caches (#15): nothing from the cache runs, nothing of the user's is deleted ---------

class _Planted:
    """A pickle payload: unpickling it would create the file named by ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, (f"touch {self.path}",))


def _results(root: Path) -> list[Path]:
    return sorted((root / "results").glob("r-*.msgpack"))


def test_planted_truncated_or_mistyped_results_never_run_and_are_recomputed(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stored result (here: a real trace's part and findings, and a 2-rank run's parts,
    findings and cross-rank replay) is replaced by a pickle that would run a command, by a truncated copy, and by
    valid msgpack of the wrong types: the command never runs, each report equals the first, and the
    entry is rewritten with a good value."""
    import pickle

    import msgspec

    import gpuprof

    root = tmp_path / "cache"
    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(root))
    ran = tmp_path / "ran"
    src = tmp_path / "t.json.gz"
    src.write_bytes((SAMPLES / "gpt_bf16.json.gz").read_bytes())
    seen: set[Path] = set()
    for target, kw in ((src, {}), (SAMPLES / "ddp_good", {"workers": 1})):
        first = gpuprof.analyze(target, **kw).to_dict()
        entries = [f for f in _results(root) if f not in seen]
        seen.update(entries)
        # a part and findings per rank, and (several ranks) the job's cross-rank replay
        assert len(entries) == (2 if not kw else 5)
        good = {f: f.read_bytes() for f in entries}
        for bad in (pickle.dumps(_Planted(ran)), None, msgspec.msgpack.encode({"parts": "x", "spec": [1, 2]})):
            for f in entries:
                f.write_bytes(good[f][: len(good[f]) // 2] if bad is None else bad)
            again = gpuprof.analyze(target, **kw)
            assert not ran.exists()
            assert again.to_dict() == first
            assert {f: f.read_bytes() for f in entries} == good  # recomputed and stored again
    assert gpuprof.analyze(src).frames is None  # the rewritten entry is read: no frames loaded


def test_planted_or_mistyped_frames_are_rebuilt(trace: Path) -> None:
    """A parse-cache entry whose meta has a wrong type, an extra field, or whose Parquet file was
    swapped for a pickle is dropped and rebuilt from the trace."""
    import pickle

    fresh = load_traces([trace], cache=False)[0]
    load_traces([trace])
    entry = _entry(trace)
    meta = json.loads((entry / "meta.json").read_text())
    tampered = [{**meta, "meta": {**meta["meta"], "rank": "zero"}}, {**meta, "code": "print(1)"}]
    for doc in tampered:
        (entry / "meta.json").write_text(json.dumps(doc))
        assert cache.load(trace, cache.content_key(trace)) is None and not entry.exists()
        assert len(load_traces([trace])[0].kernels) == len(fresh.kernels)
    (entry / "kernels.parquet").write_bytes(pickle.dumps(_Planted(trace.parent / "ran")))
    assert cache.load(trace, cache.content_key(trace)) is None and not entry.exists()
    assert not (trace.parent / "ran").exists()


def test_results_round_trip_exactly() -> None:
    """Parts (frames of every dtype they hold: str, categorical, float, int, bool), GPU specs and
    a rank's outcome (contributions, claims, replayed figures) of real traces come back from the
    codec identical, types included."""
    import dataclasses

    import gpuprof
    from gpuprof.analyzers import REGISTRY, select
    from gpuprof.claims import from_records, to_records
    from gpuprof.jobs import OutcomeRecord, PartResult, analyse_rank
    from tests.conftest import views

    for path in (SAMPLES / "gpt_bf16.json.gz", SAMPLES / "run_gpt_bf16", SAMPLES / "ddp_slow_rank" / "rank1.json.gz"):
        a = gpuprof.analyze(path, cache=False)
        active, _ = select(a.parts, a.spec)
        o = analyse_rank(views(a)[0], a.parts[0], active, [], alone=True)
        value = (o.contributions, to_records(o.claims), o.replay_ms, o.figures)
        back = cache.decode(cache.encode(value), OutcomeRecord)
        assert cache.same(back, value) and back[2] == a.replay_step_time_ms and back[3] == a.projection
        claims = from_records(back[1])
        assert [(c.id, c.kept, c.asked) for c in claims] == [(c.id, c.kept, c.asked) for c in o.claims]
        assert [dataclasses.asdict(c) for c in back[0]] == [dataclasses.asdict(c) for c in o.contributions]
        one = cache.decode(cache.encode((a.parts[0], a.spec)), PartResult)
        assert cache.same(one, (a.parts[0], a.spec))
        part = one[0]
        for name in ("steps", "kernels", "collectives"):
            pd.testing.assert_frame_equal(getattr(part, name), getattr(a.parts[0], name), check_exact=True)
        assert part.meta == a.parts[0].meta and one[1] == a.spec


def test_no_pickle_is_loaded_anywhere() -> None:
    import re

    from tests.conftest import ROOT

    uses = re.compile(r"^\s*(?:import|from)\s+(?:c?pickle|cloudpickle|dill|joblib|shelve)\b|pickle\.loads?\(|read_pickle",
                      re.MULTILINE)
    for folder in ("gpuprof", "analyzers", "reports"):
        for f in (ROOT / folder).rglob("*.py"):
            assert not uses.search(f.read_text()), f  # no pickle module at all: nothing read back can be one


def _user_data(root: Path) -> None:
    """A folder of the user's: a checkpoints/ folder, loose files, and a folder and a file that
    merely look like cache entries."""
    (root / "checkpoints").mkdir(parents=True, exist_ok=True)
    (root / "checkpoints" / "model.pt").write_bytes(b"\0" * 4096)
    (root / "notes.txt").write_text("mine")
    fake_key = "0" * 64 + "-10-v0.1.0-f3"
    (root / "frames" / fake_key).mkdir(parents=True)
    (root / "frames" / fake_key / "meta.json").write_text("{}")
    (root / "frames" / fake_key / "weights.bin").write_bytes(b"mine")  # not a file gpuprof writes
    (root / "results").mkdir(exist_ok=True)
    (root / "results" / "r-1234.msgpack").write_bytes(b"mine")  # not a gpuprof name
    (root / "results" / "summary.csv").write_text("mine")


def test_a_folder_of_user_data_is_never_marked_nor_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPUPROF_CACHE_DIR pointed at a folder of the user's data: no CACHEDIR.TAG is written into
    it (``tar --exclude-caches`` and backup tools would skip their data), nothing is cached there,
    nothing is pruned, and one warning says why."""
    import gpuprof

    root = tmp_path / "scratch"
    _user_data(root)
    mine = {p: (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}
    assert cache.prune(root, limit=0) == []  # no marker: not a gpuprof cache
    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(root))
    cache._REFUSED.clear()
    with pytest.warns(GpuprofWarning, match="holds files gpuprof did not write"):
        gpuprof.analyze(SAMPLES / "tiny_eager.json.gz")
    assert not (root / cache.MARKER).exists()
    assert {p: (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")} == mine
    r = subprocess.run([sys.executable, "-m", "gpuprof.cli", "report", str(SAMPLES / "tiny_eager.json.gz"),
                        "--format", "json"], capture_output=True, text=True, env={**os.environ, "GPUPROF_CACHE_DIR": str(root)})
    assert r.returncode == 0 and not (root / cache.MARKER).exists()
    lines = [x for x in r.stderr.splitlines() if "warning" in x]
    assert len(lines) == 1 and lines[0].startswith("gpuprof: warning: ") and "GPUPROF_CACHE_DIR" in lines[0], r.stderr


def test_an_empty_or_new_folder_is_marked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpuprof

    for root in (tmp_path / "empty", tmp_path / "new" / "cache"):
        if root.name == "empty":
            root.mkdir()
        monkeypatch.setenv("GPUPROF_CACHE_DIR", str(root))
        gpuprof.analyze(SAMPLES / "tiny_eager.json.gz")
        assert (root / cache.MARKER).is_file() and len(cache.entries(root)) == 3  # frames, part, findings


def test_prune_deletes_only_what_gpuprof_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache gpuprof made, into which other files were put later: pruning to nothing deletes
    every gpuprof entry and nothing else."""
    import gpuprof

    root = tmp_path / "scratch"
    monkeypatch.setenv("GPUPROF_CACHE_DIR", str(root))
    gpuprof.analyze(SAMPLES / "tiny_eager.json.gz")
    assert (root / cache.MARKER).is_file() and len(cache.entries(root)) == 3  # frames, part and findings
    ours = {e for _, _, e in cache.entries(root)}
    _user_data(root)
    mine = sorted(p for p in root.rglob("*") if p.name != cache.MARKER and not any(o in p.parents or o == p for o in ours))
    gone = cache.prune(root, limit=0)
    assert set(gone) == ours and all(not p.exists() for p in gone)
    assert sorted(p for p in root.rglob("*") if p.name != cache.MARKER) == mine


def test_stored_key_is_the_key_of_the_bytes_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace file is replaced by another real trace right after gpuprof's first or second read
    of it (as a concurrent writer would). Every frames entry is filed under the key of the bytes
    it was parsed from, and later reports of the path show whichever file is there then, never
    the other one's kernels from the cache."""
    import blake3

    import gpuprof
    from gpuprof import files
    from gpuprof.trace import load

    path = tmp_path / "t.json.gz"
    old, new = (SAMPLES / "gpt_bf16.json.gz").read_bytes(), (SAMPLES / "vision_inline.json.gz").read_bytes()
    names = {raw: set(gpuprof.analyze(src, cache=False).kernel_table["name"])
             for raw, src in ((old, SAMPLES / "gpt_bf16.json.gz"), (new, SAMPLES / "vision_inline.json.gz"))}
    kernels = {blake3.blake3(raw).hexdigest(): len(load.load_trace(path_of).kernels)
               for raw, path_of in ((old, SAMPLES / "gpt_bf16.json.gz"), (new, SAMPLES / "vision_inline.json.gz"))}
    real_read = files.read_file
    for replace_after in (1, 2):
        monkeypatch.setenv("GPUPROF_CACHE_DIR", str(tmp_path / f"cache{replace_after}"))
        path.write_bytes(old)
        reads = []

        def read_then_replace(p: Path, *a: object) -> bytes:
            data = real_read(p, *a)  # type: ignore[arg-type]
            if p == path:
                reads.append(1)
                if len(reads) == replace_after:
                    path.write_bytes(new)
            return data

        monkeypatch.setattr(files, "read_file", read_then_replace)
        gpuprof.analyze(path)
        monkeypatch.setattr(files, "read_file", real_read)
        assert path.read_bytes() == new and len(reads) >= replace_after
        for entry in (tmp_path / f"cache{replace_after}" / "frames").iterdir():
            h = entry.name.split("-")[0]
            assert h in kernels
            assert len(pd.read_parquet(entry / "kernels.parquet")) == kernels[h]  # frames of the hashed bytes
        for raw in (old, new, old):
            path.write_bytes(raw)
            assert set(gpuprof.analyze(path).kernel_table["name"]) == names[raw]
