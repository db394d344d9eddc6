"""gpuprof's bootstrap: loaded by every Python process of a ``gpuprof record`` run (via PYTHONPATH).

It does two things and nothing else: runs the ``sitecustomize`` this one shadows, if any, and
arranges for :func:`gpuprof.record.hook.install` to run right after ``torch`` is imported, so a
process that never imports torch (a shell script's helpers, the launcher) is left alone. Any
failure here is printed once and the program runs unprofiled.
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
    if "torch" in sys.modules:  # the chained sitecustomize imported it already
        try:
            from gpuprof.record.hook import install

            install()
        except Exception as e:
            print(f"gpuprof: recording disabled in pid {os.getpid()}: {e}", file=sys.stderr)
    else:
        sys.meta_path.insert(0, _AfterTorch())
