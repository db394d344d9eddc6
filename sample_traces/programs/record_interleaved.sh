#!/usr/bin/env bash
# Records a set of gpt.py programs with their unprofiled step times measured INTERLEAVED: ROUNDS
# rounds, each running every program once in its own process (the order rotated by one per round),
# so a drift of the lent machine's host speed over the session lands on every program alike.
# record_gpt_session.sh times each program in two processes only (pass 1 forward, pass 2 in
# reverse); on 2026-12-01 its two-defect set read 25.3-25.7 ms in one process and 31.6-31.7 ms in
# the other for the same program (two_sync_forloop), within 2 % inside each process, which made the
# realised savings of host-bound pairs uncertain by up to +-5 ms.
#
#   SET=two_defects ROUNDS=6 PROFILE_ROUND=3 bash sample_traces/programs/record_interleaved.sh OUTDIR
#   PIN="taskset -c 2-5" ...   # optional: every process on the same cores
#
# One process per (round, program), WINDOWS windows of STEPS steps each (NAME.rR.timing.json). In
# round PROFILE_ROUND the process also records the trace after its windows (NAME.json.gz). A first
# unrecorded process warms the machine up (CUDA init, clocks). merge_timings.py then writes
# NAME.timing.json: step_ms = mean over every window of every round.
set -u
R=${1:?usage: record_interleaved.sh OUTDIR}
mkdir -p "$R"
P=sample_traces/programs
PY=${PYTHON:-python3}
ROUNDS=${ROUNDS:-6}
PROFILE_ROUND=${PROFILE_ROUND:-3}
WINDOWS=${WINDOWS:-4}
STEPS=${STEPS:-25}
PIN=${PIN:-}
EXTRA=${EXTRA:-}  # more gpt.py arguments for every process (a CPU dry run: --device cpu --size tiny)
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
{
  date -u; uname -r; nproc; grep -m1 "model name" /proc/cpuinfo; uptime
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
  $PY -c "import torch; print('torch', torch.__version__)"
  echo "ROUNDS=$ROUNDS PROFILE_ROUND=$PROFILE_ROUND WINDOWS=$WINDOWS STEPS=$STEPS PIN='$PIN'"
} >"$R/machine.txt" 2>&1

PROG=gpt.py
case ${SET:-two_defects} in
two_defects)  # issue #13: host syncs + a per-parameter optimizer, each fixed the way gpuprof says
  PROGRAMS=(
    "two_sync_forloop|--host-sync --optim forloop"
    "two_gpunorm_forloop|--grad-norm-on-gpu --optim forloop"
    "two_sync_fused|--host-sync"
    "two_gpunorm_fused|--grad-norm-on-gpu"
  ) ;;
llama_two_defects)  # the same two defects in the HF Llama (hf.py): 2 syncs per step, a for-loop AdamW
  PROG=hf.py
  PROGRAMS=(
    "llama_sync_forloop|--host-sync --optim forloop"
    "llama_gpumetrics_forloop|--metrics-on-gpu --optim forloop"
    "llama_sync_fused|--host-sync"
    "llama_gpumetrics_fused|--metrics-on-gpu"
  ) ;;
*) echo "unknown SET=$SET" >&2; exit 2 ;;
esac
N=${#PROGRAMS[@]}

one() {  # one ROUND ENTRY
  local round=$1 name args t0=$SECONDS prof="--no-profile" out=/tmp/unused.json.gz
  IFS='|' read -r name args <<<"$2"
  if [ "$round" = "$PROFILE_ROUND" ]; then prof=""; out="$R/$name.json.gz"; fi
  timeout 150 $PIN $PY "$P/$PROG" --timing-windows "$WINDOWS" --timed-steps "$STEPS" $args $EXTRA $prof \
    --out "$out" --timing-out "$R/$name.r$round.timing.json" >>"$R/$name.log" 2>&1 \
    || echo "FAIL $name round $round rc=$?" | tee -a "$R/failures.txt"
  echo "$round $name $((SECONDS - t0))s $(grep -h 'step' "$R/$name.log" | tail -1)"
}

IFS='|' read -r wname wargs <<<"${PROGRAMS[0]}"
timeout 150 $PIN $PY "$P/$PROG" --timing-windows 1 --timed-steps "$STEPS" $wargs $EXTRA --no-profile \
  --out /tmp/unused.json.gz >"$R/warmup.log" 2>&1 || echo "FAIL warmup" | tee -a "$R/failures.txt"
for ((r = 1; r <= ROUNDS; r++)); do
  for ((j = 0; j < N; j++)); do one "$r" "${PROGRAMS[$(((j + r - 1) % N))]}"; done
done
$PY "$P/merge_timings.py" "$R" "${PROGRAMS[@]%%|*}" && ls -la "$R"
