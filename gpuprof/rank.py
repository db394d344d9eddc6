"""One rank: its trace's frames with the roofline and the step summary (:class:`RankResult`), and
the view every analyzer reads (:class:`RankView`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.claims import Unit, units_of
from gpuprof.hostcost import bracket_cost_us, event_cost_us, profiler_cost_us, unprofiled_step_ms
from gpuprof.hostops import update_loops
from gpuprof.idle import CAUSE_ORDER, classify_gaps, driving_spans, optimizer_spans
from gpuprof.roofline import classify
from gpuprof.specs import GpuSpec
from gpuprof.timeline import StepSummary, summarize
from gpuprof.trace.model import RankTrace


@dataclass(frozen=True)
class RankResult:
    """One rank with everything: the trace's frames, the roofline and the step summary."""

    trace: RankTrace
    roofline: pd.DataFrame
    summary: StepSummary
    unprofiled_step_ms: float | None = None  # measured without the profiler, when known
    nvml: pd.DataFrame | None = None  # this rank's GPU samples over the run (in_window marks the profiled steps)
    nvml_period_s: float = 0.05



def with_rank(t: RankTrace, rank: int) -> RankTrace:
    return replace(t, meta=replace(t.meta, rank=rank))



def result_of(t: RankTrace, spec: GpuSpec | None, step_ms: float | None = None, nvml: pd.DataFrame | None = None,
              nvml_period_s: float = 0.05) -> RankResult:
    roof = classify(t, spec)
    return RankResult(t, roof, summarize(t.steps, t.kernels, roof, t.memcpys, spec), step_ms, nvml, nvml_period_s)



def _row_array(rows: Iterable[int]) -> np.ndarray:
    out: np.ndarray = np.asarray(rows if isinstance(rows, (np.ndarray, pd.Index, pd.Series)) else list(rows),
                                 dtype=np.int64)
    return out


class RankView:
    """What every analyzer reads of one rank: its kernels with their roofline columns, restricted
    to the profiled steps; its idle gaps classified (:func:`gpuprof.idle.classify_gaps`), each with
    the time it would have lasted without the profiler (``real_dur``); the profiler's cost per
    recorded host event (:mod:`gpuprof.hostcost`); the GPU's peaks (``spec``) and the rank's NVML
    samples (``result.nvml``). Built once per rank by the pipeline and handed to every analyzer
    and to the replay's pricing.

    Idle gaps caused by the host are deflated event by event: a gap holding n recorded host
    events would have lasted ``max(0, gap - c*n)``, ``c`` being the profiler's cost per event
    (measured from the unprofiled step time, else the trace's own floor). With the unprofiled step
    known, the real idle time per step cannot exceed the real step less the GPU's busy time; it is
    given out to the causes in ``CAUSE_ORDER``: sync bubbles first (device round trips, little host
    work), then stalls and input, then launch gaps (host work throughout, which the profiler
    inflates most). That keeps a trace whose profiler is costly (torch 1.8: over 10 µs per event)
    from reading its bookkeeping, dense in launch gaps and sparse in a DataLoader's Python, as
    launch overhead."""

    def __init__(self, r: RankResult, spec: GpuSpec | None = None) -> None:
        t = r.trace
        self.result = r
        self.spec = spec
        self.rank = t.meta.rank
        self.trace = t
        self.steps = t.steps
        self.n_steps = max(len(t.steps), 1)
        k = pd.concat([t.kernels, r.roofline], axis=1)
        self.kernels = k[k["step"] >= 0] if (k["step"] >= 0).any() else k
        self.step_time_us = float(r.summary.steps["time_us"].mean()) if len(r.summary.steps) else 0.0
        unprofiled = unprofiled_step_ms(r)
        self.host_scale_known = unprofiled is not None
        host = pd.concat([t.ops.loc[t.ops["step"] >= 0, "ts"], t.runtime.loc[t.runtime["step"] >= 0, "ts"]])
        # The profiler's cost per recorded host event (µs): from the traced vs. the real step time,
        # or estimated from the trace's own op brackets when the real step is unknown.
        self.host_events_per_step = event_cost_us(r)[1]
        self.event_cost_us, self.event_cost_measured = profiler_cost_us(r)
        #: GPU busy time per step (kernels, copies) and the real step time (µs; the traced one when unknown)
        self.busy_us = self.step_time_us * (100.0 - r.summary.breakdown_pct["idle"]) / 100.0
        self.unprofiled_or_traced_step_us = unprofiled * 1000.0 if unprofiled else self.step_time_us
        # the optimizer's spans and the GPU-driving spans are read once here: the gaps, the
        # analyzers and the replay's transformations all ask for them
        self._optimizer_spans: dict[bool, pd.DataFrame] = {True: optimizer_spans(t, zero_grad=True)}
        self.driving_spans = driving_spans(t, self._optimizer_spans[True])
        g = classify_gaps(t, self.driving_spans)
        starts = np.sort(host.to_numpy())
        n = np.searchsorted(starts, g["end"].to_numpy()) - np.searchsorted(starts, g["start"].to_numpy())
        real_dur = np.maximum(0.0, g["dur"].to_numpy() - self.event_cost_us * n)
        if unprofiled:
            budget = max(0.0, unprofiled * 1000.0 - self.busy_us) * self.n_steps
            for cause in CAUSE_ORDER:
                m = (g["cause"] == cause).to_numpy()
                total = real_dur[m].sum()
                if total > budget:
                    real_dur[m] *= budget / total
                budget = max(0.0, budget - real_dur[m].sum())
        self.gaps = g.assign(events=n, real_dur=real_dur)
        self._update_loops: pd.DataFrame | None = None
        self._stream_order: np.ndarray | None = None
        self._shared: dict[str, Any] = {}  # what :meth:`shared` made, by key

    def bracket_cost_us(self) -> float:
        """:func:`gpuprof.hostcost.bracket_cost_us` of the rank's trace: the view's
        ``event_cost_us`` already where no unprofiled step time was given, else read now."""
        return self.event_cost_us if not self.event_cost_measured else bracket_cost_us(self.trace)

    def optimizer_spans(self, zero_grad: bool = False) -> pd.DataFrame:
        """:func:`gpuprof.idle.optimizer_spans` of the rank's trace, read once per view: the
        analyzers and the replay ask for them a dozen times. Read-only, like the trace."""
        if zero_grad not in self._optimizer_spans:
            self._optimizer_spans[zero_grad] = optimizer_spans(self.trace, zero_grad=zero_grad)
        return self._optimizer_spans[zero_grad]

    def gaps_of(self, cause: str) -> pd.DataFrame:
        """The idle gaps of one cause (``gaps[gaps["cause"] == cause]``), filtered once per view:
        several analyzers ask for each. Read-only, like the gaps."""
        g = self.gaps
        out: pd.DataFrame = self.shared(f"gaps:{cause}", lambda: g[g["cause"] == cause] if len(g) else g)
        return out

    def in_stream_order(self, columns: Sequence[str]) -> pd.DataFrame:
        """``columns`` of the view's kernels (those it has) ordered by device, stream and start, as
        ``kernels.sort_values(["device", "stream", "ts"], kind="stable")`` orders them: the order
        found once per view, and only the columns a caller reads taken (the fusion analyzers sort
        the 53-column frame otherwise, and filter it twice more)."""
        k = self.kernels
        if self._stream_order is None:
            keys = pd.DataFrame({"device": k["device"].to_numpy(), "stream": k["stream"].to_numpy(),
                                 "ts": k["ts"].to_numpy(), "pos": np.arange(len(k))})
            self._stream_order = keys.sort_values(["device", "stream", "ts"], kind="stable")["pos"].to_numpy()
        return k[[c for c in columns if c in k.columns]].take(self._stream_order)

    def update_loops(self) -> pd.DataFrame:
        """:func:`gpuprof.hostops.update_loops` of the rank's trace, read once per view. Read-only."""
        if self._update_loops is None:
            self._update_loops = update_loops(self.trace, self.optimizer_spans())
        return self._update_loops

    def kernel_units(self, rows: Iterable[int], saved_us: np.ndarray | pd.Series) -> dict[Unit, float]:
        return units_of("k", self.rank, rows, saved_us)

    def inner_gap_units(self, rows: Iterable[int], exclude_first: Iterable[int] = (), after: bool = False
                        ) -> dict[Unit, float]:
        """The idle gaps just before the given kernels (and just after them, with ``after``), less
        the profiler's share: a fix that replaces those kernels also removes these launch gaps."""
        g = self.gaps
        if g.empty:
            return {}
        mine, first = _row_array(rows), _row_array(exclude_first)
        hit = (g["next_kind"] == "kernel").to_numpy() & np.isin(g["next_row"].to_numpy(), np.setdiff1d(mine, first))
        if after:
            hit |= (g["prev_kind"] == "kernel").to_numpy() & np.isin(g["prev_row"].to_numpy(), mine)
        m = hit & g["cause"].isin(["launch", "other"]).to_numpy()
        return units_of("gap", self.rank, g.index[m], g["real_dur"].to_numpy()[m])

    def in_optimizer(self) -> pd.Series:
        """Kernels the optimizer launched: inside its own work of an ``Optimizer.step#...`` span
        (torch.optim records one per step; :func:`gpuprof.idle.optimizer_spans` leaves out a
        training closure run inside it). Found once per view; read-only."""
        return self._mask("optimizer", self._in_optimizer)

    def _in_optimizer(self) -> pd.Series:
        spans = self.optimizer_spans()
        k = self.kernels
        if spans.empty:
            return pd.Series(False, index=k.index)
        st, en = spans["ts"].to_numpy(), spans["end"].to_numpy()
        i = np.searchsorted(st, k["launch_ts"].to_numpy(), side="right") - 1
        inside = (i >= 0) & (k["launch_ts"].to_numpy() < en[np.maximum(i, 0)])
        return pd.Series(inside, index=k.index)

    def in_update_loop(self) -> pd.Series:
        """Kernels launched by a per-parameter update loop that no optimizer annotated
        (:func:`gpuprof.hostops.update_loops`: the same few ops once per parameter after backward),
        on the loop's thread. Found once per view; read-only."""
        return self._mask("loop", self._in_update_loop)

    def _in_update_loop(self) -> pd.Series:
        loops = self.update_loops()
        k = self.kernels
        if loops.empty:
            return pd.Series(False, index=k.index)
        inside = np.zeros(len(k), dtype=bool)
        lt, tid = k["launch_ts"].to_numpy(dtype=float), k["launch_tid"].to_numpy()
        for s, e, th in zip(loops["ts"].to_numpy(), loops["end"].to_numpy(), loops["tid"].to_numpy()):  # one per step
            inside |= (lt >= s) & (lt <= e) & (tid == th)
        return pd.Series(inside, index=k.index)

    def in_update(self) -> pd.Series:
        """Kernels of the parameter update, whoever launched it: the optimizer's
        (:meth:`in_optimizer`) or an unannotated per-parameter loop's (:meth:`in_update_loop`).
        The model's fusions leave them to optimizer_fusion; ``torch.compile(model)`` leaves them eager.
        Found once per view; read-only."""
        return self._mask("update", lambda: self.in_optimizer() | self.in_update_loop())

    def _mask(self, key: str, make: Callable[[], pd.Series]) -> pd.Series:
        """A kernel mask of the view, made once (read-only, like the kernels)."""
        out: pd.Series = self.shared(f"mask:{key}", make)
        return out

    def shared(self, key: str, make: Callable[[], Any]) -> Any:
        """A value derived from the view that several readers ask for (the gaps of one cause, the
        update masks, ``analyzers.inference``'s token passes and per-request repeats, which
        launch_overhead reads too), made once by the first that asks (read-only, like the kernels)."""
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]

    def host_confidence(self, otherwise: str = "high") -> str:
        """Confidence of a host-side estimate: lower when the unprofiled step time is unknown."""
        return otherwise if self.host_scale_known else "low"
