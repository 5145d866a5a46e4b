#!/usr/bin/env bash
# `run.sh --picture`: the whole GPU picture in one call, within a deadline. Each step runs under
# its own cap (never past the deadline), writes its log as it goes and its line to steps.tsv
# when it ends; picture_report.py then writes results.json and summary.md from whatever ran.
#   run.sh --picture                  on cuda:0 (ResNet-18 width 64, batch 128)
#   run.sh --picture --devices cpu    the dry run: the same steps and table on the CPU, tiny
#   KILN_PICTURE_BUDGET=330           seconds for all steps (default 330)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin="${KILN_BIN:-$here/bin/resnet_ddp}"
out="${KILN_BUNDLE_OUT:-$here/results}"
kind=cuda
while [ $# -gt 0 ]; do
  case "$1" in
    --devices) kind="$2"; shift 2 ;;
    *) echo "picture: unknown option $1" >&2; exit 2 ;;
  esac
done
budget="${KILN_PICTURE_BUDGET:-330}"
start=$(date +%s)
mkdir -p "$out"
: > "$out/steps.tsv"
cache="$out/gpu-cache"
rm -rf "$cache" "$out/kernels.log"

if [ "$kind" = cpu ]; then
  dev=cpu:0; pair=cpu:0,cpu:1
  model=(--width 4 --batch-size 16 --synthetic-samples 512 --steps 6)
  pipe=(--width 4 --batch-size 32 --micro-batches 2 --synthetic-samples 512 --steps 4)
  peer=(--device cpu --width 4 --batch 16 --warmup 2 --steps 4)
  cpu_model=(--width 4 --batch-size 16 --synthetic-samples 512 --steps 6)
  cpu_peer=(--width 4 --batch 16 --warmup 2 --steps 4)
  prof=(--width 4 --batch-size 16 --synthetic-samples 512 --steps 5)
  threads=1
else
  dev=cuda:0; pair=cuda:0,cuda:0
  model=(--width 64 --batch-size 128 --synthetic-samples 6400 --steps 40)
  pipe=(--width 64 --batch-size 256 --micro-batches 2 --synthetic-samples 6400 --steps 20)
  peer=(--device cuda --width 64 --batch 128 --warmup 5 --steps 30)
  cpu_model=(--width 64 --batch-size 32 --synthetic-samples 1024 --steps 8)
  cpu_peer=(--width 64 --batch 32 --warmup 2 --steps 6)
  prof=(--width 64 --batch-size 128 --synthetic-samples 6400 --steps 12)
  threads=$(nproc)
fi

# NVRTC and NCCL from pip wheels (nvidia-cuda-nvrtc, nvidia-nccl-cu13), if python3 has them.
if command -v python3 >/dev/null 2>&1; then
  site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null || true)
  for lib in "$site"/nvidia/*/lib "$site"/nvidia/*/*/lib; do
    [ -d "$lib" ] && LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
  done
  export LD_LIBRARY_PATH
fi

{
  echo "machine: $(uname -srm); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(nproc) cores"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  echo "kind: $kind; budget: ${budget} s; started: $(date -u +%FT%TZ)"
} > "$out/machine.txt"
cat "$out/machine.txt"

# step ID CAP COMMAND...: runs COMMAND for at most CAP seconds and never past the deadline
# (10 s are kept for the report); its output goes to ID.log, GPU memory samples to ID.mem.
step() {
  local id=$1 cap=$2; shift 2
  local left=$(( budget - ($(date +%s) - start) - 10 ))
  [ "$cap" -gt "$left" ] && cap=$left
  if [ "$cap" -lt 5 ]; then
    printf '%s\tskipped\t0\n' "$id" >> "$out/steps.tsv"; echo "== $id: skipped (deadline)"; return
  fi
  local sampler=
  if [ "$kind" != cpu ] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$out/$id.mem" 2>/dev/null &
    sampler=$!
  fi
  local t0=$(date +%s.%N) status
  echo "== $id (cap ${cap} s): $*"
  timeout --kill-after=5 "$cap" "$@" > "$out/$id.log" 2>&1
  status=$?
  [ -n "$sampler" ] && { kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null; }
  local took
  took=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')" 2>/dev/null || echo "?")
  case $status in
    0) state=ok ;; 124|137) state=timeout ;; *) state="failed($status)" ;;
  esac
  printf '%s\t%s\t%s\n' "$id" "$state" "$took" >> "$out/steps.tsv"
  echo "== $id: $state in $took s"; tail -3 "$out/$id.log"
}

# The kernel cache in this run's own directory, so that the first run starts empty (a CPU
# build refuses GPU settings, rightly: the dry run leaves them out).
gpu=(--gpu-cache "$cache")
[ "$kind" = cpu ] && gpu=()
kiln=("$bin" --plan dp --quiet "${gpu[@]}")
have_torch() {
  python3 -c "import torch, sys; sys.exit(0 if '$kind' == 'cpu' or torch.cuda.is_available() else 1)" 2>/dev/null
}
# The bundle carries the peer beside this script; in the source tree it sits in xtask/peer.
peer_py="$here/peer/resnet_peer.py"
[ -e "$peer_py" ] || peer_py="$here/../peer/resnet_peer.py"

# Start-up first: a first run (empty kernel cache) and a second (the same command again).
step first 170 "${kiln[@]}" --devices "$dev" "${model[@]}"
step second 60 "${kiln[@]}" --devices "$dev" "${model[@]}"
if have_torch; then
  for p in tf32 f32 bf16; do
    [ "$kind" = cpu ] && [ "$p" != f32 ] && { printf 'torch-%s\tskipped\t0\n' "$p" >> "$out/steps.tsv"; continue; }
    step "torch-$p" 60 python3 "$peer_py" "${peer[@]}" --precision "$p"
  done
else
  for p in tf32 f32 bf16; do printf 'torch-%s\tskipped\t0\n' "$p" >> "$out/steps.tsv"; done
fi
step bf16 120 "${kiln[@]}" --devices "$dev" "${model[@]}" --amp bf16
step shared 60 "${kiln[@]}" --devices "$pair" "${model[@]}" --gradient-path device
step pipeline 90 "$bin" --quiet "${gpu[@]}" --pipeline 2 --devices "$pair" "${pipe[@]}"
# Stages on two GPUs, when the node has them (activations and gradients cross devices).
if [ "$kind" != cpu ] && [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" -ge 2 ]; then
  step pipeline-two 90 "$bin" --quiet "${gpu[@]}" --pipeline 2 --devices cuda:0,cuda:1 "${pipe[@]}"
else
  printf 'pipeline-two\tskipped\t0\n' >> "$out/steps.tsv"
fi
if [ "$kind" = cpu ]; then
  # A CPU build has no kernel profile (GPU kernels only): refused, rightly.
  printf 'profile\tskipped\t0\n' >> "$out/steps.tsv"
else
  step profile 60 "${kiln[@]}" --devices "$dev" "${prof[@]}" --profile-kernels "$out/kernels.log" --profile-warmup 3
fi
# The CPU rows: one replica on every core, two on half each; PyTorch likewise.
step cpu-1 60 "${kiln[@]}" --devices cpu:0 --threads "$threads" "${cpu_model[@]}"
step cpu-2 60 "${kiln[@]}" --devices cpu:0,cpu:1 --threads $(( (threads + 1) / 2 )) "${cpu_model[@]}"
if have_torch; then
  step torch-cpu-1 60 python3 "$peer_py" --device cpu --replicas 1 --threads "$threads" "${cpu_peer[@]}"
  step torch-cpu-2 60 python3 "$peer_py" --device cpu --replicas 2 --threads $(( (threads + 1) / 2 )) "${cpu_peer[@]}"
else
  printf 'torch-cpu-1\tskipped\t0\ntorch-cpu-2\tskipped\t0\n' >> "$out/steps.tsv"
fi

# The equivalence checks on the GPU (CI runs them on CPUs already).
if [ "$kind" = cpu ]; then
  printf 'selftest\tskipped\t0\n' >> "$out/steps.tsv"
else
  step selftest 90 "$bin" selftest --devices "$pair" "${gpu[@]}"
fi

python3 "$here/picture_report.py" "$out" --kind "$kind" --budget "$budget" --elapsed $(( $(date +%s) - start ))
