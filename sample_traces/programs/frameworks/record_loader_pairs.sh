#!/usr/bin/env bash
# Issue #24 round 5 (2026-12-04): before/after pairs for DataLoader waits that the profiled steps
# miss (gpuprof.steptime.InputWaits, GP-INPUT-003), on one H200, from the repository root:
#   bash sample_traces/programs/frameworks/record_loader_pairs.sh OUTDIR [ROUNDS [STAGE]]
# - Lightning ResNet-18 with 4 DataLoader workers -> 12 (lightning_resnet.py --workers 4 / 12),
# - the plain-PyTorch vision loop (CPU resize/flip/normalise in the workers, batch 64) with 4 -> 12
#   workers (vision.py --loader workers --workers 4 / 12).
# STAGE 2 (a second device call: the first call's vision_w4 run folder did not come back) records
# vision_w4 again and times it against the same loop with cheaper per-sample work and the same 4
# workers (vision.py --augment light: a crop instead of a bilinear resize; no more CPU processes).
# Each member is recorded once by `gpuprof record` (OUTDIR/run_NAME; the recorder's manifest carries
# unprofiled_input_wait_ms), then every member runs plain in ROUNDS rounds (default 4), each pair's two
# members next to each other and in reverse order every other round (ABBA), until the rounds or
# BUDGET_S (default 520 s) run out. Each plain process's own clock: OUTDIR/own_NAME_plain_rR.json
# (lightning_resnet.py: CUDA events over its steps 60-260; vision.py: steps 61-260 after 60 warm-up
# steps, synchronised at both ends).
set -u
R=${1:?usage: record_loader_pairs.sh OUTDIR [ROUNDS [STAGE]]}
ROUNDS=${2:-4}; STAGE=${3:-1}
mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}; BUDGET=${BUDGET_S:-520}
L=sample_traces/programs/frameworks/lightning_resnet.py; V=sample_traces/programs/vision.py
VARGS="--loader workers --batch 64 --warmup-steps 60 --timed-steps 200 --no-profile --out /dev/null"
rec() {  # rec NAME PROGRAM ARGS...
  local n=$1; shift
  timeout -k 20 150 $PY -m gpuprof.cli record --out "$R/run_$n" --schedule 1,1,2 --kill-after 10 \
    -- $PY "$@" --timing-out "$R/own_${n}_rec.json" >"$R/run_$n.log" 2>&1
  echo "record $n rc=$? ${SECONDS} s"
}
plain() {  # plain NAME ROUND PROGRAM ARGS...
  local n=$1 r=$2; shift 2
  timeout -k 10 120 $PY "$@" --timing-out "$R/own_${n}_plain_r$r.json" >"$R/${n}_plain_r$r.log" 2>&1
  echo "plain $n r$r rc=$? ${SECONDS} s"
}
if [ "$STAGE" = 2 ]; then
  rec vision_w4 "$V" $VARGS --workers 4
  for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then
      plain vision_w4 "$r" "$V" $VARGS --workers 4; plain vision_light "$r" "$V" $VARGS --workers 4 --augment light
    else
      plain vision_light "$r" "$V" $VARGS --workers 4 --augment light; plain vision_w4 "$r" "$V" $VARGS --workers 4
    fi
    [ "$SECONDS" -gt "$BUDGET" ] && { echo "budget: stopping after round $r"; break; }
  done
  ROUNDS=0
else
  rec lightning_w4 "$L" --workers 4; rec lightning_w12 "$L" --workers 12
  rec vision_w4 "$V" $VARGS --workers 4; rec vision_w12 "$V" $VARGS --workers 12
fi
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then
    plain lightning_w4 "$r" "$L" --workers 4; plain lightning_w12 "$r" "$L" --workers 12
    plain vision_w4 "$r" "$V" $VARGS --workers 4; plain vision_w12 "$r" "$V" $VARGS --workers 12
  else
    plain lightning_w12 "$r" "$L" --workers 12; plain lightning_w4 "$r" "$L" --workers 4
    plain vision_w12 "$r" "$V" $VARGS --workers 12; plain vision_w4 "$r" "$V" $VARGS --workers 4
  fi
  [ "$SECONDS" -gt "$BUDGET" ] && { echo "budget: stopping after round $r"; break; }
done
# OUTDIR/timings/ld5_NAME.json (the mean of every plain process's own clock, its standard error over
# processes) and OUTDIR/ld5_NAME/ (the recorded run folder: manifest, trace, NVML samples)
$PY - "$R" <<'PY'
import glob, json, os, shutil, statistics, sys
R = sys.argv[1]
os.makedirs(f"{R}/timings", exist_ok=True)
for n in ("lightning_w4", "lightning_w12", "vision_w4", "vision_w12", "vision_light"):
    runs = [json.load(open(f))["step_ms"] for f in sorted(glob.glob(f"{R}/own_{n}_plain_r*.json"))]
    if not runs:
        continue
    doc = {"step_ms": statistics.mean(runs), "step_ms_runs": runs, "processes": len(runs),
           "step_ms_sem": statistics.stdev(runs) / len(runs) ** 0.5 if len(runs) > 1 else 0.0,
           "clock": "the program's own clock, each a separate plain process",
           "recorded_by": "sample_traces/programs/frameworks/record_loader_pairs.sh"}
    if os.path.isfile(f"{R}/run_{n}/manifest.json"):
        m = json.load(open(f"{R}/run_{n}/manifest.json"))
        doc["recorded_run"] = {"unprofiled_step_ms": m.get("unprofiled_step_ms"),
                               "unprofiled_input_wait_ms": m.get("unprofiled_input_wait_ms"),
                               "converged": m["ranks"][0]["unprofiled_timing"].get("converged")}
    json.dump(doc, open(f"{R}/timings/ld5_{n}.json", "w"), indent=1)
    print(f"ld5_{n}: {doc['step_ms']:.2f} ms +- {doc['step_ms_sem']:.2f} over {len(runs)} processes; "
          f"recorded {doc.get('recorded_run')}")
PY
