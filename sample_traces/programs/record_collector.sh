#!/usr/bin/env bash
# Collector checks on a one-GPU machine (run from the repository root): the one-GPU sample run
# folders (run_gpt_bf16, run_gemm_loop, run_vision_workers, run_vision_inline), each beside the
# plain program's own synchronised timing (timings/NAME.json) so the recorder's unprofiled step
# time (CUDA events) can be checked against it and against the traced GPU busy time per step; then
# the overhead benchmark (SKIP_OVERHEAD=1 leaves it out) and the NVML summary of two runs.
#   bash sample_traces/programs/record_collector.sh OUTDIR
set -u
R=${1:?usage: record_collector.sh OUTDIR}
mkdir -p "$R/timings"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
P=sample_traces/programs
U=/tmp/gpuprof-unused.json.gz
rec() {  # rec NAME LIMIT_S [RECORD_OPTS...] -- PROGRAM ARGS...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" python3 -m gpuprof.cli record --out "$R/$name" "$@" >"$R/$name.log" 2>&1 \
    || echo "FAIL $name rc=$?" | tee -a "$R/failures.txt"
  echo "$name $((SECONDS - t0))s: $(grep -h 'gpuprof: run folder\|step ' "$R/$name.log" | tr '\n' ' ')"
}
plain() {  # plain NAME PROGRAM ARGS...: the program's own timing without gpuprof
  local name=$1 prog=$2; shift 2
  timeout 150 python3 "$P/$prog" --out $U --no-profile --timing-out "$R/timings/$name.json" "$@" 2>&1 | grep '^step'
}
plain gpt_bf16 gpt.py --timed-steps 40
rec run_gpt_bf16 150 -- python3 $P/gpt.py --no-profile --out $U --timed-steps 40
rec run_gemm_loop 150 --skip-steps 200 --timed-steps 10 -- python3 $P/gemm_loop.py 300
plain vision_workers vision.py --loader workers --timed-steps 20
rec run_vision_workers 150 -- python3 $P/vision.py --loader workers --no-profile --out $U --timed-steps 20
plain vision_inline vision.py --loader inline --timed-steps 5
rec run_vision_inline 240 -- python3 $P/vision.py --loader inline --no-profile --out $U --timed-steps 20
for run in run_gpt_bf16 run_gemm_loop run_vision_workers run_vision_inline; do
  python3 -m gpuprof.cli report "$R/$run" --format json --no-cache -o "$R/${run}_report.json" 2>/dev/null
done
python3 - "$R" <<'PY'
import csv, collections, gzip, io, json, os, sys, tarfile
R = sys.argv[1]
own = {"run_gpt_bf16": "gpt_bf16", "run_vision_workers": "vision_workers", "run_vision_inline": "vision_inline"}
print("run | unprofiled ms | timed how | host-clock ms | plain program ms | traced GPU busy ms/step | traced step ms | "
      "folder .tar.gz KB")
for run in ("run_gpt_bf16", "run_gemm_loop", "run_vision_workers", "run_vision_inline"):
    try:
        m = json.load(open(f"{R}/{run}/manifest.json"))
        s = json.load(open(f"{R}/{run}_report.json"))["summary"]
    except (OSError, ValueError) as e:
        print(run, "MISSING", e)
        continue
    t = m["ranks"][0]["unprofiled_timing"] if m["ranks"] else {}
    plain = json.load(open(f"{R}/timings/{own[run]}.json"))["step_ms"] if run in own else None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(f"{R}/{run}", arcname=run)
    print(run, "|", m["unprofiled_step_ms"], "|", t.get("method"), t.get("why") or "", "|", t.get("host_step_ms"), "|",
          plain, "|", round(s["step_time_ms"] * s["gpu_busy_pct"] / 100, 3), "|", s["step_time_ms"], "|",
          len(buf.getvalue()) // 1024, "| failures:", m["failures"])
for run in ("run_gpt_bf16", "run_gemm_loop"):
    rows = list(csv.DictReader(open(f"{R}/{run}/nvml.csv")))
    reasons = collections.Counter(r["clock_event_reasons"] for r in rows)
    clocks = [float(r["sm_clock_mhz"]) for r in rows if r["sm_clock_mhz"]]
    print(run, len(rows), "samples; SM clock min/max", min(clocks), max(clocks), "reasons", dict(reasons),
          "gpm", rows[-1]["gpm_tensor_util_pct"], rows[-1]["gpm_sm_util_pct"])
PY
[ -n "${SKIP_OVERHEAD:-}" ] || timeout 240 python3 benchmarks/record_overhead.py "$R/overhead" 2>&1 | grep -v Warn | tail -12
