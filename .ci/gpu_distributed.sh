#!/usr/bin/env bash
# The distributed rooms on a multi-GPU machine (NCCL, one GPU per rank) through `microscope run`, in one
# device call (kind nvidia-h200-x2 for RANKS=2, nvidia-h200-x4 for RANKS="2 4"):
#   RANKS=2 bash .ci/gpu_distributed.sh
#   RANKS="2 4" ROOMS="data_parallel zero_sharding" bash .ci/gpu_distributed.sh
# Each room runs on the embedded gpu workload, shortened to a timing run (SETS, default
# "workload.profile=gpu workload.steps=60 workload.seeds=2"), with `--set workload.ranks=N` for each N in
# RANKS; data_parallel's console line gives the scaling efficiency over one GPU. Outputs in $OUT:
# consoles.tgz, runs.tgz (records, comparisons, worker logs), summary.txt (last). ROOM_S: each step's limit.
set -u
OUT=${OUT:-/tmp/microscope-gpu-distributed}
WORK=$OUT/work
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-180}
SETS=${SETS:-workload.profile=gpu workload.steps=60 workload.seeds=2}
summary=()
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "GPUs", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$WORK/install.txt" 2>&1
for n in ${RANKS:-2}; do
  for room in ${ROOMS:-data_parallel zero_sharding grad_compression tensor_parallel pipeline_parallel expert_parallel}; do
    start=$SECONDS
    # shellcheck disable=SC2086
    timeout -k 5 "${ROOM_S:-240}" python3 -m microscope.cli run "ablations/$room.yaml" --device cuda \
      --set workload.ranks="$n" $SETS --out "$WORK/runs" --no-report --no-progress >"$WORK/$room-$n.txt" 2>&1
    rc=$?
    summary+=("$(printf '%-20s %2s ranks  exit %-3s %4s s' "$room" "$n" "$rc" "$((SECONDS - start))")")
  done
done
cd "$WORK" || exit 1
find runs \( -name records.jsonl -o -name comparison.csv -o -name groups.jsonl -o -name 'worker-*.log' \) |
  tar czf "$OUT/runs.tgz" -T -
tar czf "$OUT/consoles.tgz" ./*.txt
for f in ./*-[0-9]*.txt; do echo "== $f"; grep -v "^ *$" "$f" | grep -v "^\[" | head -30; done
cd "$OUT" && rm -rf "$WORK"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
