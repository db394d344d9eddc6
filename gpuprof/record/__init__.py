"""``gpuprof record``: profile an unchanged program into a run folder.

The parent process (:mod:`gpuprof.record.launcher`) starts the program with a bootstrap on
``PYTHONPATH`` (:mod:`gpuprof.record._boot.sitecustomize`), samples NVML in a thread
(:mod:`gpuprof.record.nvml`) and writes ``manifest.json`` (:mod:`gpuprof.record.manifest`).
In each profiled process, :mod:`gpuprof.record.hook` drives torch.profiler from optimizer steps
or ``gpuprof.step()``. Nothing here imports torch in the parent.
"""
