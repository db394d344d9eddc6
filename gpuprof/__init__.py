"""gpuprof: why your GPUs are slow and what to change first.

The public surface is small: :func:`analyze` returns an :class:`Analysis` (pandas frames,
summary, ranked findings); :class:`GpuprofError` is the root of every error gpuprof raises on
bad input. Heavy modules load on first use, so ``gpuprof.calibrate`` and the recorder's
bootstrap stay importable on a bare GPU machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"


def _alias_source_checkout() -> None:
    """In a source checkout that is not installed (e.g. PYTHONPATH=. on a GPU box), ``analyzers/``
    and ``reports/`` sit beside this package: import them as ``gpuprof.analyzers`` and
    ``gpuprof.reports``, as an install maps them. Appended last, so an install always wins."""
    import importlib.abc
    import importlib.machinery
    import importlib.util
    import sys
    import types
    from collections.abc import Sequence
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    homes = {f"gpuprof.{n}": root / n for n in ("analyzers", "reports") if (root / n / "__init__.py").is_file()}
    if not homes:
        return

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Sequence[str] | None = None,
                      target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
            home = homes.get(name)
            if home is None:
                return None
            return importlib.util.spec_from_file_location(name, home / "__init__.py",
                                                          submodule_search_locations=[str(home)])

    sys.meta_path.append(_Finder())


_alias_source_checkout()

__all__ = ["Analysis", "Finding", "GpuprofError", "__version__", "analyze", "step"]

if TYPE_CHECKING:
    from gpuprof.api import Analysis, analyze
    from gpuprof.errors import GpuprofError
    from gpuprof.findings import Finding


def step() -> None:
    """Mark one step for ``gpuprof record`` in loops without an optimizer; a no-op otherwise."""
    from gpuprof.record.hook import step as _step

    _step()


def __getattr__(name: str) -> Any:
    if name in ("analyze", "Analysis"):
        from gpuprof import api

        return getattr(api, name)
    if name == "GpuprofError":
        from gpuprof.errors import GpuprofError

        return GpuprofError
    if name == "Finding":
        from gpuprof.findings import Finding

        return Finding
    raise AttributeError(f"module 'gpuprof' has no attribute {name!r}")
