#!/usr/bin/env bash
# The GPU evidence, batched into few device calls (device time is scarce). Name the parts to run:
#   bash .ci/gpu_session.sh flash benches planted   # operator level: flash_attn run, kernel benches, planted study
#   bash .ci/gpu_session.sh model                   # gpu profile of grad_checkpoint and mixed_precision
#   bash .ci/gpu_session.sh catalogue               # the catalogue plugins' operator configs through microscope
#   bash .ci/gpu_session.sh tests                   # the GPU-marked tests, and the kernel tests on the GPU
#   bash .ci/gpu_session.sh run:mixed_precision     # one model-level config on the gpu profile
#   bash .ci/gpu_session.sh bench:int8_kv_cache     # one kernel room's bench profile through microscope run
#   bash .ci/gpu_session.sh ncu                     # Nsight Compute on the int8 decode kernels
#   bash .ci/gpu_session.sh host                    # host time per int8 decode call (bench,host_time)
#   bash .ci/gpu_session.sh host:fused_layernorm_gelu  # host time per call of another room's bench shapes
#   bash .ci/gpu_session.sh study:stages            # a launch study of the fused LayerNorm+GeLU forward
#                                                   # (profiles launch_plans|grid|registers|stages|tma)
# Each step has its own time limit; records stream to results/ as measured, so a step cut short still
# leaves what it measured. Logs and a tarball of results/ and reports/ go to $OUT (or /tmp/microscope-gpu).
# Environment: MODEL_SET trims the model configs (e.g. "workload.seeds=2"), MODEL_LIMIT is each model
# run's limit in seconds (default 600), BENCH_LIMIT each kernel bench's (default 120), CATALOGUE_LIMIT
# each catalogue operator run's (120), GPU_TEST_LIMIT the GPU-marked tests' (420), GPU_PLUGIN_LIMIT
# the plugins-through-the-runner tests' (420), KERNEL_TEST_LIMIT the GPU kernel tests' (240),
# HOST_LIMIT the host-cost run's (150). The catalogue's model-level configs run as
# run:int8_kv_cache_model and run:fused_layernorm_gelu_model.
set -u
OUT=${OUT:-/tmp/microscope-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(flash benches planted)
log="$OUT/session.log"

step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit}s): $*" | tee -a "$log"
  local start=$SECONDS
  timeout "$limit" "$@" >>"$log" 2>&1
  echo "=== $name: exit $? after $((SECONDS - start)) s" | tee -a "$log"
  # after every step, so a cut call keeps it; records and reports only (traces and TensorBoard are large)
  find results reports -name records.jsonl -o -name '*.csv' -o -name '*.md' -o -name '*.html' 2>/dev/null |
    tar czf "$OUT/results.tgz" -T - 2>/dev/null
}

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
} >>"$log" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$log" 2>&1

flash() {
  step flash-fwd 170 microscope run ablations/flash_attn.yaml --device cuda --no-progress \
    --set instrument.profile.enabled=true instrument.graph_diff=true instrument.tensorboard=true
}
bench() {  # bench ROOM: the room's bench profile, its table printed (rates, share of the ceiling)
  step "bench-$1" "${BENCH_LIMIT:-120}" microscope run "ablations/$1.yaml" --device cuda --profile bench --no-progress
}
benches() {
  for room in fused_layernorm_gelu safe_softmax int8_kv_cache; do
    bench "$room"
  done
}
planted() {
  # the cuda profile (60 rounds of a ~0.2 ms kernel), then a short one: 20 rounds of a ~45 us kernel
  step planted "${PLANTED_LIMIT:-100}" python3 -m microscope.cli calibrate ablations/planted_work.yaml --runs 20 \
    --device cuda
  step planted-short "${PLANTED_LIMIT:-100}" python3 -m microscope.cli calibrate ablations/planted_work.yaml --runs 20 \
    --device cuda --set dimensions.throughput.rounds=20 "cases.iters=[20000]"
}
model_run() {  # model_run CONFIG
  step "model-$1" "${MODEL_LIMIT:-600}" microscope run "ablations/$1.yaml" --device cuda --no-progress \
    ${MODEL_SET:+--set $MODEL_SET}
}
model() {
  model_run grad_checkpoint
  model_run mixed_precision
}
catalogue() {  # the catalogue plugins through microscope, operator level, on the cuda profile's shapes
  for name in fused_layernorm_gelu int8_kv_cache safe_softmax; do
    step "run-$name" "${CATALOGUE_LIMIT:-120}" microscope run "ablations/$name.yaml" --device cuda --no-progress
  done
}
# The kernel tests that put their tensors on the GPU when one is present (CI runs them interpreted).
KERNEL_TESTS=(tests/kernels/test_flash_attn_kernel.py tests/kernels/test_fused_layernorm_gelu.py
  tests/kernels/test_direct_launch.py tests/kernels/test_copy_kernel.py tests/kernels/test_int8_kv_cache.py tests/kernels/test_safe_softmax.py tests/kernels/test_catalogue_model_level.py)
tests() {  # the GPU-marked tests, then every operator plugin through the runner, then the kernel tests
  # the quick GPU-marked tests first (29 s for 9 of them on an H200), so a slow one cannot hide them
  step gpu-tests "${GPU_TEST_LIMIT:-420}" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=10 \
    --ignore=tests/test_gpu_plugins.py
  # every operator plugin through the runner on CUDA, torch.compile peers included: > 400 s on an H200
  step gpu-plugins "${GPU_PLUGIN_LIMIT:-420}" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=0 \
    tests/test_gpu_plugins.py
  step gpu-kernel-tests "${KERNEL_TEST_LIMIT:-240}" python3 -m pytest -q -p no:cacheprovider --maxfail=10 \
    "${KERNEL_TESTS[@]}"
}

ncu_int8() {  # one launch of each int8 split kernel at B64 H8 T32768, the sections that say what bounds it
  local ncu
  ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
  [ -z "$ncu" ] && { echo "=== ncu: not installed" | tee -a "$log"; return; }
  step ncu "${NCU_LIMIT:-150}" "$ncu" --target-processes all -k regex:decode_split_int8 --launch-count 3 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis python3 .ci/ncu_int8.py
}

host_cost() {  # host time per decode call (GPU busy behind 20 ms of queued work), direct launch then Triton's
  step host-cost "${HOST_LIMIT:-150}" microscope compare ablations/int8_kv_cache.yaml ablations/int8_kv_cache.yaml \
    --device cuda --profile bench,host_time --repeat 2 --env-b MICROSCOPE_DIRECT_LAUNCH=0
}

for part in "${parts[@]}"; do
  case "$part" in
    flash | benches | planted | model | catalogue | tests) "$part" ;;
    ncu) ncu_int8 ;;
    host) host_cost ;;
    host:*) step "host-cost-${part#host:}" "${HOST_LIMIT:-150}" microscope run "ablations/${part#host:}.yaml" \
      --device cuda --profile bench --set dimensions.throughput.mode=host --no-progress ;;
    study:*) step "ln-launch-study-${part#study:}" "${BENCH_LIMIT:-120}" microscope run \
      ablations/fused_layernorm_gelu.yaml --device cuda --profile "bench,launch,launch_${part#study:}" --no-progress ;;
    run:*) model_run "${part#run:}" ;;  # one model-level config, e.g. run:mixed_precision
    bench:*) bench "${part#bench:}" ;;  # one room's bench, e.g. bench:int8_kv_cache
    *) echo "unknown part $part (flash, benches, planted, model, catalogue, tests, ncu, host, host:ROOM, study:NAME, run:CONFIG, bench:ROOM)" |
      tee -a "$log" ;;
  esac
done
grep -E "^=== " "$log"
