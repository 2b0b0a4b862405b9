#!/usr/bin/env bash
# Remake flash_attn's tuned table for this GPU and Triton, then time the cuda profile with it from cold caches:
#   bash .ci/flash_tune.sh            # in a device call; $OUT gets the table, consoles.tgz, summary.txt
# Step 1 autotunes every key the cuda, bench, bench_bwd and loads profiles launch (MICROSCOPE_FLASH_TUNING=
# autotune) and records each choice (MICROSCOPE_FLASH_TUNED_OUT). Step 2 copies the table under
# kernels/flash_attn/tuned/ and runs the full cuda profile with empty Triton and inductor caches, as on a
# fresh machine; its wall time is the one-harness issue's 60 s target. Commit the table from $OUT.
set -u
OUT=${OUT:-/tmp/microscope-flash-tune}
WORK=$OUT/work
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-180}
summary=()

step() {  # step NAME MAX_SECONDS COMMAND...
  local name=$1 max=$2 start=$SECONDS
  shift 2
  timeout -k 5 "$max" "$@" >"$WORK/$name.txt" 2>&1
  local rc=$?
  local how="exit $rc"
  [ "$rc" = 124 ] && how="TIMED OUT at $max s"
  summary+=("$(printf '%-22s %-18s %4s s' "$name" "$how" "$((SECONDS - start))")")
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
step install 120 python3 -m pip install -q --no-deps --no-build-isolation -e .
name=$(python3 -c 'import torch; from microscope_kernels.flash_attn import tuned; print(tuned.table_name(torch.cuda.get_device_name()))')
run=(python3 -m microscope.cli run ablations/flash_attn.yaml --device cuda --out "$WORK/runs" --no-report --no-progress)
for profile in cuda bench,loads bench_bwd; do
  args=(--quick)
  [ "$profile" != cuda ] && args+=(--profile "$profile")
  MICROSCOPE_FLASH_TUNING=autotune MICROSCOPE_FLASH_TUNED_OUT="$OUT/$name" step "tune-${profile//,/-}" 240 \
    "${run[@]}" "${args[@]}"
done
python3 -c "import json, sys; print(len(json.load(open(sys.argv[1]))['configs']), 'keys in', sys.argv[1])" "$OUT/$name"
mkdir -p kernels/flash_attn/tuned && cp "$OUT/$name" "kernels/flash_attn/tuned/$name"
TRITON_CACHE_DIR="$WORK/cold-triton" TORCHINDUCTOR_CACHE_DIR="$WORK/cold-inductor" step cuda-cold 180 "${run[@]}"
cd "$WORK" || exit 1
tar czf "$OUT/consoles.tgz" ./*.txt
for f in ./*.txt; do echo "== $f"; grep -v "^ *$" "$f" | tail -25; done
cd "$OUT" && rm -rf "$WORK"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
