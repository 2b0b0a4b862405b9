#!/usr/bin/env bash
# The GPU evidence, batched into one device call per part (device time is scarce):
#   bash .ci/gpu_session.sh operator   # flash_attn run, kernel benches, planted-effect study
#   bash .ci/gpu_session.sh model      # model-level runs on the gpu workload profile, GPU tests
#   bash .ci/gpu_session.sh all        # operator, then model (no GPU tests), in one call
# Each step has its own time limit; records stream to results/ as measured, so a step cut short still
# leaves what it measured. Logs and a tarball of results/ and reports/ go to $OUT (or /tmp/microscope-gpu).
set -u
part=${1:-operator}
OUT=${OUT:-/tmp/microscope-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log="$OUT/session-$part.log"

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit}s): $*" | tee -a "$log"
  local start=$SECONDS
  timeout "$limit" "$@" >>"$log" 2>&1
  echo "=== $name: exit $? after $((SECONDS - start)) s" | tee -a "$log"
  tar czf "$OUT/results-$part.tgz" results reports 2>/dev/null  # after every step: a cut call keeps it
}

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
} >>"$log" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$log" 2>&1

operator() {
  step flash-fwd 170 microscope run ablations/flash_attn.yaml --device cuda --no-progress \
    --set instrument.profile.enabled=true instrument.graph_diff=true instrument.tensorboard=true
  for room in fused_layernorm_gelu safe_softmax int8_kv_cache; do
    step "bench-$room" 30 python3 -m "microscope_kernels.$room.bench"
  done
  step planted 40 python3 -m microscope_kernels.planted_work.study --runs 20 --device cuda
}
model() {
  # MODEL_SET trims the configs' gpu profile when device time is short, e.g. "workload.seeds=2"
  for name in grad_checkpoint mixed_precision; do
    [ -f "ablations/$name.yaml" ] && step "model-$name" "${MODEL_LIMIT:-600}" \
      microscope run "ablations/$name.yaml" --device cuda --no-progress ${MODEL_SET:+--set $MODEL_SET}
  done
}
case "$part" in
  operator) operator ;;
  model) model; step gpu-tests 150 python3 -m pytest -m gpu -q -p no:cacheprovider ;;
  all) operator; model ;;
esac
grep -E "^=== " "$log"
