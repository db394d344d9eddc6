"""The HTML report as a person sees it: offline, escaped, and rendered by a real Chromium.

Chromium comes from Debian's `chromium` package, which .ci/run installs; under CI a missing
Chromium fails the test, elsewhere it is skipped with that reason (never reported as passed).
"""

from __future__ import annotations

import html as html_mod
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import gpuprof
from tests.conftest import ROOT, SAMPLES, TraceBuilder

EVIL_KERNEL = "</script><script>document.title='pwned-kernel'</script><b>k</b>"
EVIL_OP = "aten::<img src=x onerror=\"document.title='pwned-op'\">"
EVIL_STEP = "ProfilerStep#1"
ARTIFACTS = ROOT / "test-artifacts"


def hostile_trace(tmp: Path) -> Path:
    """SYNTHETIC trace whose kernel and op names are HTML and script."""
    b = TraceBuilder()
    b.annotation(EVIL_STEP, 0, 1000)
    ext = b.op(EVIL_OP, 10, 50, [[64, 64], [64, 64]], ["float", "float"])
    b.launch(EVIL_KERNEL, 12, 100, 30.0, ext)
    mm = b.op("aten::mm", 100, 50, [[4096, 4096], [4096, 4096]], ["c10::BFloat16", "c10::BFloat16"])
    b.launch("nvjet_sm90_tst_<i>x</i>", 102, 200, 300.0, mm, grid=(132, 1, 1))
    return b.write(tmp / "hostile.json")


def test_names_from_traces_are_escaped(tmp_path: Path) -> None:
    html = gpuprof.analyze(hostile_trace(tmp_path)).to_html()
    assert "<script>document.title" not in html and "<img src=x" not in html and "<i>x</i>" not in html
    assert "&lt;/script&gt;&lt;script&gt;document.title=" in html  # shown as text in the table
    # in chart labels (plotly reads a subset of HTML): escaped, then JSON-escaped for the script block
    assert "nvjet_sm90_tst_\\u0026lt;i\\u0026gt;x" in html


def test_report_is_offline_and_self_contained() -> None:
    html = gpuprof.analyze(SAMPLES / "run_gemm_loop").to_html()
    tags = re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", html)
    assert tags and all("src=" not in t and "href=" not in t for t in tags), tags
    assert html.count("<script>") == 2 and 'id="gpuprof-charts"' in html  # plotly.js once, our code once
    for section in ("What to fix first", "Where each step", "Roofline", "GPU samples (NVML)", "Top kernels"):
        assert section in html
    assert len(html) < 10_000_000


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing on CI: .ci/run installs Debian's chromium package")
        pytest.skip("Chromium is not installed (apt-get install chromium); .ci/run installs it")
    return exe


def _open(exe: str, page: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp / 'chromium-profile'}", "--virtual-time-budget=10000",
             "--enable-logging=stderr", "--v=0"]
    return subprocess.run([exe, *flags, *extra, page.as_uri()], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("sample", ["run_gemm_loop", "ddp_slow_rank", "gpt_vocab50257.json.gz"])
def test_chromium_renders_every_plot_without_errors(sample: str, tmp_path: Path) -> None:
    exe = _chromium()
    page = tmp_path / "report.html"
    gpuprof.analyze(SAMPLES / sample).to_html(page)
    dom = _open(exe, page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln]
    assert not [ln for ln in console if re.search(r"error|uncaught", ln, re.I)], console
    charts = re.findall(r'<div id="chart-([\w]+)" class="chart[^"]*"', dom.stdout)
    assert {"breakdown", "roofline"} <= set(charts)
    for c in charts:  # each plot has drawn its SVG
        block = dom.stdout.split(f'id="chart-{c}"', 1)[1][:20000]
        assert 'class="main-svg"' in block, c
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"report-{sample.split('.')[0]}.png"
    _open(exe, page, tmp_path, "--window-size=1300,2400", f"--screenshot={shot}")
    assert shot.is_file() and shot.stat().st_size > 20_000


def test_chromium_runs_nothing_from_trace_names(tmp_path: Path) -> None:
    exe = _chromium()
    page = tmp_path / "hostile.html"
    gpuprof.analyze(hostile_trace(tmp_path)).to_html(page)
    dom = _open(exe, page, tmp_path, "--dump-dom").stdout
    assert "pwned" not in dom.split("<title>", 1)[1].split("</title>", 1)[0]
    assert "&lt;/script&gt;&lt;script&gt;document.title='pwned-kernel'" in dom  # displayed as text


@pytest.mark.parametrize("sample", ["ddp_slow_rank", "gpt_bf16.json.gz"])
def test_page_names_its_trace_and_shows_kernels_per_step(sample: str, tmp_path: Path) -> None:
    """The page says what it reports; the Ranks chart keeps its two series apart and its ticks
    inside; the kernel table is per step with one-line rows (short names, full name kept)."""
    a = gpuprof.analyze(SAMPLES / sample)
    doc = a.to_dict()
    html = a.to_html()
    subject = sample if sample.endswith(".gz") else f"{sample}/ (2 traces)"
    assert f"<title>gpuprof report · {subject}" in html
    assert html.count(doc["source"]["paths"][0]) >= 1  # the full path in the header
    if sample == "gpt_bf16.json.gz":  # host-side finding from a profiled host: say how to correct it
        assert "Hint:" in html and "--step-ms" in html and "confidence low" in html
    steps = doc["summary"]["steps"] * len(doc["source"]["ranks"])
    k = doc["kernels"][0]
    assert k["ms_per_step"] == pytest.approx(k["total_us"] / 1000 / steps)
    assert f'<td data-v="{k["ms_per_step"]}">{k["ms_per_step"]:.3f}</td>' in html
    cells = re.findall(r'<td class="kname" title="[^"]*">(.*?)</td>', html, re.S)
    assert len(cells) == min(300, len(doc["kernels"]))
    for c in cells:
        shown = re.sub(r"<div class=\"full\">.*?</div>", "", c, flags=re.S)
        assert len(html_mod.unescape(re.sub(r"<[^>]+>", "", shown))) <= 80
    exe = _chromium()
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"numbers-{sample.split('.')[0]}.png"
    _open(exe, page, tmp_path, "--window-size=1300,5200", f"--screenshot={shot}")
    assert shot.is_file() and shot.stat().st_size > 20_000
    dom = _open(exe, page, tmp_path, "--dump-dom").stdout
    rows = re.findall(r'<td class="kname"', dom)
    assert len(rows) == len(cells)
    if doc["summary"].get("per_rank"):
        block = dom.split('id="chart-ranks"', 1)[1][:60000]
        assert 'class="main-svg"' in block
        ticks = re.findall(r'class="(y2?)tick".*?<text[^>]*>([^<]*)</text>', block)
        assert {"y", "y2"} <= {t[0] for t in ticks}  # both axes drew their ticks
