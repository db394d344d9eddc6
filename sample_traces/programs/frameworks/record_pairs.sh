#!/usr/bin/env bash
# Issue #24's before/after pairs on two framework programs (2026-12-04, round 4 of
# sample_traces/h200/heldout_pairs.json), on one H200, from the repository root:
#   bash sample_traces/programs/frameworks/record_pairs.sh OUTDIR [FIRST_ROUND LAST_ROUND]
# - Lightning ResNet-18 NCHW -> channels_last (lightning_resnet.py vs --channels-last),
# - Accelerate encoder with pageable batches -> pinned + non_blocking (accelerate_loop.py vs --pin-memory).
# With FIRST_ROUND 1, each member is first recorded once by `gpuprof record` (OUTDIR/run_NAME, its own
# clock in own_NAME_rec.json); then every member runs plain (its own CUDA-event clock, steps 60-260,
# OUTDIR/own_NAME_plain_rR.json) in rounds FIRST..LAST, each pair's two members next to each other and
# in reverse order every other round (ABBA), until the rounds or BUDGET_S (default 470 s) run out.
# The recorded runs of 2026-12-04 were rounds 1-3 in one device call (15:09-15:15 UTC) and 4-8 in the
# next (15:16-15:24 UTC; rounds 4-9 asked, the budget stopped it after 8).
set -u
R=${1:?usage: record_pairs.sh OUTDIR [FIRST_ROUND LAST_ROUND]}
FIRST=${2:-1}; LAST=${3:-3}
mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
P=sample_traces/programs/frameworks; PY=${PYTHON:-python3}; BUDGET=${BUDGET_S:-470}
L="$P/lightning_resnet.py"; A="$P/accelerate_loop.py"
rec() {  # rec NAME PROGRAM ARGS...
  local n=$1; shift
  timeout -k 20 120 $PY -m gpuprof.cli record --out "$R/run_$n" --schedule 1,1,2 --kill-after 10 \
    -- $PY "$@" --timing-out "$R/own_${n}_rec.json" >"$R/run_$n.log" 2>&1
  echo "record $n rc=$? ${SECONDS} s"
}
plain() {  # plain NAME ROUND PROGRAM ARGS...
  local n=$1 r=$2; shift 2
  timeout -k 10 100 $PY "$@" --timing-out "$R/own_${n}_plain_r$r.json" >"$R/${n}_plain_r$r.log" 2>&1
  echo "plain $n r$r rc=$? ${SECONDS} s"
}
if [ "$FIRST" = 1 ]; then
  rec lightning_nchw "$L"; rec lightning_cl "$L" --channels-last
  rec accelerate_pageable "$A"; rec accelerate_pinned "$A" --pin-memory
fi
for r in $(seq "$FIRST" "$LAST"); do
  if [ $((r % 2)) = 1 ]; then
    plain lightning_nchw "$r" "$L"; plain lightning_cl "$r" "$L" --channels-last
    plain accelerate_pageable "$r" "$A"; plain accelerate_pinned "$r" "$A" --pin-memory
  else
    plain lightning_cl "$r" "$L" --channels-last; plain lightning_nchw "$r" "$L"
    plain accelerate_pinned "$r" "$A" --pin-memory; plain accelerate_pageable "$r" "$A"
  fi
  [ "$SECONDS" -gt "$BUDGET" ] && { echo "budget: stopping after round $r"; break; }
done
# OUTDIR/timings/fw4_NAME.json (the held-out timing: the mean of every plain process's own clock,
# its standard error over processes) and OUTDIR/fw4_NAME.json.gz (the recorded run's trace), as
# sample_traces/h200/heldout/ keeps them; the own clocks themselves are kept in heldout/fw4_clocks/
$PY - "$R" <<'PY'
import glob, json, os, shutil, statistics, sys
R = sys.argv[1]
os.makedirs(f"{R}/timings", exist_ok=True)
for n in ("lightning_nchw", "lightning_cl", "accelerate_pageable", "accelerate_pinned"):
    runs = [json.load(open(f))["step_ms"] for f in sorted(glob.glob(f"{R}/own_{n}_plain_r*.json"))]
    if not runs:
        continue
    doc = {"step_ms": statistics.mean(runs), "step_ms_runs": runs, "processes": len(runs),
           "step_ms_sem": statistics.stdev(runs) / len(runs) ** 0.5 if len(runs) > 1 else 0.0,
           "clock": "the program's own CUDA-event clock over its steps 60-260, each a separate plain process",
           "recorded_by": "sample_traces/programs/frameworks/record_pairs.sh"}
    if os.path.isfile(f"{R}/run_{n}/manifest.json"):
        m = json.load(open(f"{R}/run_{n}/manifest.json"))
        doc["recorded_run"] = {"unprofiled_step_ms": m.get("unprofiled_step_ms"),
                               "converged": m["ranks"][0]["unprofiled_timing"].get("converged")}
        shutil.copy(f"{R}/run_{n}/traces/rank0.json.gz", f"{R}/fw4_{n}.json.gz")
    json.dump(doc, open(f"{R}/timings/fw4_{n}.json", "w"), indent=1)
    print(f"fw4_{n}: {doc['step_ms']:.2f} ms +- {doc['step_ms_sem']:.2f} over {len(runs)} processes")
PY
