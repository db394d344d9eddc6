"""What the page and the terminal say about their own numbers (issue 27): memory without
totals, pages without data, the projection line, the wording of a finding's head.

SYNTHETIC traces are built in the test (conftest.TraceBuilder) and say so; real traces come from
sample_traces/."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import gpuprof
from tests.conftest import SAMPLES, TraceBuilder, simple_training_trace


def _memory_events(b: TraceBuilder, sizes: list[int], totals: bool, t0: float = 20.0) -> None:
    """SYNTHETIC ``[memory]`` instants on GPU 0, every 30 µs from ``t0``; ``totals`` writes the
    allocator's totals after each (torch 1.10+), else only the bytes (torch 1.9)."""
    held = 1_000_000
    for i, n in enumerate(sizes):
        held += n
        args: dict[str, Any] = {"Device Type": 1, "Device Id": 0, "Bytes": n, "Addr": 1000 + i}
        if totals:
            args |= {"Total Allocated": held, "Total Reserved": 4_000_000}
        b.events.append({"ph": "i", "s": "t", "name": "[memory]", "pid": 10, "tid": 1, "ts": b.offset + t0 + 30 * i,
                         "args": args})


def test_memory_without_totals_is_the_running_sum(tmp_path: Path) -> None:
    """SYNTHETIC torch-1.9-style memory events (bytes, no totals): the view draws what was
    allocated since the trace began (it raised All-NaN in np.nanargmax), the page says so."""
    b = simple_training_trace(TraceBuilder())
    sizes = [4096, 8192, -4096, 65536, -8192, -65536]
    _memory_events(b, sizes, totals=False)
    a = gpuprof.analyze(b.write(tmp_path / "m19.json"), cache=False)
    m = a.views_detail()["memory"]
    assert m["relative"] and m["reserved"] is None and m["reserved_peak_bytes"] is None
    assert m["peak_bytes"] == 4096 + 8192 - 4096 + 65536
    assert m["allocated"][-1] == 0
    html = a.to_html()
    assert "since the trace began" in html and "records each allocation but not the allocator" in html


def test_memory_with_totals_is_unchanged(tmp_path: Path) -> None:
    b = simple_training_trace(TraceBuilder())
    _memory_events(b, [4096, 8192, -4096], totals=True)
    m = gpuprof.analyze(b.write(tmp_path / "m.json"), cache=False).views_detail()["memory"]
    assert not m["relative"] and m["peak_bytes"] == 1_000_000 + 4096 + 8192
    assert m["reserved_peak_bytes"] == 4_000_000


# --- the timeline: lanes for every thread at once, summarised past a page ------------------------

def test_many_host_threads_share_a_lane(tmp_path: Path) -> None:
    """SYNTHETIC (benchmarks/timeline_lanes.py builds it in code): 3,000 host threads each running
    one op in the step beside the main thread. The timeline gives the busiest threads lanes of
    their own and the rest one lane per level, every item kept; built for all threads at once
    (the old per-thread loop took ~10 ms a thread: 30 s here, 1,165 s at 100k; the bound is
    checked by `python -m benchmarks.timeline_lanes`, not timed here)."""
    from benchmarks.timeline_lanes import write
    from gpuprof.views import MAX_HOST_THREADS

    a = gpuprof.analyze(write(tmp_path / "threads.json.gz", 3000), cache=False)
    tl = a.views_detail()["timeline"]
    names = [ln["name"] for ln in tl["lanes"]]
    host = [n for n in names if n.startswith("CPU")]
    assert tl["threads_summarised"] == 3001 - MAX_HOST_THREADS
    assert len(host) == 2 * MAX_HOST_THREADS + 2  # ops and runtime lanes each, and the shared pair
    assert "CPU thread 1 · ops" in names  # the main thread, busiest, keeps its lanes
    assert f"CPU: {3001 - MAX_HOST_THREADS:,} more threads · ops" in names
    host_items = sum(1 for x in tl["items"]["lane"] if tl["lanes"][x]["kind"] == "host")
    assert host_items == 50 * 2 + 3000 * 2 and tl["dropped"] == 0  # every thread's op and call kept
    shared = names.index(f"CPU: {3001 - MAX_HOST_THREADS:,} more threads · ops")
    assert tl["items"]["lane"].count(shared) == 3000 - (MAX_HOST_THREADS - 1)
    html = a.to_html()
    assert f"{3001 - MAX_HOST_THREADS:,} host threads, the least busy in this step, share one lane" in html


def test_allocator_finding_outlines_the_calls_that_cause_it() -> None:
    """GP-ALLOC claims the idle gaps; the timeline also outlines the cudaMalloc/cudaFree calls of
    the step that cause them (issue 27), apart from the claims (which sum to the saving)."""
    a = gpuprof.analyze(SAMPLES / "gpt_no_caching_allocator.json.gz")
    tl = a.views_detail()["timeline"]
    fid = next(f.id for f in a.findings if f.category == "allocator_churn")
    causes = tl["causes"][fid]
    assert causes and {tl["strings"][tl["items"]["name"][i]] for i in causes} <= {"cudaMalloc", "cudaFree"}
    assert not set(causes) & set(tl["findings"][fid])
    lanes = {tl["items"]["lane"][i] for i in causes}
    assert all(tl["lanes"][x]["name"].endswith("· runtime") for x in lanes)


# --- what a page says where it has no data ---------------------------------------------------------

def test_views_without_data_say_what_is_missing(tmp_path: Path) -> None:
    """SYNTHETIC trace without device properties (an unknown GPU) and without memory events: the
    roofline and memory views say what is missing and how to record it, never an empty chart."""
    b = simple_training_trace(TraceBuilder(device=None))
    html = gpuprof.analyze(b.write(tmp_path / "nogpu.json"), cache=False).to_html()
    roof = html.split('<section id="roofline">', 1)[1].split("</section>", 1)[0]
    assert 'id="chart-roofline"' not in roof and "No roofline" in roof and "--gpu KEY" in roof
    assert "--gpu-spec" in roof and "gpuprof calibrate" in roof
    mem = html.split('<section id="memory">', 1)[1].split("</section>", 1)[0]
    assert "No GPU memory events" in mem and "profile_memory=True" in mem


def test_gpu_only_trace_says_why_it_has_no_operators() -> None:
    html = gpuprof.analyze(SAMPLES / "gpt_gpu_only.json.gz").to_html()
    ops = html.split('<section id="operators">', 1)[1].split("</section>", 1)[0]
    assert "No operators" in ops and "activities=[CUDA]" in ops


# --- the headline projection says what it is -------------------------------------------------------

def test_projection_line_names_what_it_leaves_out_and_its_baseline() -> None:
    """ddp_slow_rank: 'apply fixes 3–4' while fix 1 alone saves 40 ms: the line says fixes 1, 2
    and 5 are left out for low confidence. gpt_python_inline: its baseline (24.5 ms) is the
    traced 48.5 ms step replayed without the profiler's host cost, and the line says so."""
    from gpuprof.reports.text import projection_line

    a = gpuprof.analyze(SAMPLES / "ddp_slow_rank")
    doc = a.to_dict()
    line = projection_line(doc["summary"], doc["findings"], 2)
    low = [i for i, f in enumerate(doc["findings"], 1) if f["confidence"] == "low" and f["estimated_savings_ms"] > 0]
    assert low and line is not None and "leaves out" in line and "(low confidence" in line
    assert all(str(i) in line.split("leaves out", 1)[1] for i in low)
    a = gpuprof.analyze(SAMPLES / "gpt_python_inline.json.gz")
    s = a.summary
    line = projection_line(s, a.to_dict()["findings"])
    assert line is not None and f"from {s['projected_from_ms']:.1f} ms, the traced step ({s['step_time_ms']:.1f} ms)" in line
    assert "profiler's estimated host cost taken out" in line
    text = a.to_text(width=80)
    assert "leaves out" in text and max(len(ln) for ln in text.splitlines()) <= 80


def test_cross_rank_fix_of_one_rank_trace_is_said_to_be_left_out() -> None:
    a = gpuprof.analyze(SAMPLES / "ddp_slow_rank" / "rank0.json.gz")
    text = a.to_text(width=120)
    assert "cross-rank: one rank's replay cannot see when the others arrive" in text


def test_a_findings_head_says_severity_and_confidence_apart() -> None:
    text = gpuprof.analyze(SAMPLES / "gpt_fp32.json.gz").to_text(width=200)
    heads = [ln for ln in text.splitlines() if ln.lstrip().startswith("1. [")]
    assert heads and heads[0].lstrip().startswith("1. [severity ") and ", confidence " in heads[0]


def test_operators_are_per_step_and_keep_their_namespace() -> None:
    """The kernel table is per step: so is the operators table (times over the profiled steps
    divided by their number); aten::detach and the detach it calls are two rows, named apart."""
    a = gpuprof.analyze(SAMPLES / "gpt_bf16.json.gz")
    ops = a.operators_table(400)
    steps = a.summary["steps"]
    mm = next(o for o in ops if o["name"] == "aten::mm")
    assert mm["gpu_ms_per_step"] == pytest.approx(mm["gpu_us"] / 1000 / steps)
    html = a.to_html()
    table = html.split('id="op-table"', 1)[1].split("</table>", 1)[0]
    labels = re.findall(r'<td class="name" title="[^"]*">([^<]*)</td>', table)
    assert "aten::detach" in labels and "detach" in labels and len(labels) == len(set(labels))
    assert "GPU ms / step" in table


# --- in a real browser -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser() -> Any:
    import os

    from tests.browser import Browser, chromium

    exe = chromium()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing on CI: .ci/run installs Debian's chromium package")
        pytest.skip("Chromium is not installed (apt-get install chromium); .ci/run installs it")
    with Browser(exe) as b:
        yield b


def _shown(b: Any) -> list[str]:
    return list(b.evaluate("Array.prototype.filter.call(document.querySelectorAll('main > section'), "
                           "s => s.style.display !== 'none').map(s => s.id)"))


def test_no_view_is_a_blank_page(browser: Any, tmp_path: Path) -> None:
    """#view=memory without memory events shows the sentence saying how to record them;
    #view=bogus shows the whole report and names the views there are; neither logs an error."""
    from tests.browser import page_url

    page = tmp_path / "r.html"
    gpuprof.analyze(SAMPLES / "gpt_fp32.json.gz").to_html(page)
    assert browser.open(page_url(page, "view=memory")) == []
    assert _shown(browser) == ["memory"]
    assert "profile_memory=True" in browser.evaluate("document.getElementById('memory').textContent")
    assert browser.open(page_url(page, "view=bogus")) == []
    shown = _shown(browser)
    assert {"summary", "findings", "timeline", "memory"} <= set(shown)
    said = browser.evaluate("document.getElementById('unknown-view').textContent")
    assert "no view named \u201cbogus\u201d" in said and "#view=timeline" in said


def test_unknown_gpu_roofline_says_how_to_name_it(browser: Any, tmp_path: Path) -> None:
    from tests.browser import page_url

    page = tmp_path / "r.html"
    gpuprof.analyze(simple_training_trace(TraceBuilder(device=None)).write(tmp_path / "t.json"), cache=False).to_html(page)
    assert browser.open(page_url(page, "view=roofline")) == []
    assert _shown(browser) == ["roofline"]
    assert "--gpu KEY" in browser.evaluate("document.getElementById('roofline').textContent")


def test_finding_link_keeps_its_selector_in_view_and_opens_on_the_gpu(browser: Any, tmp_path: Path) -> None:
    """#finding=ID scrolls to the timeline's section (heading and selectors in view, not the chart's
    top edge); gpt_fp32's host runs 80 ms ahead, so the chart opens on the GPU's own window and
    offers the whole step."""
    from tests.browser import page_url

    a = gpuprof.analyze(SAMPLES / "gpt_fp32.json.gz")
    page = tmp_path / "r.html"
    a.to_html(page)
    fid = a.findings[0].id
    assert browser.open(page_url(page, f"finding={fid}")) == []
    top = browser.evaluate("document.getElementById('finding-select').getBoundingClientRect().top")
    assert 0 <= top < 300, top
    assert browser.evaluate("document.getElementById('chart-timeline').getAttribute('data-highlighted')") == fid
    tl = a.views_detail()["timeline"]
    lo, hi = browser.evaluate("document.getElementById('chart-timeline').layout.xaxis.range")
    assert lo == pytest.approx(tl["gpu_start_us"] / 1000, rel=0.05) and hi == pytest.approx(tl["window_us"] / 1000,
                                                                                               rel=0.05)
    browser.evaluate("(s => { s.value = 'all'; s.dispatchEvent(new Event('change')); })"
                     "(document.getElementById('timeline-window'))")
    lo, _ = browser.evaluate("document.getElementById('chart-timeline').layout.xaxis.range")
    assert lo < 0.05 * tl["window_us"] / 1000


def test_allocator_calls_are_outlined_in_the_browser(browser: Any, tmp_path: Path) -> None:
    from tests.browser import page_url

    a = gpuprof.analyze(SAMPLES / "gpt_no_caching_allocator.json.gz")
    page = tmp_path / "r.html"
    a.to_html(page)
    fid = next(f.id for f in a.findings if f.category == "allocator_churn")
    assert browser.open(page_url(page, f"finding={fid}")) == []
    tl = a.views_detail()["timeline"]
    got = browser.evaluate("document.getElementById('chart-timeline').getAttribute('data-causes-count')")
    assert int(got) == len(tl["causes"][fid]) > 0
    assert "allocator calls that cause them" in browser.evaluate("document.getElementById('highlight-count').textContent")


def test_breakdown_legend_clears_the_axis_title(browser: Any, tmp_path: Path) -> None:
    """'Where each step's time goes': the legend and the x axis's title do not overlap."""
    from tests.browser import page_url

    page = tmp_path / "r.html"
    gpuprof.analyze(SAMPLES / "gpt_python_inline.json.gz").to_html(page)
    assert browser.open(page_url(page, "view=breakdown")) == []
    legend, title = browser.evaluate(
        "(el => [el.querySelector('.legend').getBoundingClientRect(), el.querySelector('.xtitle').getBoundingClientRect()]"
        ".map(r => [r.top, r.bottom]))(document.getElementById('chart-breakdown'))")
    assert legend[1] <= title[0] or title[1] <= legend[0], (legend, title)
