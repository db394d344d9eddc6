#!/usr/bin/env bash
# Host wall time per region of a training step (forward, backward, syncs, optimizer), measured
# without the profiler (the timed windows) and under it (the recorded steps) in the same process
# (--region-times): how the profiler's cost on the host is spread over a step, the assumption
# behind gpuprof's deflation of the profiled host (docs/replay.md, "The profiler's cost").
#
#   bash sample_traces/programs/record_regions.sh OUTDIR [ROUNDS]
set -u
R=${1:?usage: record_regions.sh OUTDIR [ROUNDS]}
ROUNDS=${2:-2}
mkdir -p "$R"
P=sample_traces/programs
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
PROGRAMS=(
  "two_sync_forloop|gpt.py --timing-windows 4 --timed-steps 25 --host-sync --optim forloop"
  "two_gpunorm_forloop|gpt.py --timing-windows 4 --timed-steps 25 --grad-norm-on-gpu --optim forloop"
  "two_sync_fused|gpt.py --timing-windows 4 --timed-steps 25 --host-sync"
  "two_gpunorm_fused|gpt.py --timing-windows 4 --timed-steps 25 --grad-norm-on-gpu"
  "gpt_adamw_forloop|gpt.py --timing-windows 4 --timed-steps 25 --optim forloop"
  "llama_bf16|hf.py"
  "llama_host_sync|hf.py --host-sync"
  "resnet50_bf16_cl|cnn.py"
  "resnet50_bf16_nchw|cnn.py --memory-format nchw"
  "convnext_tiny_bf16_cl|cnn.py --arch convnext_tiny"
)
for ((round = 1; round <= ROUNDS; round++)); do
  for e in "${PROGRAMS[@]}"; do
    IFS='|' read -r name cmd <<<"$e"
    [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]] && continue
    set -- $cmd
    prog=$1; shift
    timeout 200 $PY "$P/$prog" "$@" --out "$R/$name.r$round.json.gz" --timing-out "$R/$name.r$round.timing.json" \
      --region-times "$R/$name.r$round.regions.json" >"$R/$name.r$round.log" 2>&1 \
      || echo "FAIL $name round $round rc=$?" | tee -a "$R/failures.txt"
    echo "$round $name $(grep -h 'step' "$R/$name.r$round.log" | tail -1)"
  done
done
