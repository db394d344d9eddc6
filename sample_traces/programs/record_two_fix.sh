#!/usr/bin/env bash
# Records a program with two defects at once and its three twins in one session on one H200, for
# the combined what-if projection (issue #13; tests/test_fixes.py::test_two_fixes_projection):
#   gpt_sync_forloop   gpt.py --host-sync --optim forloop   (both defects)
#   gpt_host_sync      gpt.py --host-sync                   (optimizer fixed)
#   gpt_adamw_forloop  gpt.py --optim forloop               (sync fixed)
#   gpt_bf16           gpt.py                               (both fixed)
# Run from the repository root:  bash sample_traces/programs/record_two_fix.sh OUTDIR
# Bring back OUTDIR/*.json.gz and OUTDIR/*.timing*.json; gpt_sync_forloop.json.gz goes to
# sample_traces/h200/, and the timings of all four (mean of the two runs, as the other samples)
# to sample_traces/h200/timings/two_fix/ (kept apart: the twins re-timed in this session).
set -u
R=${1:?usage: record_two_fix.sh OUTDIR}
mkdir -p "$R"
P=sample_traces/programs
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}

run() {  # run NAME LIMIT_S PROGRAM ARGS...  (as record_all.sh: a profiled run, then an unprofiled timing)
  local name=$1 limit=$2 prog=$3; shift 3
  timeout "$limit" $PY "$P/$prog" --out "$R/$name.json.gz" --timing-out "$R/$name.timing.json" "$@" \
    >"$R/$name.log" 2>&1 || echo "FAIL $name rc=$?" | tee -a "$R/failures.txt"
  timeout "$limit" $PY "$P/$prog" --out /tmp/unused.json.gz --timing-out "$R/$name.timing2.json" --no-profile "$@" \
    >>"$R/$name.log" 2>&1 || echo "FAIL $name (second timing) rc=$?" | tee -a "$R/failures.txt"
}

run gpt_sync_forloop 150 gpt.py --host-sync --optim forloop
run gpt_host_sync 120 gpt.py --host-sync
run gpt_adamw_forloop 120 gpt.py --optim forloop
run gpt_bf16 120 gpt.py
