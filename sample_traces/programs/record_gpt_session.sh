#!/usr/bin/env bash
# Records gpt_bf16 and every gpt.py program whose fixed twin it is, in ONE device session, so the
# realised savings of their pairs compare like with like. Earlier pairs mixed sessions and the
# host speed of the lent machine differs between sessions (gpt_bf16, host-bound, read 8.90 ms on
# 2026-11-30 and 12-18 ms on 2026-12-01), which made host-side realised savings meaningless.
# Also gpt_sync_forloop, the first two-defect program of issue #13 (its twins' set, two_*, is
# recorded by record_interleaved.sh, which times each program in six processes).
#
#   bash sample_traces/programs/record_gpt_session.sh OUTDIR
#   SET=decode bash ... OUTDIR        # host-bound batch-1 decode and its CUDA-graph twin
#
# Pass 1: each program profiled, after two unprofiled timed windows in the same process
# (NAME.timing.json). Pass 2: the same programs again in reverse order, unprofiled only
# (NAME.timing2.json), to show the spread within the session. machine.txt says what ran it.
set -u
R=${1:?usage: record_gpt_session.sh OUTDIR}
mkdir -p "$R"
P=sample_traces/programs
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
{
  date -u; uname -r; nproc; grep -m1 "model name" /proc/cpuinfo; uptime
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
  $PY -c "import torch; print('torch', torch.__version__)"
} >"$R/machine.txt" 2>&1

G="--timing-windows 2"
# name | environment | gpt.py arguments
case ${SET:-all} in
decode)  # issue #12 class 7: a small GPT generating at batch 1, eager vs one CUDA graph per token
  PROGRAMS=(
    "gpt_decode_b1||--mode decode --batch 1"
    "gpt_decode_b1_graph||--mode decode --batch 1 --cuda-graph"
  ) ;;
all)
PROGRAMS=(
  "gpt_bf16||"
  "gpt_fp32||--precision fp32"
  "gpt_vocab50257||--vocab 50257"
  "gpt_manual_attn||--attn manual"
  "gpt_naive_elementwise||--elementwise naive"
  "gpt_adamw_forloop||--optim forloop"
  "gpt_host_sync||--host-sync"
  "gpt_sync_forloop||--host-sync --optim forloop"
  "gpt_host_sync_stack||--host-sync --with-stack --active 1"
  "gpt_empty_cache||--empty-cache"
  "gpt_no_caching_allocator|PYTORCH_NO_CUDA_MEMORY_CACHING=1|"
  "gpt_checkpoint_every3||--checkpoint-every 3 --timed-steps 21"
) ;;
*) echo "unknown SET=$SET" >&2; exit 2 ;;
esac

run() {  # run PASS ENTRY
  local pass=$1 name env args t0=$SECONDS
  IFS='|' read -r name env args <<<"$2"
  if [ "$pass" = 1 ]; then
    env $env timeout 150 $PY "$P/gpt.py" $G $args --out "$R/$name.json.gz" --timing-out "$R/$name.timing.json" \
      >"$R/$name.log" 2>&1 || echo "FAIL $name rc=$?" | tee -a "$R/failures.txt"
  else
    env $env timeout 150 $PY "$P/gpt.py" $G $args --no-profile --out /tmp/unused.json.gz \
      --timing-out "$R/$name.timing2.json" >>"$R/$name.log" 2>&1 || echo "FAIL $name pass 2 rc=$?" | tee -a "$R/failures.txt"
  fi
  echo "$pass $name $((SECONDS - t0))s $(grep -h '^step\|] step' "$R/$name.log" | tail -1)"
}

for e in "${PROGRAMS[@]}"; do run 1 "$e"; done
for ((i = ${#PROGRAMS[@]} - 1; i >= 0; i--)); do run 2 "${PROGRAMS[$i]}"; done
ls -la "$R"
