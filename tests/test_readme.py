"""The README's commands and .ci/run must not drift apart."""

from __future__ import annotations

import re

from tests.conftest import ROOT


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```sh\n(python3 -m venv[^\n]+)\n```", readme)
    assert len(commands) == 2, commands
    main_job, tests = commands
    assert "gpuprof report sample_traces/" in main_job and "pytest" in tests
    assert (ROOT / main_job.split("gpuprof report ")[1].split()[0]).is_file()
    assert tests in (ROOT / ".ci" / "run").read_text()
