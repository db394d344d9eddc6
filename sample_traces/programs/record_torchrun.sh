#!/usr/bin/env bash
# On a 2-GPU machine, from the repository root: the NVML sampler's CPU cost (three 10 s runs),
# `gpuprof record -- torchrun` of a 2-rank DDP GPT whose last rank is slow (kept as the sample run
# folder run_ddp2_slow, with NVML/GPM series of both GPUs), its JSON report, and the recorder's
# step-time overhead on a GPU-bound bf16 GPT loop.
set -u
R=${1:?usage: record_torchrun.sh OUTDIR}
mkdir -p "$R"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
P=sample_traces/programs
for g in 0 0,1; do timeout 90 python3 benchmarks/sampler_cost.py 30 $g 2>&1 | grep -v Warn | head -3 | tee -a "$R/sampler_cost.txt"; done
timeout 240 python3 -m gpuprof.cli record --out "$R/run_ddp2_slow" -- torchrun --standalone --nproc_per_node 2 \
  $P/gpt.py --ddp --slow-rank-ms 40 --no-profile --out /tmp/unused.json.gz --timed-steps 30 2>&1 | tail -4
python3 -m gpuprof.cli report "$R/run_ddp2_slow" --format json > "$R/run_ddp2_slow_report.json"
python3 -m gpuprof.cli report "$R/run_ddp2_slow" --format text | head -40
GPUPROF_BENCH_BATCH=32 timeout 240 python3 benchmarks/record_overhead.py "$R/overhead" ${OVERHEAD_VARIANTS:-} 2>&1 | grep -v Warn | tail -12
# (on one GPU) DataLoader worker processes under the recorder: run_vision_workers, run_vision_inline
#   for L in workers inline; do python3 -m gpuprof.cli record --out "$R/run_vision_$L" -- \
#     python3 $P/vision.py --loader $L --no-profile --out /tmp/u.json.gz --timed-steps 20; done
