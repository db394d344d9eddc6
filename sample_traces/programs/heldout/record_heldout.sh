#!/usr/bin/env bash
# Records issue #24's held-out before/after pairs (sample_traces/h200/heldout_pairs.json: 113
# programs, 62 pairs, rounds 1-12; ONLY= picks a round's; round 4's framework pairs are recorded
# by programs/frameworks/record_pairs.sh, and the runner passes over them) on one GPU in one call, and times every
# program without the profiler, interleaved with its twins, in as many processes each as the budget allows (runner.py says how):
#
#   bash sample_traces/programs/heldout/record_heldout.sh OUTDIR [PACKDIR]
#
# OUTDIR gets NAME.json.gz (traces), timings/NAME.json (merged timings), raw/, logs/, runs.jsonl,
# scaled_mm_check.json, machine.txt and summary.txt (the table: pair, bad ms +- noise, good ms +-
# noise, realised saving). PACKDIR (the device's $OUT: at most 8 files of 16 MiB come back) gets
# summary.txt, heldout_timings.tar.gz (timings/, to unpack into sample_traces/h200/),
# heldout_raw.tar.gz (raw/, logs/, runs, machine, summary.json, the scaled_mm check) and the traces
# as heldout_traces.tar.0, .1, ... (15 MiB parts: `cat heldout_traces.tar.* | tar x -C sample_traces/h200`).
#
# Everything ends within BUDGET_S seconds (default 510) of this script's start, imports included.
# DRY=1: every program on the CPU at its --tiny size (a dry run of the whole script, no GPU needed).
# Other knobs: MODE=proc (a fresh python per process instead of forks of one that imported
# torch/transformers/timm once), WINDOWS (3 per process), ONLY=name,name, TIMEOUT_S (one process's
# limit in round 1, default 90; later rounds 3/4 of it), PYTHON.
set -u
R=${1:?usage: record_heldout.sh OUTDIR [PACKDIR]}
PACK=${2:-}
START=$(date +%s.%N)
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-510}
mkdir -p "$R"
# NVLink multicast stays off on the lent machines (KINDS.md); nothing here uses NCCL, but children inherit this
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1  # nothing may download (no network there)
{
  date -u; uname -r; nproc; grep -m1 "model name" /proc/cpuinfo; uptime
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv 2>&1
  echo "BUDGET_S=$BUDGET_S MODE=${MODE:-fork} WINDOWS=${WINDOWS:-3} DRY=${DRY:-0} ONLY=${ONLY:-}"
} >"$R/machine.txt" 2>&1

ARGS=(--start "$START" --budget-s "$BUDGET_S" --mode "${MODE:-fork}" --python "$PY" --windows "${WINDOWS:-3}")
[ "${DRY:-0}" = 1 ] && ARGS+=(--dry)
[ -n "${ONLY:-}" ] && ARGS+=(--only "$ONLY")
[ -n "${TIMEOUT_S:-}" ] && ARGS+=(--timeout-s "$TIMEOUT_S")  # one process's limit in round 1 (compiling programs need more)
# the runner's own limit: the budget plus a margin (it stops itself before; this is the backstop)
timeout -k 5 "$(awk "BEGIN{print int($BUDGET_S + 20)}")" "$PY" "$HERE/runner.py" "$R" "${ARGS[@]}" 2>&1 | tee "$R/runner.log"
echo "runner exit ${PIPESTATUS[0]}" | tee -a "$R/runner.log"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv >>"$R/machine.txt" 2>&1

if [ -n "$PACK" ]; then
  mkdir -p "$PACK"
  cp "$R/summary.txt" "$PACK/summary.txt" 2>/dev/null || cp "$R/runner.log" "$PACK/summary.txt"
  tar czf "$PACK/heldout_timings.tar.gz" -C "$R" timings
  tar czf "$PACK/heldout_raw.tar.gz" -C "$R" raw logs $(cd "$R" && ls runs.jsonl summary.json summary.txt \
    scaled_mm_check.json machine.txt runner.log failures.txt 2>/dev/null)
  MB=$(du -cm "$R"/*.json.gz 2>/dev/null | tail -1 | cut -f1)
  [ "${MB:-0}" -gt 58 ] && echo "WARNING: traces take ${MB} MiB: more than the 64 MiB (8 files) that come back from the device"
  (cd "$R" && ls ./*.json.gz >/dev/null 2>&1 && tar cf - ./*.json.gz) | split -b 15m -d -a 1 - "$PACK/heldout_traces.tar."
  du -ch "$R"/*.json.gz 2>/dev/null | tail -1 | sed 's/^/traces: /'
  ls -la "$PACK"
fi
awk -v s="$START" 'BEGIN{"date +%s.%N" | getline e; printf "record_heldout.sh: %.0f s in all\n", e - s}'
