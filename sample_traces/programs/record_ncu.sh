#!/usr/bin/env bash
# Nsight Compute SpeedOfLight readings of one training step of a torchvision CNN and an HF Llama,
# each beside a Kineto trace of the same program recorded on the same machine just before, for
# docs/verification/ncu_compare.py (issue #12: gpuprof's kernel classes against ncu's).
#   bash sample_traces/programs/record_ncu.sh OUTDIR
# ncu profiles from cudaProfilerStart to cudaProfilerStop, which harness.py --nvtx-step puts around
# step 1 of the first timed window: process-wide, so the backward kernels that autograd's own thread
# launches are inside it too (an NVTX include filter with process scope profiled nothing in 210 s on
# 2026-12-01). NAME_ncu_progress.txt samples the number of kernels profiled every 20 s.
set -u
R=${1:?usage: record_ncu.sh OUTDIR}
mkdir -p "$R"
P=sample_traces/programs
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
ncu --version >"$R/ncu_version.txt" 2>&1
SPECS=${SPECS:-"resnet50_bf16_cl|cnn.py --arch resnet50;llama_bf16|hf.py"}
NCU_LIMIT=${NCU_LIMIT:-210}
COUNT=${LAUNCH_COUNT:+--launch-count $LAUNCH_COUNT}  # ncu writes its CSV only when it ends: bound the work
IFS=';' read -r -a LIST <<<"$SPECS"
for spec in "${LIST[@]}"; do
  IFS='|' read -r name args <<<"$spec"
  t0=$SECONDS
  timeout 150 $PY $P/$args --out "$R/$name.json.gz" --timing-out "$R/$name.timing.json" >"$R/$name.log" 2>&1 \
    || echo "FAIL trace $name rc=$?" | tee -a "$R/failures.txt"
  ( while sleep 20; do echo "$((SECONDS - t0))s $(grep -c '==PROF== Profiling' "$R/ncu_$name.csv" 2>/dev/null)"; done ) \
    >"$R/${name}_ncu_progress.txt" & PROG=$!
  timeout "$NCU_LIMIT" ncu --clock-control none --section SpeedOfLight --profile-from-start off $COUNT --csv \
    --log-file "$R/ncu_$name.csv" $PY $P/$args --out /tmp/unused.json.gz --no-profile --timed-steps 3 \
    --warmup-steps 3 --nvtx-step 1 >"$R/$name.ncu.log" 2>&1 || echo "FAIL ncu $name rc=$?" | tee -a "$R/failures.txt"
  kill $PROG 2>/dev/null
  gzip -f "$R/ncu_$name.csv"
  echo "$name $((SECONDS - t0))s $(grep -c '"ID"' <(zcat "$R/ncu_$name.csv.gz") ) header lines"
done
ls -la "$R"
