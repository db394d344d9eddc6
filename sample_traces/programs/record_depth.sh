#!/usr/bin/env bash
# Records the defect/fixed pairs of issues #10 and #12 on one GPU (an H200 here), one program
# after another, each with its unprofiled step time (two timed windows in the same process):
#   bash sample_traces/programs/record_depth.sh OUTDIR [GROUP...]
# Groups: shapes python sync alloc stall gpuonly capture cnn mlp decode compile (default: all but compile).
set -u
R=${1:?usage: record_depth.sh OUTDIR [GROUP...]}
shift
GROUPS_=${*:-shapes python sync alloc stall gpuonly capture cnn mlp decode}
mkdir -p "$R"
P=sample_traces/programs
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}

run() {  # run NAME LIMIT_S PROGRAM ARGS...
  local name=$1 limit=$2 prog=$3; shift 3
  local t0=$SECONDS
  timeout "$limit" $PY "$P/$prog" --out "$R/$name.json.gz" --timing-out "$R/$name.timing.json" "$@" \
    >"$R/$name.log" 2>&1 || echo "FAIL $name rc=$?" | tee -a "$R/failures.txt"
  echo "$name $((SECONDS - t0))s $(grep -h '^step\|] step' "$R/$name.log" | tr '\n' ' ')"
}
G="--timing-windows 2"
has() { [[ " $GROUPS_ " == *" $1 "* ]]; }

has shapes && {
  run gpt_misaligned 90 gpt.py $G --d-model 1020 --heads 4 --ffn 4084 --vocab 50257
  run gpt_aligned 90 gpt.py $G --d-model 1024 --heads 4 --ffn 4096 --vocab 50304
  run llama_misaligned 120 hf.py --hidden 1020 --heads 10 --inter 2750 --vocab 32001
  run llama_aligned 120 hf.py --hidden 1040 --heads 10 --inter 2752 --vocab 32000
  run bert_vocab30522 120 hf.py --model bert --hidden 768 --heads 12 --inter 3072 --vocab 30522 --batch 16 --seq 256
  run bert_vocab30528 120 hf.py --model bert --hidden 768 --heads 12 --inter 3072 --vocab 30528 --batch 16 --seq 256
}
has python && {
  run gpt_python_inline 120 gpt.py $G --python-work inline
  run gpt_python_workers 120 gpt.py $G --python-work workers
  run llama_python_inline 120 hf.py --python-work inline
  run llama_python_workers 120 hf.py --python-work workers
}
has sync && {
  run gpt_host_sync_stack 120 gpt.py $G --host-sync --with-stack --active 1
  run llama_host_sync_stack 120 hf.py --host-sync --with-stack --active 1
  run llama_bf16 120 hf.py
}
has alloc && {
  run gpt_empty_cache 120 gpt.py $G --empty-cache
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 run gpt_no_caching_allocator 150 gpt.py $G
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 run resnet50_no_caching_allocator 150 cnn.py --arch resnet50
}
has stall && run gpt_checkpoint_every3 150 gpt.py $G --checkpoint-every 3 --timed-steps 21
has gpuonly && {
  run gpt_gpu_only 90 gpt.py $G --gpu-only
  run resnet50_gpu_only 120 cnn.py --arch resnet50 --gpu-only
}
has capture && run tiny_graph_capture 90 gpt.py $G --size tiny --dropout 0 --cuda-graph --profile-capture
has cnn && {
  for arch in resnet50 convnext_tiny; do
    run ${arch}_fp32_nchw 150 cnn.py --arch $arch --precision fp32 --memory-format nchw
    run ${arch}_bf16_nchw 150 cnn.py --arch $arch --precision bf16 --memory-format nchw
    run ${arch}_bf16_cl 150 cnn.py --arch $arch --precision bf16 --memory-format cl
  done
}
has mlp && {
  run mlp_eager 90 mlp.py --timed-steps 100
  run mlp_graph 90 mlp.py --cuda-graph --timed-steps 100
}
has decode && {
  run llama_generate_b1 150 hf.py --mode generate --batch 1 --layers 16 --hidden 2048 --heads 16 --inter 5632 --timed-steps 3 --warmup-steps 2 --active 2
  run llama_generate_b1_static 150 hf.py --mode generate --batch 1 --layers 16 --hidden 2048 --heads 16 --inter 5632 --static-cache --timed-steps 3 --warmup-steps 2 --active 2
}
has compile && {
  run gpt_compile 300 gpt.py $G --compile
  run llama_compile 300 hf.py --compile
  run resnet50_bf16_cl_compile 300 cnn.py --arch resnet50 --compile
  run llama_generate_b1_static_compile 300 hf.py --mode generate --batch 1 --layers 16 --hidden 2048 --heads 16 --inter 5632 --static-cache --compile --timed-steps 3 --warmup-steps 3 --active 2
}
ls -la "$R"
