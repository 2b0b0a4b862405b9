#!/usr/bin/env bash
# H200 evidence in one device call per part:
#   bash .ci/gpu_verdicts.sh verdicts    # planted variants (all, then an A/A copy, 3%, 10% and all-zeros
#                                        # alone, for their exit codes) and the default flash_attn run
#   bash .ci/gpu_verdicts.sh isolation   # planted crashes (abort, segfault, hang, OOM, device assert,
#                                        # Triton out-of-bounds store) and flash_attn inline vs local
#   bash .ci/gpu_verdicts.sh leak overhead  # a GPU leak across groups, a Triton OOB store alone; inline vs
#                                        # local on two flash_attn cases, each from empty compile caches
#   bash .ci/gpu_verdicts.sh crossrun    # compare --repeat 3 of planted_work against itself: +10% and +5%
#                                        # work planted in side B's candidates, and an A/A
# Console output of each run goes into $OUT/consoles.tgz; a table of exit codes, line counts and wall
# times is printed last.
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
for part in "${@:-verdicts}"; do
  case $part in
    verdicts)
      runone planted_all 200 ablations/planted_verdicts.yaml
      for v in aa_copy slower_3pct slower_10pct zeros; do
        runone "planted_$v" 90 ablations/planted_verdicts.yaml --set "variants=[$v]"
      done
      runone flash_attn 420 ablations/flash_attn.yaml ;;  # the whole default: ~5 min on the H200
    isolation)
      runone planted_crashes 200 ablations/planted_crashes.yaml --quick
      # two cases of the default (whole default: ~5 min a run), once per executor, for the overhead
      two=(--set 'cases.seq=[4096]' --set 'cases.head_dim=[128]')
      runone flash_attn_local 150 ablations/flash_attn.yaml "${two[@]}"
      runone flash_attn_inline 150 ablations/flash_attn.yaml "${two[@]}" --executor inline ;;
    leak)  # a variant that keeps 512 MiB per shape alive, and a Triton store 4 TiB out of bounds
      runone crashes_leaks 120 ablations/planted_crashes.yaml --quick --set 'variants=[correct,leaks]'
      runone crashes_triton_oob 120 ablations/planted_crashes.yaml --quick --set 'variants=[correct,triton_oob]' ;;
    overhead)  # inline vs local, each with empty Triton and Inductor caches (compiles counted in both)
      two=(--set 'cases.seq=[4096]' --set 'cases.head_dim=[128]')
      for kind in inline local; do
        export TRITON_CACHE_DIR=$OUT/cache-$kind/triton TORCHINDUCTOR_CACHE_DIR=$OUT/cache-$kind/inductor
        runone "cold_$kind" 200 ablations/flash_attn.yaml "${two[@]}" --executor $kind
        rm -rf "$OUT/cache-$kind"
      done
      unset TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR ;;
    crossrun)  # side B's candidates do 10% / 5% more work (--env-b); then A/A. Expected exits: 1, 1, 0
      for plant in 10 5 0; do
        start=$SECONDS
        timeout 200 microscope compare ablations/planted_work.yaml ablations/planted_work.yaml --device cuda \
          --repeat 3 --env-b MICROSCOPE_PLANT_WORK_PCT=$plant --results "$OUT/runs" --out "$OUT/runs/reports" \
          >"$OUT/compare_plant$plant.txt" 2>&1
        rc=$?
        summary+=("$(printf '%-22s exit %-3s %4s lines %4s s' "compare_plant$plant" "$rc" \
          "$(wc -l <"$OUT/compare_plant$plant.txt")" "$((SECONDS - start))")")
      done ;;
  esac
done
(cd "$OUT" && find runs -name records.jsonl -o -name comparison.csv -o -name groups.jsonl -o -name '*.md' -o -name '*-vs-*.csv' \
  -o -name 'worker-*.log' |
  tar czf runs.tgz -T - && rm -rf runs && tar czf consoles.tgz ./*.txt && rm -f ./*.txt)
printf '%s\n' "${summary[@]}"
