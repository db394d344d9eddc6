"""The report's views in a real browser (Chromium, headless): the step timeline, the operators
table and the memory chart render with no console errors, and selecting a finding highlights
exactly the kernels and gaps it claims on the timeline. Real traces only; screenshots go to
test-artifacts/ (docs/ holds the ones the README shows)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import gpuprof
from tests.conftest import SAMPLES
from tests.test_html import ARTIFACTS, _chromium

ROOT = Path(__file__).parents[1]
PUBLIC = ROOT / ".." / "shared" / "traces" / "public"
#: a public trace recorded with profile_memory=True ([memory] instants): BERT-small on an H100
MEMORY_TRACE = PUBLIC / "tracelens" / "h100__gaunernst_bert-small-uncased__1016001.json.gz"


def _open(exe: str, url: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp / 'chromium-profile'}", "--virtual-time-budget=10000",
             "--enable-logging=stderr", "--v=0"]
    return subprocess.run([exe, *flags, *extra, url], capture_output=True, text=True, timeout=180)


def _errors(r: subprocess.CompletedProcess[str]) -> list[str]:
    console = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln]
    return [ln for ln in console if re.search(r"error|uncaught", ln, re.I)]


def _block(dom: str, chart: str) -> str:
    return dom.split(f'id="chart-{chart}"', 1)[1].split("</section>", 1)[0]


@pytest.mark.parametrize("sample", ["gpt_fp32.json.gz", "gpt_python_inline.json.gz", "ddp_slow_rank"])
def test_selecting_a_finding_highlights_its_claims(sample: str, tmp_path: Path) -> None:
    exe = _chromium()
    a = gpuprof.analyze(SAMPLES / sample)
    page = tmp_path / "report.html"
    a.to_html(page)
    tl = a.views_detail()["timeline"]
    assert tl["findings"], "this sample's findings claim items in its timeline step"
    plain = _open(exe, page.as_uri(), tmp_path, "--dump-dom")
    assert plain.returncode == 0 and not _errors(plain), _errors(plain)
    dom = plain.stdout
    for chart in ("timeline", "breakdown"):
        assert 'class="main-svg"' in _block(dom, chart), chart
    assert 'data-highlighted-count="0"' in dom
    lanes = {ln["name"] for ln in tl["lanes"]}
    if len(a.parts) > 1:
        assert {f"rank {p.rank} · GPU idle" for p in a.parts} <= lanes
    else:
        assert any(n.startswith("CPU thread") for n in lanes) and any(n.startswith("GPU ") for n in lanes)
    for fid, rows in tl["findings"].items():
        r = _open(exe, page.as_uri() + f"#finding={fid}", tmp_path, "--dump-dom")
        assert r.returncode == 0 and not _errors(r), _errors(r)
        block = _block(r.stdout, "timeline")
        assert f'data-highlighted="{fid}"' in r.stdout and f'data-highlighted-count="{len(rows)}"' in r.stdout
        # the highlight trace is the last group of bars: it drew one bar per claimed item
        last = block.split('class="trace bars"')[-1].split('class="trace bars"')[0]
        assert last.count('class="point"') == len(rows), fid
        if not rows:
            continue
        claimed = [tl["items"]["lane"][i] for i in rows]
        assert all(0 <= x < len(tl["lanes"]) for x in claimed)
    ARTIFACTS.mkdir(exist_ok=True)
    fid = max(tl["findings"], key=lambda f: len(tl["findings"][f]))
    shot = ARTIFACTS / f"timeline-{sample.split('.')[0]}.png"
    _open(exe, page.as_uri() + f"#view=timeline&finding={fid}", tmp_path, "--window-size=1300,900", f"--screenshot={shot}")
    assert shot.is_file() and shot.stat().st_size > 20_000


def test_operators_table_renders_and_sorts(tmp_path: Path) -> None:
    exe = _chromium()
    a = gpuprof.analyze(SAMPLES / "gpt_bf16.json.gz")
    ops = a.views_detail()["operators"]
    assert ops and ops[0]["gpu_us"] >= ops[-1]["gpu_us"]
    mm = next(o for o in ops if o["name"] == "aten::mm")
    assert mm["flops"] > 0 and mm["gpu_self_us"] > 0 and mm["shapes"].startswith("[[")
    page = tmp_path / "report.html"
    a.to_html(page)
    r = _open(exe, page.as_uri() + "#operators", tmp_path, "--dump-dom")
    assert r.returncode == 0 and not _errors(r), _errors(r)
    table = r.stdout.split('id="op-table"', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr>") == len(ops) + 1 and "aten::mm" in table
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "operators-gpt_bf16.png"
    _open(exe, page.as_uri() + "#view=operators", tmp_path, "--window-size=1300,900", f"--screenshot={shot}")
    assert shot.is_file() and shot.stat().st_size > 20_000


def test_memory_view_from_profile_memory_events(tmp_path: Path) -> None:
    if not MEMORY_TRACE.is_file():
        pytest.skip(f"public trace absent: {MEMORY_TRACE}")
    exe = _chromium()
    a = gpuprof.analyze(MEMORY_TRACE)
    m = a.views_detail()["memory"]
    t = a.ranks[0].trace.memory
    gpu = t[(t["device_type"] == 1) & (t["step"] >= 0)]
    assert m["events"] == len(gpu) and m["peak_bytes"] == gpu["total_allocated"].max()
    assert m["top_ops"] and m["top_ops"][0]["bytes"] >= m["top_ops"][-1]["bytes"]
    assert sum(o["bytes"] for o in m["top_ops"]) <= gpu.loc[gpu["bytes"] > 0, "bytes"].sum() + 1
    page = tmp_path / "report.html"
    a.to_html(page)
    r = _open(exe, page.as_uri() + "#memory", tmp_path, "--dump-dom")
    assert r.returncode == 0 and not _errors(r), _errors(r)
    assert 'class="main-svg"' in _block(r.stdout, "memory")
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "memory-bert_small_h100.png"
    _open(exe, page.as_uri() + "#view=memory", tmp_path, "--window-size=1300,900", f"--screenshot={shot}")
    assert shot.is_file() and shot.stat().st_size > 20_000


def test_no_memory_section_without_memory_events() -> None:
    html = gpuprof.analyze(SAMPLES / "gpt_fp32.json.gz").to_html()
    assert 'id="chart-memory"' not in html and 'id="chart-timeline"' in html and 'id="op-table"' in html


@pytest.mark.parametrize("width", [60, 100, 170])
def test_text_step_bars_and_operators_fit_the_width(width: int) -> None:
    """Terminal: one bar per step (time by class, cells in proportion) and the top operators
    beside the top kernels when wide, below them when not; no line past the width."""
    from gpuprof.reports.text import BAR_CHARS

    a = gpuprof.analyze(SAMPLES / "gpt_python_inline.json.gz")
    text = a.to_text(width=width)
    lines = text.splitlines()
    bars = [ln for ln in lines if ln.startswith("  step ")]
    assert len(bars) == len(a.per_step())
    for ln, p in zip(bars, a.per_step()):
        cells = ln.split()[2]
        idle = cells.count(BAR_CHARS["idle"][0]) / len(cells)
        assert idle == pytest.approx(p["idle"] / p["time_ms"], abs=2 / len(cells))
    assert max(len(ln) for ln in lines if "Top operators" in ln or ln.startswith("  step ")) <= width
    top = [ln for ln in lines if "Top operators" in ln]
    assert len(top) == 1
    assert ("Top kernels" in top[0]) == (width >= 150)  # side by side only when there is room
