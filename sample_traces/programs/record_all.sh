#!/usr/bin/env bash
# Records every sample trace in sample_traces/ on a 2-GPU H200 machine, with the unprofiled step
# timings (the realised before/after numbers), Nsight Compute SpeedOfLight sections for the two GPT
# programs, and a `gpuprof calibrate` spec file. Run from the repository root:
#   bash sample_traces/programs/record_all.sh OUTDIR
# Single-GPU programs run one after another on GPU 0: programs timed side by side slow each other's
# host work (seen here: CPU-heavy data loading in one queue inflated the other queue's timings).
# Each program's unprofiled timing is taken twice (NAME.timing.json, NAME.timing2.json).
# SKIP_DDP=1, SKIP_NCU=1 and SKIP_CALIBRATE=1 leave those parts out.
set -u
R=${1:?usage: record_all.sh OUTDIR}
mkdir -p "$R"
P=sample_traces/programs
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

run() {  # run NAME LIMIT_S PROGRAM ARGS...
  local name=$1 limit=$2 prog=$3; shift 3
  local t0=$SECONDS
  timeout "$limit" $PY "$P/$prog" --out "$R/$name.json.gz" --timing-out "$R/$name.timing.json" "$@" \
    >"$R/$name.log" 2>&1 || echo "FAIL $name rc=$?" | tee -a "$R/failures.txt"
  timeout "$limit" $PY "$P/$prog" --out /tmp/unused.json.gz --timing-out "$R/$name.timing2.json" --no-profile "$@" \
    >>"$R/$name.log" 2>&1 || echo "FAIL $name (second timing) rc=$?" | tee -a "$R/failures.txt"
  echo "$name $((SECONDS - t0))s $(grep -h 'step' "$R/$name.log" | grep -v Warn | tr '\n' ' ')"
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv >"$R/nvidia-smi.csv"
$PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count())' | tee "$R/versions.txt"

queue_a() {
  export CUDA_VISIBLE_DEVICES=0
  run gpt_bf16 120 gpt.py
  run gpt_fp32 150 gpt.py --precision fp32
  run gpt_vocab50257 120 gpt.py --vocab 50257
  run gpt_manual_attn 120 gpt.py --attn manual
  run gpt_naive_elementwise 120 gpt.py --elementwise naive
  run gpt_adamw_forloop 120 gpt.py --optim forloop
  run gpt_host_sync 120 gpt.py --host-sync
  [ -n "${SKIP_NCU:-}" ] && return
  for v in bf16 fp32; do
    timeout 170 ncu --clock-control none --section SpeedOfLight --nvtx --nvtx-include "ncu_step/" --csv \
      --log-file "$R/ncu_gpt_$v.csv" $PY $P/gpt.py --out /tmp/unused.json.gz --precision $v \
      --no-profile --timed-steps 3 --nvtx-step 1 >"$R/ncu_gpt_$v.log" 2>&1 || echo "FAIL ncu $v" | tee -a "$R/failures.txt"
    echo "ncu $v done"
  done
}

queue_b() {
  export CUDA_VISIBLE_DEVICES=0
  run tiny_eager 90 gpt.py --size tiny --dropout 0
  run tiny_graph 90 gpt.py --size tiny --dropout 0 --cuda-graph
  run decode_b1 120 gpt.py --mode decode --size decode --batch 1 --active 8
  run decode_b64 120 gpt.py --mode decode --size decode --batch 64 --active 8
  run vision_inline 150 vision.py --loader inline --timed-steps 5
  run vision_workers 150 vision.py --loader workers
  run vision_pageable 120 vision.py --loader pageable
  run vision_pinned 120 vision.py --loader pinned
  [ -n "${SKIP_CALIBRATE:-}" ] && return
  timeout 120 $PY -m gpuprof.calibrate "$R/h200_calibrated.json" >"$R/calibrate.log" 2>&1 || echo "FAIL calibrate" | tee -a "$R/failures.txt"
  echo "calibrate done"
}

queue_a 2>&1 | tee "$R/queue_a.txt"
queue_b 2>&1 | tee "$R/queue_b.txt"

if [ -z "${SKIP_DDP:-}" ] && [ "$($PY -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  ddp() {  # ddp NAME ARGS...
    local name=$1; shift
    timeout 150 $PY -m torch.distributed.run --standalone --nproc_per_node 2 $P/gpt.py --ddp \
      --out "$R/${name}_rankRANK.json.gz" --timing-out "$R/${name}_rankRANK.timing.json" "$@" \
      >"$R/$name.log" 2>&1 || echo "FAIL $name" | tee -a "$R/failures.txt"
    echo "$name: $(grep -h 'step' "$R/$name.log" | tail -n 2 | tr '\n' ' ')"
  }
  ddp ddp_good
  ddp ddp_manual_allreduce --manual-allreduce
  ddp ddp_slow_rank --slow-rank-ms 40
fi
ls -la "$R"
