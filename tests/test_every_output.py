"""Every output on every trace the project can reach (issue 27): the HTML page opened in headless
Chromium with what it logged checked, the terminal summary at 80 and 200 columns, the JSON
report, the annotated trace, and ``diff`` of two traces of one program.

Corpora: ``sample_traces/`` (the H200 samples, their held-out pairs, round 6's recorded on an H100,
their framework runs, the regions' traces), ``../shared/traces/public`` and
``../shared/traces/hta`` (Holistic Trace Analysis's own test traces); the shared ones are skipped
with the reason where they are absent.

Each trace is analysed once and each output rendered once, for the whole session, by a pool of
processes (:func:`rendered`); the pages are then opened by one Chromium per core
(:func:`browsed`, tests/browser.py). Only the traces of the tests selected are rendered. The
analyses go through the suite's parse and results caches, so later tests of the same traces
read them back. A trace may be refused, in one line with its exit code, never by a traceback.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import threading
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from benchmarks.pairs import HELD_OUT_DIRS
from tests.conftest import ROOT, SAMPLES

SHARED = ROOT / ".." / "shared" / "traces"
PUBLIC, HTA = SHARED / "public", SHARED / "hta"
WIDTHS = (80, 200)


def _samples() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for p in sorted(SAMPLES.iterdir()):
        if p.name.endswith(".json.gz") or (p.is_dir() and p.name not in ("timings", "heldout", "frameworks")):
            out[f"samples/{p.name.removesuffix('.json.gz')}"] = p
    for held in HELD_OUT_DIRS:  # h200/heldout and h100/heldout (round 6)
        for p in sorted(held.glob("*.json.gz")):
            out[f"samples/heldout/{p.name.removesuffix('.json.gz')}"] = p
    for p in sorted(x for x in (SAMPLES / "heldout").iterdir() if (x / "manifest.json").is_file()):
        out[f"samples/heldout/{p.name}"] = p  # run folders of gpuprof record (round 5)
    for p in sorted(x for x in (SAMPLES / "frameworks").iterdir() if x.is_dir()):
        out[f"samples/frameworks/{p.name}"] = p
    for p in sorted((ROOT / "sample_traces" / "regions").glob("*.json.gz")):
        out[f"samples/regions/{p.name.removesuffix('.json.gz')}"] = p
    return out


def _public() -> dict[str, Path]:
    if not (PUBLIC / "MANIFEST.json").is_file():
        return {}
    entries = json.loads((PUBLIC / "MANIFEST.json").read_text())["entries"]
    return {f"public/{e['file']}": PUBLIC / e["file"] for e in entries}


def _hta() -> dict[str, Path]:
    if not HTA.is_dir():
        return {}
    return {f"hta/{p.name}": p for p in sorted(HTA.iterdir()) if p.name.endswith((".json", ".json.gz"))}


SUBJECTS: dict[str, Path] = {**_samples(), **_public(), **_hta()}


def _pairs() -> dict[str, tuple[str, str]]:
    """Two traces of one program: every bad/good pair of the samples (tuned and held out), and
    the twins of the shared corpora (one program on two GPUs, before and after a change)."""
    out: dict[str, tuple[str, str]] = {}
    for f in ("pairs.json", "heldout_pairs.json"):
        for p in json.loads((SAMPLES / f).read_text())["pairs"]:
            sub = "heldout/" if f.startswith("heldout") else ""
            b, g = f"samples/{sub}{p['bad']}", f"samples/{sub}{p['good']}"
            if b in SUBJECTS and g in SUBJECTS:
                out[f"{b} -> {g.rsplit('/', 1)[1]}"] = (b, g)
    twins = [("public/kineto/nw0_jan2021.pt.trace.json.gz", "public/kineto/nw4_jan2021.pt.trace.json.gz"),
             ("public/tb/nw0_a.pt.trace.json.gz", "public/tb/nw4_a.pt.trace.json.gz"),
             ("public/tb/nw0_old.pt.trace.json.gz", "public/tb/nw4_old.pt.trace.json.gz"),
             ("public/tracelens/h100__gaunernst_bert-small-uncased__1016001.json.gz",
              "public/tracelens/mi300__gaunernst_bert-small-uncased__1016001.json.gz"),
             ("public/tracelens/h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
              "public/tracelens/mi300__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"),
             ("public/misc/sidnb13_transformer_af68c4771c1b09a4d1e797ed00f1ddda22355edc.pt.trace.json",
              "public/misc/sidnb13_transformer_fd9e0c101ec3b1f0dde0526120844f29d042385b.pt.trace.json"),
             ("hta/tests_data_trace_diff_control_control.json.gz", "hta/tests_data_trace_diff_test_test.json.gz"),
             ("hta/tests_data_trace_compare_base_base.json.gz", "hta/tests_data_trace_compare_test_test.json.gz")]
    for b, g in twins:
        out[f"{b} -> {g.rsplit('/', 1)[1]}"] = (b, g)
    return out


PAIRS = _pairs()


def _skip_absent(subject: str) -> None:
    if subject not in SUBJECTS:
        corpus = PUBLIC if subject.startswith("public/") else HTA
        pytest.skip(f"shared trace corpus not here ({corpus.resolve()}): {subject}")


# --- rendering: each trace once per output, in a pool of processes ------------------------------

def render(subject: str, path: str, out: str) -> dict[str, Any]:
    """In a worker: analyse one trace and write every output of it under ``out``; what each
    took and any exception, as plain data (never raised: the test says which output failed)."""
    import time
    import warnings

    import gpuprof
    from gpuprof.errors import GpuprofError, GpuprofWarning

    res: dict[str, Any] = {"subject": subject, "errors": {}, "files": {}, "s": {}}
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", GpuprofWarning)
        t0 = time.perf_counter()
        try:
            a = gpuprof.analyze(path)
        except GpuprofError as e:
            res["refused"] = {"exit_code": e.exit_code, "message": str(e)}
            return res
        except Exception:
            res["errors"]["analyze"] = traceback.format_exc()
            return res
        res["s"]["analyze"] = time.perf_counter() - t0

        def step(name: str, fn: Any) -> None:
            t = time.perf_counter()
            try:
                fn()
            except Exception:
                res["errors"][name] = traceback.format_exc()
            res["s"][name] = time.perf_counter() - t

        def write(name: str, text: str) -> None:
            (d / name).write_text(text, encoding="utf-8", errors="backslashreplace")
            res["files"][name] = str(d / name)

        step("json", lambda: write("report.json", a.to_json()))
        for w in WIDTHS:
            step(f"text{w}", lambda w=w: write(f"text{w}.txt", a.to_text(width=w)))
        step("html", lambda: write("report.html", a.to_html()))

        def annotate() -> None:
            from gpuprof.reports.annotate import annotated_bytes
            from gpuprof.views import annotation_data

            res["annotated"] = []
            for r in annotation_data(a, a.ranks):
                body, n = annotated_bytes(r, gzipped=False)
                f = d / f"annotated.rank{r['rank']}.json"
                f.write_bytes(body)
                res["annotated"].append({"file": str(f), "source": r["path"], "added": n,
                                         "kernels": len(r["kernels"])})

        step("annotate", annotate)
    res["warnings"] = [str(w.message) for w in seen if issubclass(w.category, GpuprofWarning)]
    return res


def _wanted(session: pytest.Session, arg: str) -> list[str]:
    return sorted({item.callspec.params[arg] for item in session.items
                   if item.module is not None and item.module.__name__ == __name__
                   and hasattr(item, "callspec") and arg in item.callspec.params})


@pytest.fixture(scope="session")
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every selected trace's outputs (both sides of each selected diff pair included), rendered
    by one process per core."""
    wanted = set(_wanted(request.session, "subject"))
    for pair in _wanted(request.session, "pair"):
        wanted |= set(PAIRS[pair])
    todo = sorted(s for s in wanted if s in SUBJECTS)
    root = tmp_path_factory.mktemp("every-output")
    workers = max(1, min(len(todo), len(os.sched_getaffinity(0))))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        futures = {s: ex.submit(render, s, str(SUBJECTS[s]), str(root / re.sub(r"[^\w.-]+", "_", s)))
                   for s in todo}
        return {s: f.result() for s, f in futures.items()}


#: What each page is checked for in the browser: charts that drew nothing, and sections with
#: neither a chart, a table row, a finding, nor a sentence saying what is missing.
PAGE_CHECK = """(() => {
  const bare = Array.from(document.querySelectorAll('[id^="chart-"]')).filter(c => !c.querySelector('.main-svg'))
    .map(c => c.id);
  const empty = Array.from(document.querySelectorAll('main > section')).filter(s =>
    !s.querySelector('.main-svg, td, .finding, .missing, .none, .kpi, li')).map(s => s.id);
  return {bare: bare, empty: empty, sections: document.querySelectorAll('main > section').length};
})()"""


def _diff_pages(rendered: dict[str, dict[str, Any]], pairs: list[str], root: Path) -> dict[str, dict[str, Any]]:
    """The diff document, text and page of each pair (from the two JSON reports: what
    ``gpuprof diff`` renders after analysing both)."""
    from gpuprof.compare import compare
    from gpuprof.reports.diff import render_diff_html, render_diff_text

    out: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        b, g = (rendered.get(s, {}) for s in PAIRS[pair])
        if "report.json" not in b.get("files", {}) or "report.json" not in g.get("files", {}):
            continue
        res: dict[str, Any] = {}
        try:
            doc = compare(*(json.loads(Path(x["files"]["report.json"]).read_text()) for x in (b, g)))
            res["doc"], res["text"] = doc, render_diff_text(doc)
            page = root / (re.sub(r"[^\w.-]+", "_", pair) + ".html")
            page.write_text(render_diff_html(doc), encoding="utf-8", errors="backslashreplace")
            res["html"] = str(page)
        except Exception:
            res["error"] = traceback.format_exc()
        out[pair] = res
    return out


@pytest.fixture(scope="session")
def diffs(request: pytest.FixtureRequest, rendered: dict[str, dict[str, Any]],
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return _diff_pages(rendered, _wanted(request.session, "pair"), tmp_path_factory.mktemp("diffs"))


@pytest.fixture(scope="session")
def browsed(rendered: dict[str, dict[str, Any]], diffs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every rendered page (reports and diffs) opened in headless Chromium, one browser per
    core: what it logged and what :data:`PAGE_CHECK` found."""
    from tests.browser import Browser, chromium, page_url

    exe = chromium()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing on CI: .ci/run installs Debian's chromium package")
        pytest.skip("Chromium is not installed (apt-get install chromium); .ci/run installs it")
    pages = [(s, r["files"]["report.html"]) for s, r in sorted(rendered.items()) if "report.html" in r["files"]]
    pages += [(f"diff: {p}", d["html"]) for p, d in sorted(diffs.items()) if "html" in d]
    out: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def work(share: list[tuple[str, str]]) -> None:
        with Browser(exe) as b:
            for key, page in share:
                try:
                    got = {"logged": b.open(page_url(Path(page))), **b.evaluate(PAGE_CHECK)}
                except Exception:
                    got = {"failed": traceback.format_exc()}
                with lock:
                    out[key] = got

    n = max(1, min(len(pages), len(os.sched_getaffinity(0))))
    threads = [threading.Thread(target=work, args=(pages[i::n],)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


# --- the checks -----------------------------------------------------------------------------------

def _outcome(rendered: dict[str, dict[str, Any]], subject: str) -> dict[str, Any]:
    _skip_absent(subject)
    r = rendered[subject]
    assert "analyze" not in r["errors"], r["errors"]["analyze"]
    if "refused" in r:  # a refusal is one line naming the file and the problem, with its exit code
        ref = r["refused"]
        assert ref["exit_code"] in (2, 3, 4) and "\n" not in ref["message"], ref
        pytest.skip(f"refused (exit {ref['exit_code']}): {ref['message']}")
    return r


@pytest.mark.parametrize("subject", sorted(SUBJECTS) or ["(none)"])
def test_json_report(rendered: dict[str, dict[str, Any]], subject: str) -> None:
    r = _outcome(rendered, subject)
    assert "json" not in r["errors"], r["errors"]["json"]
    doc = json.loads(Path(r["files"]["report.json"]).read_text())
    assert doc["schema_version"] == 1 and doc["summary"]["steps"] >= 1
    fields = set(doc["findings"][0]) if doc["findings"] else None
    for n in doc["notes"]:  # notes have the findings' fields
        assert "ranked_by_ms" in n and (fields is None or set(n) == fields), n
    # a replay that could not be built is a note, but on these traces it is a bug to fix
    assert not [w for w in doc["warnings"] if w.startswith("no replay")], r["warnings"]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("subject", sorted(SUBJECTS) or ["(none)"])
def test_text_report_fits_the_width(rendered: dict[str, dict[str, Any]], subject: str, width: int) -> None:
    r = _outcome(rendered, subject)
    assert f"text{width}" not in r["errors"], r["errors"][f"text{width}"]
    text = Path(r["files"][f"text{width}.txt"]).read_text(encoding="utf-8")
    assert "What to fix first" in text and "Top kernels" in text
    # nothing past the width but a single word longer than a line (a path), which is never cut
    over = [ln for ln in text.splitlines() if len(ln) > width and len(ln.split()) > 1]
    assert not over, over
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f]", text)  # no control character from a trace


@pytest.mark.parametrize("subject", sorted(SUBJECTS) or ["(none)"])
def test_html_page_in_chromium(browsed: dict[str, dict[str, Any]], rendered: dict[str, dict[str, Any]],
                               subject: str) -> None:
    r = _outcome(rendered, subject)
    assert "html" not in r["errors"], r["errors"]["html"]
    got = browsed[subject]
    assert "failed" not in got, got.get("failed")
    assert got["logged"] == [], got["logged"]
    assert got["bare"] == [] and got["empty"] == [], got
    assert got["sections"] >= 8


@pytest.mark.parametrize("subject", sorted(SUBJECTS) or ["(none)"])
def test_annotated_trace(rendered: dict[str, dict[str, Any]], subject: str) -> None:
    """The annotated trace keeps every original event, byte for byte and in order, and adds the
    gpuprof process (a class span per kernel at least)."""
    import gzip

    import msgspec

    r = _outcome(rendered, subject)
    assert "annotate" not in r["errors"], r["errors"]["annotate"]
    for ann in r["annotated"]:
        body = Path(ann["file"]).read_bytes()
        src = Path(ann["source"]).read_bytes()
        src = gzip.decompress(src) if src[:2] == b"\x1f\x8b" else src
        events = msgspec.json.decode(body, type=list[msgspec.Raw] if body.lstrip()[:1] == b"[" else
                                     dict[str, msgspec.Raw])
        mine = events if isinstance(events, list) else msgspec.json.decode(events["traceEvents"],
                                                                             type=list[msgspec.Raw])
        theirs = msgspec.json.decode(src, type=list[msgspec.Raw] if src.lstrip()[:1] == b"[" else dict[str, msgspec.Raw])
        orig = theirs if isinstance(theirs, list) else msgspec.json.decode(theirs["traceEvents"], type=list[msgspec.Raw])
        assert len(mine) == len(orig) + ann["added"]
        assert [bytes(e) for e in mine[: len(orig)]] == [bytes(e) for e in orig]
        assert ann["added"] >= 3 + ann["kernels"]


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_diff_of_two_traces_of_one_program(diffs: dict[str, dict[str, Any]], browsed: dict[str, dict[str, Any]],
                                           rendered: dict[str, dict[str, Any]], pair: str) -> None:
    for s in PAIRS[pair]:
        _outcome(rendered, s)
    d = diffs[pair]
    assert "error" not in d, d["error"]
    doc = d["doc"]
    assert doc["step"]["basis"] in ("traced", "without the profiler") and doc["step"]["before"] > 0
    assert "step time (trace)" in d["text"]
    for side in ("before", "after"):  # a host-bound side is said to be, in the text
        if doc[side]["host_bound"]:
            assert f"{side} is host-bound under the profiler" in d["text"]
    got = browsed[f"diff: {pair}"]
    assert "failed" not in got and got["logged"] == [] and got["bare"] == [], got
