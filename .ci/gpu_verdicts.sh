#!/usr/bin/env bash
# The verdict layer's H200 evidence in one device call: the planted variants through `microscope run`
# (all at once, then an A/A copy, a 3% and a 10% slowdown and an all-zeros kernel alone, for their exit
# codes) and the default flash_attn run (best-peer rows, console length). Console output of each run
# goes to $OUT/<name>.txt; a table of exit codes and line counts is printed last.
set -u
OUT=${OUT:-/tmp/microscope-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-80}
summary=()
runone() {  # runone NAME SECONDS ARGS...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" microscope run "$@" --device cuda --out "$OUT/runs" --no-progress >"$OUT/$name.txt" 2>&1
  local rc=$?
  summary+=("$(printf '%-22s exit %-3s %4s lines %4s s' "$name" "$rc" "$(wc -l <"$OUT/$name.txt")" "$((SECONDS - start))")")
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
runone planted_all 200 ablations/planted_verdicts.yaml
for v in aa_copy slower_3pct slower_10pct zeros; do
  runone "planted_$v" 90 ablations/planted_verdicts.yaml --set "variants=[$v]"
done
runone flash_attn 200 ablations/flash_attn.yaml
(cd "$OUT" && find runs -name records.jsonl -o -name comparison.csv -o -name '*.md' | tar czf runs.tgz -T - && rm -rf runs)
printf '%s\n' "${summary[@]}"
