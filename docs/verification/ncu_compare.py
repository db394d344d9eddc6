"""Compare gpuprof's kernel classes with Nsight Compute's SpeedOfLight section.

Inputs are what sample_traces/programs/record_all.sh recorded on the H200: the Kineto trace of a
program, and `ncu --section SpeedOfLight --nvtx-include ncu_step/ --csv` of the same program, one
training step wrapped in an NVTX range. NVTX ranges are per thread, so ncu sees the kernels the
main thread launched in that step (forward and optimizer; autograd's backward thread is outside
the range). Those are matched by launch order to the main-thread kernels of one profiled step.

ncu's view: SM% = "Compute (SM) Throughput", MEM% = "Memory Throughput" (both % of peak).
Its class: `latency` when max(SM%, MEM%) < 40 (neither unit is busy), else the larger one.
A second view uses DRAM% instead of MEM%: the DRAM roof is the one gpuprof's roofline uses,
while MEM% is the busiest of L1, L2 and DRAM.

    python docs/verification/ncu_compare.py TRACE NCU_CSV[.gz]
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import sys

import numpy as np
import pandas as pd

import gpuprof


def read_ncu(path: str) -> pd.DataFrame:
    raw = gzip.open(path, "rt").read() if path.endswith(".gz") else open(path).read()
    rows = list(csv.DictReader(io.StringIO(raw[raw.index('"ID"'):])))
    df = pd.DataFrame(rows)
    df["value"] = pd.to_numeric(df["Metric Value"].str.replace(",", ""), errors="coerce")
    wide = df.pivot_table(index=["ID", "Kernel Name"], columns="Metric Name", values="value", aggfunc="first")
    wide = wide.reset_index()
    wide["ID"] = wide["ID"].astype(int)
    return wide.sort_values("ID").reset_index(drop=True)


def kernel_key(name: str) -> str:
    """The kernel's identity without namespaces, spaces and argument lists, as both tools spell it."""
    x = re.sub(r"\(anonymous namespace\)::|<unnamed>::|\bat::|\bnative::|^void |\s+", "", name)
    return x.split("(", 1)[0][:90]


def main(trace: str, ncu_csv: str) -> None:
    a = gpuprof.analyze(trace)
    k = a.kernels
    k = k[k["step"] >= 0].assign(key=lambda d: d["name"].astype(str).map(kernel_key))
    bt = k.groupby(["key", k["bound"].astype(str)])["dur"].sum().unstack(fill_value=0.0)
    mine = pd.DataFrame({"gpuprof": bt.idxmax(axis=1), "trace_us": bt.sum(axis=1),
                         "roof_pct": k.groupby("key")["roofline_pct"].median()})
    ncu = read_ncu(ncu_csv)
    ncu["key"] = ncu["Kernel Name"].map(kernel_key)
    sm, mem = ncu["Compute (SM) Throughput"].to_numpy(), ncu["Memory Throughput"].to_numpy()
    ncu["cls"] = np.where(np.maximum(sm, mem) < 40, "latency", np.where(sm >= mem, "compute", "memory"))
    dram = ncu["DRAM Throughput"].to_numpy()
    ncu["dram_cls"] = np.where(np.maximum(sm, dram) < 40, "latency", np.where(sm >= dram, "compute", "memory"))
    nt = ncu.groupby(["key", "cls"])["Duration"].sum().unstack(fill_value=0.0)
    dt = ncu.groupby(["key", "dram_cls"])["Duration"].sum().unstack(fill_value=0.0)
    theirs = pd.DataFrame({"ncu": nt.idxmax(axis=1), "ncu_dram": dt.idxmax(axis=1),
                           "ncu_SM%": ncu.groupby("key")["Compute (SM) Throughput"].median(),
                           "ncu_DRAM%": ncu.groupby("key")["DRAM Throughput"].median(),
                           "ncu_MEM%": ncu.groupby("key")["Memory Throughput"].median(),
                           "ncu_kernels": ncu.groupby("key").size()})
    both = mine.join(theirs, how="inner").sort_values("trace_us", ascending=False)
    both = both[both["gpuprof"] != "unknown"]
    w = both["trace_us"]
    print(f"{trace}: {len(theirs)} kernel keys in ncu's range, {len(both)} also modelled by gpuprof")
    for col, what in (("ncu", "SM% vs Memory Throughput% (busiest of L1/L2/DRAM)"), ("ncu_dram", "SM% vs DRAM%")):
        agree = both["gpuprof"] == both[col]
        print(f"  agreement with ncu by {what}: {100 * agree.mean():.0f}% of keys, "
              f"{100 * (w * agree).sum() / w.sum():.0f}% of their trace time")
    both.index = [i[:70] for i in both.index]
    print(both.round(1).to_string())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
