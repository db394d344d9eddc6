#!/usr/bin/env bash
# Collector checks on a GPU machine (run from the repository root): the overhead benchmark, a
# recorded bf16 GPT training run (kept as a sample run folder with NVML and GPM series), and a
# sustained GEMM loop that reaches the power limit (the gpu_throttling sample).
set -u
R=${1:?usage: record_collector.sh OUTDIR}
mkdir -p "$R"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
P=sample_traces/programs
timeout 240 python3 benchmarks/record_overhead.py "$R/overhead" 2>&1 | grep -v Warn | tail -12
timeout 120 python3 -m gpuprof.cli record --out "$R/run_gpt_bf16" -- python3 $P/gpt.py --no-profile \
  --out /tmp/unused.json.gz --timed-steps 40 2>&1 | tail -3
timeout 150 python3 -m gpuprof.cli record --out "$R/run_gemm_loop" --skip-steps 200 --timed-steps 10 -- \
  python3 $P/gemm_loop.py 300 2>&1 | tail -3
python3 - "$R" <<'PY'
import csv, sys, collections
for run in ("run_gpt_bf16", "run_gemm_loop"):
    rows = list(csv.DictReader(open(f"{sys.argv[1]}/{run}/nvml.csv")))
    reasons = collections.Counter(r["clock_event_reasons"] for r in rows)
    clocks = [float(r["sm_clock_mhz"]) for r in rows if r["sm_clock_mhz"]]
    print(run, len(rows), "samples; SM clock min/max", min(clocks), max(clocks), "reasons", dict(reasons),
          "gpm", rows[-1]["gpm_tensor_util_pct"], rows[-1]["gpm_sm_util_pct"])
PY
