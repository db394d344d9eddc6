"""The replay's compiled parts, each optional: ``_solve`` (``_solve.c``), the rounds of
:func:`gpuprof.replay.simulate._in_order`. Where it is not compiled the numpy loop beside it runs,
to the same floats. Importing this package imports nothing else of gpuprof's."""
