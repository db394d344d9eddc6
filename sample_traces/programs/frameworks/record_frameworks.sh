#!/usr/bin/env bash
# The framework programs (#25) on one H200, from the repository root:
#   bash sample_traces/programs/frameworks/record_frameworks.sh OUTDIR
# Each program runs twice in this one call: plain (its own clock: CUDA events over its steps
# 60-100, own_NAME_plain.json) and under `gpuprof record --out OUTDIR/run_NAME` (the recorder's
# steady-state unprofiled_step_ms; the recorded run's own clock is own_NAME_rec.json). Then
# `gpuprof report` of each run folder (run_NAME_report.json) and a table (summary.md,
# summary.json): program, own clock ms, unprofiled_step_ms, ratio, timing window / spread /
# converged, trace size, top finding. A failing program never stops the others: each command has
# its own timeout, and the whole script keeps within BUDGET_S (default 450 s: the lead's limit is
# 8 minutes), skipping what no longer fits. Expected: about 5-6 minutes (imports of lightning and
# transformers take several seconds each, the compiled model's first run compiles for ~1 min).
# DRY_RUN=1 runs the same on the CPU at tiny sizes (a check of the script itself, not a measurement).
set -u
R=${1:?usage: record_frameworks.sh OUTDIR}
mkdir -p "$R"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
P=sample_traces/programs/frameworks
PY=${PYTHON:-python3}
BUDGET=${BUDGET_S:-450}
if [ -n "${DRY_RUN:-}" ]; then
  ARGS=(--device cpu --tiny); REC=(--skip-steps 2 --timed-steps 3 --no-nvml)
else
  ARGS=(); REC=()
fi
: >"$R/failures.txt"
$PY - <<'PY' 2>/dev/null | tee "$R/versions.txt"
import importlib.metadata as md
print(" ".join(f"{p}={md.version(p)}" for p in ("torch", "lightning", "transformers", "accelerate", "timm",
                                                  "torchvision") if __import__("importlib.util").util.find_spec(p)))
PY

limit() {  # limit WANT: WANT seconds, or what the budget leaves (less 25 s for the reports and the table)
  local left=$((BUDGET - SECONDS - 25))
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
fail() { echo "FAIL $*" | tee -a "$R/failures.txt"; }

one() {  # one NAME PLAIN_S RECORD_S PROGRAM ARGS... (what follows the interpreter)
  local name=$1 plain_s=$2 rec_s=$3 t t0
  shift 3
  t=$(limit "$plain_s")
  if [ "$t" -lt 30 ]; then fail "$name: skipped, the budget is spent"; return; fi
  t0=$SECONDS
  timeout -k 10 "$t" $PY "$@" "${ARGS[@]}" --timing-out "$R/own_${name}_plain.json" >"$R/${name}_plain.log" 2>&1 \
    || fail "$name plain rc=$? (${name}_plain.log)"
  echo "$name plain $((SECONDS - t0)) s: $(grep -h '^OWN_CLOCK' "$R/${name}_plain.log" | cut -c1-220)"
  t=$(limit "$rec_s")
  if [ "$t" -lt 30 ]; then fail "$name: record skipped, the budget is spent"; return; fi
  t0=$SECONDS
  # --kill-after 10: when timeout signals the recorder, the program is gone 10 s later
  timeout -k 20 "$t" $PY -m gpuprof.cli record --out "$R/run_$name" --schedule 1,1,2 --kill-after 10 "${REC[@]}" \
    -- $PY "$@" "${ARGS[@]}" --timing-out "$R/own_${name}_rec.json" >"$R/run_${name}.log" 2>&1 \
    || fail "$name record rc=$? (run_${name}.log)"
  echo "$name record $((SECONDS - t0)) s: $(grep -h 'gpuprof: run folder' "$R/run_${name}.log" | cut -c1-200)"
}

one lightning_resnet 100 120 "$P/lightning_resnet.py"
one hf_trainer_gpt2 90 110 "$P/hf_trainer_gpt2.py"
one accelerate_loop 70 90 "$P/accelerate_loop.py"
one fsdp2 70 90 -m torch.distributed.run --standalone --nproc_per_node 1 "$P/fsdp2.py"
one compiled 150 120 "$P/compiled.py"

for d in "$R"/run_*/; do
  run=$(basename "$d")
  [ -f "$d/manifest.json" ] || continue
  t=$(limit 45); [ "$t" -lt 5 ] && t=5
  timeout -k 5 "$t" $PY -m gpuprof.cli report "$d" --format json -o "$R/${run}_report.json" >"$R/${run}_report.log" 2>&1 \
    || fail "$run report rc=$? (${run}_report.log)"
done

$PY - "$R" <<'PY'
import glob, json, os, sys
R = sys.argv[1]
def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
rows = []
for name in ("lightning_resnet", "hf_trainer_gpt2", "accelerate_loop", "fsdp2", "compiled"):
    own, own_rec = load(f"{R}/own_{name}_plain.json") or {}, load(f"{R}/own_{name}_rec.json") or {}
    m, rep = load(f"{R}/run_{name}/manifest.json") or {}, load(f"{R}/run_{name}_report.json") or {}
    rank = (m.get("ranks") or [{}])[0]
    t = rank.get("unprofiled_timing") or {}
    got, ref = m.get("unprofiled_step_ms"), own.get("step_ms")
    traces = sorted(glob.glob(f"{R}/run_{name}/traces/*.json.gz"))
    w0 = t.get("window") or {}
    start = own_rec.get("per_step_from", (own_rec.get("steps") or [0])[0] + 1)
    same = [x for i, (x, prof) in enumerate(zip(own_rec.get("per_step_ms", []), own_rec.get("profiled", [])))
            if w0 and w0["first_step"] <= start + i <= w0["last_step"] and not prof]
    own_window = sum(same) / len(same) if same else None
    top = (rep.get("findings") or [{}])[0]
    rows.append({
        "program": name, "own_clock_ms": ref, "own_clock_recorded_run_ms": own_rec.get("step_ms"),
        "unprofiled_step_ms": got, "ratio": round(got / ref, 4) if got and ref else None,
        "ratio_same_run": round(got / own_rec["step_ms"], 4) if got and own_rec.get("step_ms") else None,
        "own_clock_over_window_ms": own_window,
        "ratio_same_steps": round(got / own_window, 4) if got and own_window else None,
        "method": t.get("method"), "rule": t.get("rule"), "converged": t.get("converged"),
        "window": t.get("window"), "spread_pct": t.get("spread_pct"), "sem_ms": t.get("sem_ms"),
        "chunks_ms": [c.get("ms") for c in t.get("chunks", [])],
        "steps_seen": rank.get("steps_seen"), "own_optimizer_steps": own_rec.get("optimizer_steps"),
        "profiler_started_at_step": rank.get("profiler_started_at_step"),
        "after_profiling_step_ms": m.get("after_profiling_step_ms"),
        "after_profiling_steps": (rank.get("after_profiling_timing") or {}).get("steps"),
        "teardown_cupti": (m.get("profiler") or {}).get("teardown_cupti"),
        "trace_kb_gz": [os.path.getsize(p) // 1024 for p in traces],
        "top_finding": top.get("title"), "top_finding_pct": top.get("estimated_savings_pct"),
        "failures": m.get("failures"), "model": own.get("model"),
    })
json.dump(rows, open(f"{R}/summary.json", "w"), indent=1)
f = lambda v, n=2: "-" if v is None else (f"{v:.{n}f}" if isinstance(v, float) else str(v))
lines = ["| program | own clock ms (plain run) | own clock ms (recorded run) | unprofiled_step_ms | ratio | "
         "ratio same run | own clock over the window ms | ratio same steps | window (steps) | spread % | converged | after profiling ms | steps seen / own | trace KB gz | "
         "top finding |",
         "|" + "---|" * 15]
for r in rows:
    w = r["window"] or {}
    lines.append(f"| {r['program']} | {f(r['own_clock_ms'])} | {f(r['own_clock_recorded_run_ms'])} | "
                 f"{f(r['unprofiled_step_ms'])} | {f(r['ratio'], 3)} | {f(r['ratio_same_run'], 3)} | "
                 f"{f(r['own_clock_over_window_ms'])} | {f(r['ratio_same_steps'], 3)} | "
                 f"{w.get('first_step', '-')}-{w.get('last_step', '-')} | {f(r['spread_pct'])} | {f(r['converged'])} | "
                 f"{f(r['after_profiling_step_ms'])} | "
                 f"{f(r['steps_seen'])} / {f(r['own_optimizer_steps'])} | {r['trace_kb_gz'] or '-'} | "
                 f"{(r['top_finding'] or '-')[:90]} ({f(r['top_finding_pct'], 1)} %) |")
open(f"{R}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
echo "failures:"; cat "$R/failures.txt"; echo "total $SECONDS s"
