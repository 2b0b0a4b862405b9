#!/usr/bin/env bash
# Every kernel room's bench profile through `microscope run`, in one device call (<= BUDGET_S, 585 s):
#   FLASH_CUDA=0 TESTS_S=20 TESTS="--co -q tests/test_gpu_timing.py" bash .ci/gpu_bench.sh
#     (the 15 rooms took 551 s on an H100 on 2026-12-05; the flash_attn cuda profile adds ~55 s, so the
#     whole catalogue with it does not fit one 600 s call)
#   EXTRA="fused_layernorm_gelu:bench,launch safe_softmax:bench,bench_bwd" bash .ci/gpu_bench.sh
#   ROOMS="int8_linear int4_weight_only" FLASH_CUDA=0 TESTS="tests/kernels/test_int8_linear.py" bash .ci/gpu_bench.sh
#   the compression catalogue: ROOMS="int8_linear int4_weight_only act_compression_8bit binarize_ste magnitude_sparsity"
#   a run an earlier call cut short, then a room: RESUME="scratch/runs/<run id>@260" ROOMS="int8_linear" bash .ci/gpu_bench.sh
# First the GPU timing-mode and GPU-input tests and the flash_attn cuda profile, then
#   microscope run ablations/<room>.yaml --device cuda --profile bench
# for each room in ROOMS (every config with a bench profile), each under its own time limit;
# a room that does not fit the time left is skipped. Outputs in $OUT: consoles.tgz (each step's console,
# whose bench table is the room's figures), runs.tgz (records, comparison, groups, run.json), records.jsonl.gz (the records
# without per-token arrays), workers.tgz (worker logs with the
# start of each phase of each case), summary.txt (last).
set -u
OUT=${OUT:-/tmp/microscope-gpu-bench}
WORK=$OUT/work
REPO=$(pwd)
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-180}
# one bytecode folder for every step (the machine sets PYTHONDONTWRITEBYTECODE and torch ships no .pyc):
# without it each step's interpreters compile torch's modules again (7.5 s of a CLI process's 20 s,
# cProfile on the H200 host). A prefix alone writes nothing while PYTHONDONTWRITEBYTECODE is set.
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/microscope-gpu-bench-pycache}
unset PYTHONDONTWRITEBYTECODE
DEADLINE=$((SECONDS + ${BUDGET_S:-585}))
# seconds a step has after its SIGTERM to keep its records and print its verdicts before SIGKILL: a model-level
# run at the gpu profile took 19-33 s from its runner's end to its exit (statistics over per-token arrays of
# the whole evaluation, the killed CUDA worker's exit), and 20 s lost a whole seed's console
KILL_S=${KILL_S:-45}
summary=()

step() {  # [SIGNAL=INT] step NAME MAX_SECONDS COMMAND... (SIGNAL: what stops it at its limit, TERM)
  local name=$1 max=$2
  shift 2
  local left=$((DEADLINE - SECONDS - 25 - KILL_S))
  if [ "$left" -lt 30 ]; then
    summary+=("$(printf '%-22s skipped (out of time)' "$name")")
    return
  fi
  [ "$max" -gt "$left" ] && max=$left
  local start=$SECONDS
  timeout -s "${SIGNAL:-TERM}" -k "$KILL_S" "$max" "$@" >"$WORK/$name.txt" 2>&1
  local rc=$?
  local how="exit $rc"
  [ "$rc" = 124 ] && how="TIMED OUT at $max s"
  summary+=("$(printf '%-22s %-18s %4s s' "$name" "$how" "$((SECONDS - start))")")
}

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
# pytest's version and any PYTEST_* variable: a device run once failed a test for want of the kernel tests'
# conftest fixture 'seed', which a --noconftest in PYTEST_ADDOPTS would explain
python3 -m pytest --version 2>&1 | head -1
env | grep '^PYTEST' || echo "no PYTEST_* variables"
step install 120 python3 -m pip install -q --no-deps --no-build-isolation -e .
# RESUME="folder[@seconds][+key=value...] ..." continues runs cut short by an earlier call (runs.tgz unpacked
# under scratch/), before anything else (300 s each unless @ says): each folder is copied into this call's runs,
# so that its records come back in runs.tgz with the rest. +key=value changes the run's overrides
# (resume --set ... --force), e.g. +workload.seeds=5 adds seeds to a finished model-level run
for resume in ${RESUME:-}; do
  limit=300 sets=()
  case $resume in *+*) IFS=+ read -r -a sets <<<"${resume#*+}"; resume=${resume%%+*} ;; esac
  case $resume in *@*) limit=${resume##*@} resume=${resume%@*} ;; esac
  [ ${#sets[@]} -gt 0 ] && sets=(--set "${sets[@]}" --force)
  mkdir -p "$WORK/runs" && cp -r "$resume" "$WORK/runs/"
  step "resume-$(basename "$resume")" "$limit" python3 -m microscope.cli resume "$WORK/runs/$(basename "$resume")" \
    "${sets[@]}" --no-report --no-progress
done
# TESTS: the pytest arguments of the GPU test step (the timing-mode and GPU-input tests by default);
# TESTS_S: its time limit (150 s)
# (stopped with SIGINT at its limit, on which pytest still prints the failures it has seen)
# shellcheck disable=SC2086
SIGNAL=INT step gpu_tests "${TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider ${TESTS:--m gpu tests/test_gpu_timing.py tests/test_gpu_inputs.py}
# the issue's wall-time target: the full flash_attn cuda profile (every variant, 8 cases) in <= 60 s
# (FLASH_S: its step limit, 150 s, so that the whole run is timed even where it misses the target)
if [ "${FLASH_CUDA:-1}" = 1 ]; then
  step flash_attn-cuda "${FLASH_S:-150}" python3 -m microscope.cli run ablations/flash_attn.yaml --device cuda \
    --out "$WORK/runs" --no-report --no-progress
fi
# ROOM_S: each room's step limit (90 s, the issue's budget; more to see how long a room takes)
# ROOMS: the rooms whose bench profile runs (default: every config with a bench profile)
for room in ${ROOMS-$(grep -l '^  bench:' ablations/*.yaml | xargs -n1 basename | sed 's/\.yaml$//')}; do
  limit=${ROOM_S:-90}
  [ "$room" = flash_attn ] && limit=180
  step "$room" "$limit" python3 -m microscope.cli run "ablations/$room.yaml" --device cuda --profile bench \
    --out "$WORK/runs" --no-report --no-progress
done
# EXTRA="config[:profiles][@seconds][+key=value...] ..." adds runs (120 s each unless @ says; each +key=value
# is a --set override), e.g.
#   EXTRA="flash_attn:bench,loads int8_kv_cache:bench,kernels int8_linear_model@200+workload.seeds=1"
for extra in ${EXTRA:-}; do
  limit=120 sets=()
  case $extra in *+*) IFS=+ read -r -a sets <<<"${extra#*+}"; extra=${extra%%+*} ;; esac
  case $extra in *@*) limit=${extra##*@} extra=${extra%@*} ;; esac
  room=${extra%%:*} profiles=()
  case $extra in *:*) profiles=(--profile "${extra#*:}") ;; esac
  name=$room
  [ ${#profiles[@]} -gt 0 ] && name="$room-${extra#*:}" && name=${name//,/-}
  [ ${#sets[@]} -gt 0 ] && sets=(--set "${sets[@]}")
  step "$name" "$limit" python3 -m microscope.cli run "ablations/$room.yaml" --device cuda \
    "${profiles[@]}" "${sets[@]}" --out "$WORK/runs" --no-report --no-progress
done
cd "$WORK" || exit 1
# records apart from the worker logs (a model-level run's logs put one archive over the 16 MiB a file may bring
# back, and the records with it), and each run's run.json: a run cut short at its step limit goes on in a later
# call once runs.tgz is unpacked in the tree (scratch/ travels with it) and its command repeated with
# --resume <its folder>. An archive over 15 MiB comes back in parts: cat runs.tgz.part-* | tar xz
find runs \( -name records.jsonl -o -name comparison.csv -o -name groups.jsonl -o -name run.json \) |
  tar czf "$OUT/runs.tgz" -T -
if [ "$(stat -c %s "$OUT/runs.tgz")" -gt $((15 * 1024 * 1024)) ]; then
  split -b 15M "$OUT/runs.tgz" "$OUT/runs.tgz.part-" && rm "$OUT/runs.tgz"
fi
find runs -name 'worker-*.log' | tar czf "$OUT/workers.tgz" -T -
# and the records without their per-token arrays, small enough to read at once
python3 "$REPO/.ci/compact_records.py" runs "$OUT/records.jsonl" && gzip -f "$OUT/records.jsonl"
tar czf "$OUT/consoles.tgz" ./*.txt
# where each worker's time went and why a worker was replaced (a leak note names what stayed allocated)
grep -h "leak\|fresh worker" runs/*/workers/worker-*.log runs/*/groups.jsonl 2>/dev/null | cut -c1-600 | head -20
# per run: Triton builds its workers made themselves (what a precompile step missed) and binaries they loaded
builds=$(for run in runs/*/; do
  awk -v run="$(basename "$run")" 'match($0, / triton .*: compiled, [0-9]+ ms/) {n++; split(substr($0, RSTART), f, "compiled, "); ms += f[2]}
    / triton .*: disk cache, / {hits++}
    END {printf "%-48s %3d builds in the worker (%.1f s), %3d from the disk cache\n", run, n, ms / 1000, hits}' \
    "$run"workers/worker-*.log 2>/dev/null
done)
for f in ./*.txt; do echo "== $f"; grep -v "^ *$" "$f" | head -40; done
# KEEP_RUNS: a folder of the tree (an ignored one, e.g. build/runs) that keeps this call's run folders whole, for
# a later call on the same warm machine to RESUME from (a model-level run's folder can exceed what a call carries)
if [ -n "${KEEP_RUNS:-}" ]; then mkdir -p "$REPO/$KEEP_RUNS" && cp -r runs/. "$REPO/$KEEP_RUNS/"; fi
cd "$OUT" && rm -rf "$WORK"
printf '%s\n' "${summary[@]}" "$builds" | tee "$OUT/summary.txt"
