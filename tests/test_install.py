"""Packaging: analysis without torch, and a wheel that installs gpuprof.analyzers / gpuprof.reports."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT, SAMPLES


def test_analysis_runs_where_torch_is_absent() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
        "import gpuprof\n"
        f"a = gpuprof.analyze({str(SAMPLES / 'gpt_bf16.json.gz')!r})\n"
        "a.to_json(); a.to_text()\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_wheel_contents(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    wheel = next(tmp_path.glob("gpuprof-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for must in ("gpuprof/__init__.py", "gpuprof/py.typed", "gpuprof/trace/load.py", "gpuprof/analyzers/__init__.py",
                 "gpuprof/reports/__init__.py", "gpuprof/reports/json_report.py", "gpuprof/reports/text.py",
                 "gpuprof/record/launcher.py", "gpuprof/record/_boot/sitecustomize.py", "gpuprof/record/_watchdog.py",
                 "gpuprof/record/window.py", "gpuprof/replay/fixes.py"):
        assert must in names, must
    top = {n.split("/")[0] for n in names}
    assert not top & {"analyzers", "reports", "tests", "sample_traces"}, top
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "gpuprof = gpuprof.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_mypy_strict_passes() -> None:
    """The package is typed (py.typed): mypy --strict (pyproject's [tool.mypy]) must stay clean."""
    r = subprocess.run([sys.executable, "-m", "mypy", "gpuprof", "analyzers", "reports"], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:]
