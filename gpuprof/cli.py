"""The ``gpuprof`` command line: a thin layer over :mod:`gpuprof.api`.

Every :class:`GpuprofError` becomes one line on stderr and its exit code; no traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click

import gpuprof
from gpuprof import files, owned
from gpuprof.errors import GpuprofError, UsageError
from gpuprof.record import window as W


def _say(text: str) -> None:
    """One line on stderr, control characters from paths and names escaped (see ``printable``)."""
    from gpuprof.reports.text import printable

    click.echo(printable(text), err=True)


def _fail(e: GpuprofError) -> None:
    _say(f"gpuprof: error: {e}")
    sys.exit(e.exit_code)


def _progress(done: int, total: int, stage: str) -> None:
    """One self-overwriting line on a terminal: ``gpuprof: 37/256 ranks summarised``."""
    click.echo(f"\rgpuprof: {done}/{total} ranks {stage}\x1b[K", err=True, nl=done == total)


def _color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


#: The widest terminal summary written: lines grow with the width (step bars, wrapped text), and
#: ``COLUMNS=100000000`` had written 650 MB at a 3.5 GB peak. Wider terminals get this width.
MAX_WIDTH = 500


def _width() -> int:
    """The terminal's width (``COLUMNS`` when set, 100 when stdout is not a terminal), at most
    ``MAX_WIDTH``."""
    import shutil

    return min(shutil.get_terminal_size((100, 24)).columns, MAX_WIDTH)


def _emit(text: str, output: Path | None, force: bool, inputs: files.Inputs) -> None:
    """Print to stdout, or write a new file (never an input; never replacing one without --force)."""
    if output is None:
        click.echo(text, nl=False)
    else:
        _write(output, text, force, inputs)
        _say(f"wrote {output}")


def _encoded(text: str) -> bytes:
    # Lone surrogates (a trace's "\ud800") cannot be UTF-8: written as the same JSON-style escape.
    return text.encode("utf-8", errors="backslashreplace")


def _write(path: Path, text: str, force: bool, inputs: files.Inputs | None = None) -> None:
    files.write_new(path, _encoded(text), force, inputs)


def _inputs(paths: Sequence[Path], analysis: Any = None) -> files.Inputs:
    """What a command read (the paths given, and each trace the analysis loaded): never written."""
    inputs = files.Inputs(list(paths))
    for part in getattr(analysis, "parts", ()):
        inputs.add(Path(part.meta.path))
    return inputs


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(gpuprof.__version__, prog_name="gpuprof")
def main() -> None:
    """gpuprof: why your GPUs are slow, and what to change first.

    \b
    Commands:
      record     profile an unchanged program into a run folder (traces, NVML samples, manifest)
      report     analyse Kineto traces (a file, a folder of rank traces, or a run folder)
      diff       compare two runs: step time, MFU, time by class, findings, kernels
      calibrate  measure this GPU's real matmul and memory ceilings into a spec file
      annotate   write the trace with gpuprof's findings added, for Perfetto / chrome://tracing
    """
    _show_warnings_as_lines()


def _show_warnings_as_lines() -> None:
    """A :class:`GpuprofWarning` (in this process or a worker forked from it) is one line on
    stderr, ``gpuprof: warning: ...``; other warnings keep Python's own form."""
    import warnings

    from gpuprof.errors import GpuprofWarning

    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        if issubclass(category, GpuprofWarning):
            _say(f"gpuprof: warning: {message}")
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["html", "text", "json"]), default="html", show_default=True,
              help="html: one offline page (and a terminal summary); text: the terminal summary only; "
                   "json: the full machine-readable report (schema_version 1).")
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Write the report here (html default: a new gpuprof-report[-N].html; text/json: stdout).")
@click.option("--force", is_flag=True, help="Replace the -o file if it exists.")
@click.option("--gpu", help="Analyse against this GPU's datasheet peaks (e.g. H100-SXM, A100-SXM4-80GB).")
@click.option("--gpu-spec", type=click.Path(path_type=Path), help="A spec file (from `gpuprof calibrate`).")
@click.option("--step-ms", type=float, help="Step time measured WITHOUT the profiler (e.g. from training logs); "
              "corrects host-side estimates for the profiler's own overhead.")
@click.option("--input-wait-ms", type=float, help="Time per step the loop waited for its DataLoader, measured "
              "WITHOUT the profiler over the same steps as --step-ms (a `gpuprof record` run folder carries it).")
@click.option("--no-cache", is_flag=True, help="Neither read nor write the parse and results caches ($GPUPROF_CACHE_DIR).")
@click.option("--workers", type=click.IntRange(min=1), help="Local processes parsing rank traces (most: one per CPU; default: one per CPU, "
              "or none for rank traces of 256 MiB of JSON or less, analysed in this process).")
@click.option("--dask", "dask_address", metavar="ADDRESS|local",
              help="Parse rank traces on a Dask cluster (scheduler address, or 'local'); needs gpuprof[dask].")
@click.option("--as-ranks", is_flag=True,
              help="Analyse the traces as ranks of one job even though they do not look like one "
                   "(no distributedInfo, different step counts...).")
@click.option("--annotated", type=click.Path(path_type=Path), metavar="OUT.json.gz",
              help="Also write the trace with gpuprof's results added (as `gpuprof annotate`).")
@owned.command()
def report(paths: tuple[Path, ...], fmt: str, output: Path | None, force: bool, gpu: str | None,
           gpu_spec: Path | None, step_ms: float | None, input_wait_ms: float | None, no_cache: bool,
           workers: int | None, dask_address: str | None, as_ranks: bool, annotated: Path | None) -> None:
    """Analyse traces and report step time, MFU, roofline classes and findings.

    PATHS are Kineto trace files (.json or .json.gz, as torch.profiler writes them), folders of
    per-rank traces, or run folders written by `gpuprof record`. Ctrl-C stops it (exit 130).
    """
    with _interruptible():
        _report(paths, fmt, output, force, gpu, gpu_spec, step_ms, no_cache, workers, dask_address, as_ranks,
                annotated, input_wait_ms)


class _Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, SLURM, CI): handled as Ctrl-C is, so the workers are stopped too."""


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C: one line and exit 130 (128 + SIGINT), no traceback; SIGTERM likewise, exit 143
    (128 + SIGTERM). Worker processes forked for rank traces inherit the handlers and leave
    quietly; only this process reports, after killing any worker still running (a signal sent to
    this process alone must not leave them behind)."""
    main_pid = os.getpid()

    def on_signal(signum: int, frame: Any) -> None:
        if os.getpid() != main_pid:
            os._exit(128 + signum)  # a forked worker: the parent says it once
        raise _Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except KeyboardInterrupt as e:
        for s in previous:
            signal.signal(s, signal.SIG_IGN)  # a second signal while workers stop
        term = isinstance(e, _Terminated)
        click.echo(f"\ngpuprof: {'terminated' if term else 'interrupted'}", err=True)
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        # Straight out, as the signal's default would: exit handlers of half-started libraries (a
        # Dask cluster interrupted while its workers start) would print tracebacks after the line.
        os._exit(128 + (signal.SIGTERM if term else signal.SIGINT))
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _report(paths: tuple[Path, ...], fmt: str, output: Path | None, force: bool, gpu: str | None,
            gpu_spec: Path | None, step_ms: float | None, no_cache: bool, workers: int | None,
            dask_address: str | None, as_ranks: bool, annotated: Path | None = None,
            input_wait_ms: float | None = None) -> None:
    try:
        stored = fmt == "json" and not no_cache and annotated is None
        if stored:  # the same report of unchanged trace files: printed from the cache, nothing imported
            from gpuprof import cache_keys

            options: tuple[Any, ...] = (gpu, cache_keys.spec_digest(str(gpu_spec) if gpu_spec else None), step_ms,
                                        as_ranks)
            if input_wait_ms is not None:
                options += (input_wait_ms,)
            key = cache_keys.report_key(list(paths), fmt, options)
            text = cache_keys.cached_report(key) if key else None
            if text is not None:
                _emit(text, output, force, _inputs(paths))
                return
        if output is not None:  # a refused -o is said before the analysis, not after it
            files.check_target(output, force, _inputs(paths))
        if sys.stderr.isatty():
            click.echo(f"gpuprof: analysing {len(paths)} path(s)…", err=True)
        owned.analysing()  # here, not earlier: a stored report imports no pandas
        analysis = gpuprof.analyze(list(paths), gpu=gpu, gpu_spec=str(gpu_spec) if gpu_spec else None,
                                   step_ms=step_ms, cache=not no_cache, workers=workers, dask=dask_address,
                                   progress=_progress if sys.stderr.isatty() else None, as_ranks=as_ranks,
                                   input_wait_ms=input_wait_ms)
        inputs = _inputs(paths, analysis)
        if stored:
            text = analysis.to_json()
            _store_report(analysis, list(paths), fmt, options, text)
            _emit(text, output, force, inputs)
            return
        if annotated is not None:
            _annotate(analysis, annotated, force, inputs)
        if fmt == "html":
            page = _encoded(analysis.to_html())
            if output is None:
                target = files.write_fresh(Path("gpuprof-report.html"), page)
            else:
                files.write_new(output, page, force, inputs)
                target = output
            click.echo(analysis.to_text(color=_color(), width=_width()), nl=False)
            _say(f"wrote {target}")
            return
        _emit(analysis.to_json() if fmt == "json" else
              analysis.to_text(color=_color() and output is None, width=_width() if output is None else None),
              output, force, inputs)
    except GpuprofError as e:
        _fail(e)


def _store_report(analysis: Any, paths: list[Path], fmt: str, options: tuple[Any, ...], text: str) -> None:
    """File the report under the bytes each trace file's part was computed from (never under what
    a file holds by now); not at all when a path is not one of the analysed files."""
    from gpuprof import cache_keys
    from gpuprof.trace import cache as pcache

    by_path = {j.path: p.meta.content_key for j, p in zip(analysis.jobs, analysis.parts)}
    if any(c is None for c in by_path.values()):
        return
    key = cache_keys.report_key(paths, fmt, options, {k: str(c) for k, c in by_path.items()})
    if key is not None:
        pcache.put_result(key, text, str)


def _annotate(analysis: Any, out: Path, force: bool, inputs: files.Inputs) -> None:
    """One annotated trace per rank: ``out`` itself for one trace, else ``out`` is a folder
    receiving ``rank{R}.json.gz``. No target is any input, whichever rank it is named after."""
    from gpuprof.reports.annotate import annotated_bytes
    from gpuprof.views import annotation_data

    data = annotation_data(analysis, analysis.ranks)
    if len(data) > 1:
        if out.exists() and not out.is_dir():
            raise UsageError("several ranks: --annotated/-o names a folder for rank{R}.json.gz", str(out))
        targets = [out / f"rank{d['rank']}.json.gz" for d in data]
    else:
        targets = [out]
    for target in targets:  # every target checked before any is written
        if inputs.holds(target):
            raise UsageError("is an input trace; gpuprof never writes over what it reads", str(target))
    for d, target in zip(data, targets):
        body, n = annotated_bytes(d, target.name.endswith(".gz"))
        files.write_new(target, body, force, inputs, what="an input trace")
        click.echo(f"wrote {target} ({n} gpuprof events added)", err=True)


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, metavar="OUT.json.gz",
              help="The annotated trace to write (several ranks: a folder for rank{R}.json.gz).")
@click.option("--force", is_flag=True, help="Replace the -o file if it exists (never the input).")
@click.option("--gpu", help="Analyse against this GPU's datasheet peaks.")
@click.option("--gpu-spec", type=click.Path(path_type=Path), help="A spec file (from `gpuprof calibrate`).")
@click.option("--step-ms", type=float, help="Step time measured WITHOUT the profiler.")
@click.option("--no-cache", is_flag=True, help="Neither read nor write the caches.")
@owned.command()
def annotate(paths: tuple[Path, ...], output: Path, force: bool, gpu: str | None, gpu_spec: Path | None,
             step_ms: float | None, no_cache: bool) -> None:
    """Write the trace with gpuprof's results added, for Perfetto or chrome://tracing.

    A "gpuprof" process gets one track per GPU stream with each kernel's roofline class, and one
    track per finding (and stream) with the kernels, copies and idle gaps that finding claims,
    named by its id and saving. The original events are kept unchanged.
    """
    owned.analysing()
    try:
        analysis = gpuprof.analyze(list(paths), gpu=gpu, gpu_spec=str(gpu_spec) if gpu_spec else None,
                                   step_ms=step_ms, cache=not no_cache, keep_traces=True)
        _annotate(analysis, output, force, _inputs(paths, analysis))
    except GpuprofError as e:
        _fail(e)


def _schedule(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, int, int, int]:
    try:
        parts = [int(x) for x in value.split(",")]
        if len(parts) == 3:
            parts.append(1)
        if len(parts) != 4 or parts[2] < 1 or min(parts) < 0 or parts[3] < 1:
            raise ValueError
    except ValueError:
        raise click.BadParameter("expected WAIT,WARMUP,ACTIVE[,REPEAT] with ACTIVE and REPEAT >= 1, e.g. 1,2,3") from None
    return parts[0], parts[1], parts[2], parts[3]


def _timed_steps(ctx: click.Context, param: click.Parameter, value: str) -> int | None:
    if value == "steady":
        return None
    try:
        n = int(value)
        if n < 0:
            raise ValueError
    except ValueError:
        raise click.BadParameter("expected 'steady' or a number of steps >= 0") from None
    return n


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--out", type=click.Path(path_type=Path), help="Run folder to create (default: a new one under ./gpuprof_runs/).")
@click.option("--schedule", default="1,2,3", show_default=True, callback=_schedule,
              help="Profiler schedule WAIT,WARMUP,ACTIVE[,REPEAT] in steps, after the skipped and timed steps.")
@click.option("--skip-steps", default=5, show_default=True, type=click.IntRange(min=0),
              help="Steps left alone at start (compilation, warm-up).")
@click.option("--timed-steps", default="steady", show_default=True, callback=_timed_steps, metavar="steady|N",
              help="Steps timed without the profiler (on the GPU timeline with CUDA events when the program uses "
                   f"CUDA): the real step time that corrects host-side estimates. 'steady': chunks of {W.CHUNK_STEPS} "
                   f"steps or {W.CHUNK_MIN_S:g} s, whichever is longer (whole DataLoader worker cycles), the warm-up "
                   "cut by the MSER rule once the DataLoader's queue is no longer draining, until at least "
                   f"{W.MIN_CHUNKS} chunks hold a mean within {W.SEM_PCT:g} % (standard error); at most "
                   f"{W.BUDGET_CHUNKS} chunks or {W.BUDGET_S:g} s. N: exactly N steps.")
@click.option("--nvml-hz", default=20.0, show_default=True, type=click.FloatRange(min=0, min_open=True, max=1000),
              help="NVML samples per second per GPU.")
@click.option("--no-nvml", is_flag=True, help="Do not sample NVML.")
@click.option("--no-gpm", is_flag=True, help="Do not read Hopper GPM metrics (SM/tensor/DRAM utilisation).")
@click.option("--no-nvml-counters", is_flag=True, help="Do not read PCIe/NVLink byte counters.")
@click.option("--with-stack", is_flag=True, help="Record Python stacks (names call sites; larger traces).")
@click.option("--record-shapes/--no-record-shapes", default=True, show_default=True,
              help="Record op input shapes (needed for FLOP/byte models).")
@click.option("--kill-after", default=60.0, show_default=True, type=click.FloatRange(min=0), metavar="SECONDS",
              help="After passing on Ctrl-C/SIGTERM/SIGHUP (or if gpuprof itself is killed), SIGKILL what the program "
                   "still runs this long after the signal.")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, required=True)
def record(out: Path | None, schedule: tuple[int, int, int, int], skip_steps: int, timed_steps: int | None,
           nvml_hz: float, no_nvml: bool, no_gpm: bool, no_nvml_counters: bool, with_stack: bool, record_shapes: bool,
           kill_after: float, cmd: tuple[str, ...]) -> None:
    """Profile an unchanged program: gpuprof record [OPTIONS] -- CMD ARGS...

    \b
    Works with `python train.py`, `python -m pkg`, `torchrun --nproc_per_node N train.py`:
    every rank writes traces/rank{R}.json.gz (processes without a rank: pid{PID}). Steps are
    counted at each optimizer.step(); loops without an optimizer call gpuprof.step() once per
    step. Signals reach every process of the program; the manifest is written once they have all
    ended. Writes manifest.json and nvml.csv, and exits with the program's exit code.
    """
    from gpuprof.record.launcher import Options
    from gpuprof.record.launcher import record as run

    wait, warmup, active, repeat = schedule
    try:
        code = run(list(cmd), Options(out=out, skip=skip_steps, timed=timed_steps, wait=wait, warmup=warmup,
                                      active=active, repeat=repeat, nvml_hz=nvml_hz, nvml=not no_nvml,
                                      gpm=not no_gpm, nvml_counters=not no_nvml_counters,
                                      with_stack=with_stack, record_shapes=record_shapes, kill_after=kill_after))
    except GpuprofError as e:
        _fail(e)
    sys.exit(code)


@main.command()
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text", show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write here instead of stdout (html: required).")
@click.option("--force", is_flag=True, help="Replace the -o file if it exists.")
@click.option("--gpu", help="Analyse both against this GPU's datasheet peaks.")
@click.option("--step-ms-before", type=float, help="BEFORE's step time without the profiler.")
@click.option("--step-ms-after", type=float, help="AFTER's step time without the profiler.")
@owned.command()
def diff(before: Path, after: Path, fmt: str, output: Path | None, force: bool, gpu: str | None,
         step_ms_before: float | None, step_ms_after: float | None) -> None:
    """Compare two runs or traces: step time, MFU, time by class, findings and top kernels.

    BEFORE and AFTER are anything `gpuprof report` reads. Use it after applying a recommendation.
    """
    from gpuprof.compare import compare
    from gpuprof.reports.diff import render_diff_html, render_diff_text

    owned.analysing()
    try:
        if output is not None:
            files.check_target(output, force, _inputs((before, after)))
        first = gpuprof.analyze(before, gpu=gpu, step_ms=step_ms_before)
        second = gpuprof.analyze(after, gpu=gpu, step_ms=step_ms_after)
        inputs = _inputs((before, after), first)
        for part in second.parts:
            inputs.add(Path(part.meta.path))
        doc = compare(first.to_dict(), second.to_dict())
        if fmt == "json":
            from gpuprof.reports.json_report import render_json

            text = render_json(doc)
        elif fmt == "html":
            text = render_diff_html(doc)
            if output is None:
                _say(f"wrote {files.write_fresh(Path('gpuprof-diff.html'), _encoded(text))}")
                return
        else:
            text = render_diff_text(doc)
        _emit(text, output, force, inputs)
    except GpuprofError as e:
        _fail(e)


@main.command()
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("gpu_spec.json"), show_default=True,
              help="Spec file to write (never replaced).")
@click.option("--gemm-table", is_flag=True,
              help="Also time GEMMs over a grid of sizes per dtype, aligned and misaligned (about a minute).")
def calibrate(output: Path, gemm_table: bool) -> None:
    """Measure matmul TFLOP/s per dtype and copy bandwidth on this GPU (needs torch with CUDA).

    Use the file with `gpuprof report --gpu-spec FILE` so rooflines use what this card really does.
    """
    try:
        if output.exists():
            raise UsageError("exists; calibrate never replaces a spec file", str(output))
        try:
            from gpuprof.calibrate import calibrate as run
            from gpuprof.calibrate import gemm_table as gemms
            spec: dict[str, Any] = run()
            if gemm_table:
                spec["gemm_table"] = gemms()
        except ImportError:
            raise GpuprofError("calibrate needs torch (pip install 'gpuprof[record]')") from None
        except RuntimeError as e:
            raise GpuprofError(str(e).splitlines()[0]) from None
        import json

        _write(output, json.dumps(spec, indent=1) + "\n", force=False)
        _say(f"wrote {output}")
    except GpuprofError as e:
        _fail(e)


if __name__ == "__main__":
    main()
