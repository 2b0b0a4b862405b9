#!/usr/bin/env bash
# The nightly regression gate on the H200, in one device call (<= 560 s in all):
#   bash .ci/gpu_nightly.sh
# 0. probe: one planted_work run alone, and torch's import + CUDA start, for the cost of a fresh process
# 1. night1: ablations/nightly --quick on cuda, $REPEAT (2) fresh runs per config, --append to an empty history:
#    starts it (exit 2: nothing to compare with yet; the runs become the baseline)
# 2. work5: MICROSCOPE_PLANT_WORK_PCT=5 (planted_work's candidate does 5% more work): must exit 1
# 3. numerics: MICROSCOPE_PLANT_NUMERICS=1 (its answer x (1 +- 2^-16), inside tolerance): must exit 1
# 4. night2, night3: the clean suite again, appended: must exit 0 (as many as time allows)
# Every step has its own timeout and the whole script a deadline; a step that does not fit is skipped.
# Outputs in $OUT: summary.txt (the table printed last), consoles.tgz (each step's console),
# reports.tgz (regress.md/.csv of each step, the history, `history show`, a trend plot), runs.tgz.
set -u
OUT=${OUT:-/tmp/microscope-gpu-nightly}
WORK=$OUT/work
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-160}
DEADLINE=$((SECONDS + ${BUDGET_S:-560}))
HISTORY=$WORK/history.sqlite
SUITE=ablations/nightly
summary=()

step() {  # step NAME MAX_SECONDS EXPECTED_EXIT COMMAND...
  local name=$1 max=$2 expect=$3
  shift 3
  local left=$((DEADLINE - SECONDS - 20))  # 20 s kept for packing the outputs
  if [ "$left" -lt 40 ]; then
    summary+=("$(printf '%-10s skipped (out of time)' "$name")")
    return
  fi
  [ "$max" -gt "$left" ] && max=$left
  local start=$SECONDS
  timeout -k 5 "$max" "$@" >"$WORK/$name.txt" 2>&1
  local rc=$?
  local verdict=ok
  [ "$rc" = "$expect" ] || verdict=UNEXPECTED
  [ "$rc" = 124 ] && verdict="TIMED OUT at $max s"
  summary+=("$(printf '%-10s exit %-3s expected %-2s %-10s %4s s' "$name" "$rc" "$expect" "$verdict" \
    "$((SECONDS - start))")")
  tail -n 4 "$WORK/$name.txt"
}

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
step install 120 0 python3 -m pip install -q --no-deps --no-build-isolation -e .
MS=(python3 -m microscope.cli)
step torch 60 0 python3 -c 'import time; t = time.time(); import torch; a = time.time(); torch.zeros(1, device="cuda")
print(f"import torch {a - t:.1f} s, CUDA start {time.time() - a:.1f} s")'
step probe 90 0 "${MS[@]}" run "$SUITE/planted_work.yaml" --quick --device cuda --no-report --no-progress \
  --out "$WORK/probe"
GATE=(--quick --device cuda --baseline last-good --history "$HISTORY" --repeat "${REPEAT:-2}" --timeout 120)
step night1 200 2 "${MS[@]}" regress "$SUITE" "${GATE[@]}" --append --out "$WORK/night1"
step work5 130 1 env MICROSCOPE_PLANT_WORK_PCT=5 "${MS[@]}" regress "$SUITE/planted_work.yaml" "${GATE[@]}" \
  --out "$WORK/work5"
step numerics 130 1 env MICROSCOPE_PLANT_NUMERICS=1 "${MS[@]}" regress "$SUITE/planted_work.yaml" "${GATE[@]}" \
  --out "$WORK/numerics"
step night2 200 0 "${MS[@]}" regress "$SUITE" "${GATE[@]}" --append --out "$WORK/night2"
step night3 200 0 "${MS[@]}" regress "$SUITE" "${GATE[@]}" --append --out "$WORK/night3"
step show 40 0 "${MS[@]}" history show --db "$HISTORY" --plot "$WORK/trends.png"

cd "$WORK" || exit 1
find . -path '*/runs/*' \( -name records.jsonl -o -name comparison.csv \) | tar czf "$OUT/runs.tgz" -T -
find . -maxdepth 2 \( -name 'regress.md' -o -name 'regress.csv' -o -name 'history.sqlite' -o -name 'trends.png' \) |
  tar czf "$OUT/reports.tgz" -T -
tar czf "$OUT/consoles.tgz" ./*.txt
cd "$OUT" && rm -rf "$WORK"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
