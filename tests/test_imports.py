"""The package's modules import one another without cycles (issue #23), counting every import:
those inside functions (where a cycle usually hides) and those under ``if TYPE_CHECKING:``.

The graph is read from the source (nothing is imported): ``analyzers/`` and ``reports/`` are the
installed ``gpuprof.analyzers`` and ``gpuprof.reports``. Where the shared checker
(``../shared/tools/import_cycles.py``) is present it must agree.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOMES = {"gpuprof": ROOT / "gpuprof", "gpuprof.analyzers": ROOT / "analyzers", "gpuprof.reports": ROOT / "reports"}
SHARED_TOOL = ROOT.parent / "shared" / "tools" / "import_cycles.py"


def modules() -> dict[str, tuple[Path, bool]]:
    found: dict[str, tuple[Path, bool]] = {}
    for pkg, home in HOMES.items():
        for f in home.rglob("*.py"):
            rel = f.relative_to(home).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if pkg == "gpuprof" and parts and parts[0] in ("analyzers", "reports"):
                continue
            found[".".join([pkg, *parts])] = (f, f.name == "__init__.py")
    return found


def edges(mods: dict[str, tuple[Path, bool]]) -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its source. ``from pkg import name``
    ties to ``pkg.name`` when that is a module, else to ``pkg`` (its ``__init__``), except a name
    the package's ``__init__`` assigns itself (a constant: it ties nothing) or a package whose
    ``__init__`` imports none of its modules at import time (lazy faces)."""
    own: dict[str, set[str]] = {}
    lazy: set[str] = set()
    for name, (path, is_pkg) in mods.items():
        if not is_pkg:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own[name] = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                     for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        eager = any((isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith(name)))
                    or (isinstance(n, ast.Import) and any(a.name.startswith(name + ".") for a in n.names))
                    for n in tree.body)
        if not eager:
            lazy.add(name)
    out: dict[str, set[str]] = {m: set() for m in mods}
    for name, (path, is_pkg) in mods.items():
        pkg = name if is_pkg else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name not in lazy]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub not in mods and (a.name in own.get(base, ()) or base in lazy):
                        continue
                    targets.append(sub if sub in mods else base)
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    out[name].add(t)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_package_has_no_import_cycle() -> None:
    mods = modules()
    assert "gpuprof.analyzers.distributed" in mods and "gpuprof.reports.html" in mods and len(mods) > 40
    found = cycles(edges(mods))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_checker_finds_a_cycle(tmp_path: Path) -> None:
    """SYNTHETIC modules: a function-level import and a TYPE_CHECKING one close a cycle."""
    (tmp_path / "a.py").write_text("def f():\n    from pkg import b\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import f\n")
    mods = {"pkg.a": (tmp_path / "a.py", False), "pkg.b": (tmp_path / "b.py", False)}
    assert cycles(edges(mods)) == [["pkg.a", "pkg.b"]]


@pytest.mark.skipif(not SHARED_TOOL.is_file(), reason=f"the shared checker is not here ({SHARED_TOOL}): "
                    "the project's own check above still runs")
def test_the_shared_checker_agrees() -> None:
    r = subprocess.run([sys.executable, str(SHARED_TOOL), ".", "--alias", "analyzers=gpuprof.analyzers",
                        "--alias", "reports=gpuprof.reports"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith(" 0 cycle(s)"), r.stdout[-3000:]
