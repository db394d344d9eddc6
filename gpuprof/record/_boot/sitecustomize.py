"""gpuprof's bootstrap: loaded by every Python process of a ``gpuprof record`` run (via PYTHONPATH).

It does three things and nothing else: runs the ``sitecustomize`` this one shadows, if any;
makes the ``gpuprof`` package importable where this interpreter does not find it (the program's
own Python, without gpuprof installed), by mapping that one name to the package this file belongs
to, so nothing else beside the package (a checkout's ``reports/``, ``tests/``, ``benchmarks/``)
can shadow the program's own modules; and arranges for :func:`gpuprof.record.hook.install` to run
right after ``torch`` is imported, so a process that never imports torch (a shell script's
helpers, the launcher) is left alone. Any failure here is printed once and the program runs
unprofiled.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Sequence

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain_sitecustomize() -> None:
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
        if spec is not None and spec.loader is not None:
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved


class _OnlyGpuprof(importlib.abc.MetaPathFinder):
    """Finds the top-level ``gpuprof`` package (and nothing else) at ``pkg``; its submodules are
    then found through the package's own ``__path__``."""

    def __init__(self, pkg: str) -> None:
        self.pkg = pkg

    def find_spec(self, name: str, path: "Sequence[str] | None" = None,
                  target: "types.ModuleType | None" = None) -> "importlib.machinery.ModuleSpec | None":
        if name != "gpuprof":
            return None
        return importlib.util.spec_from_file_location(name, os.path.join(self.pkg, "__init__.py"),
                                                      submodule_search_locations=[self.pkg])


def _ensure_gpuprof() -> None:
    if importlib.util.find_spec("gpuprof") is not None:
        return
    pkg = os.path.dirname(os.path.dirname(_HERE))  # .../gpuprof/record/_boot -> .../gpuprof
    if os.path.isfile(os.path.join(pkg, "__init__.py")):
        sys.meta_path.append(_OnlyGpuprof(pkg))


class _AfterTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: "Sequence[str] | None" = None,
                  target: "types.ModuleType | None" = None) -> "importlib.machinery.ModuleSpec | None":
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: "types.ModuleType") -> None:
            run(module)
            try:
                from gpuprof.record.hook import install

                install()
            except Exception as e:  # never break the user's program
                print(f"gpuprof: recording disabled in pid {os.getpid()}: {e}", file=sys.stderr)

        setattr(spec.loader, "exec_module", exec_module)
        return spec


try:
    _chain_sitecustomize()
except Exception as e:
    print(f"gpuprof: the program's own sitecustomize failed: {e}", file=sys.stderr)
if os.environ.get("GPUPROF_RUN_DIR"):
    try:
        _ensure_gpuprof()
    except Exception as e:
        print(f"gpuprof: cannot make gpuprof importable: {e}", file=sys.stderr)
    if "torch" in sys.modules:  # the chained sitecustomize imported it already
        try:
            from gpuprof.record.hook import install

            install()
        except Exception as e:
            print(f"gpuprof: recording disabled in pid {os.getpid()}: {e}", file=sys.stderr)
    else:
        sys.meta_path.insert(0, _AfterTorch())
