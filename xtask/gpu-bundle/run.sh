#!/usr/bin/env bash
# kiln's GPU node check, from the bundle `cargo xtask gpu-bundle` packs: no Rust toolchain
# needed. Finds the CUDA driver and NVRTC/NCCL (system paths, or the nvidia-* Python wheels'
# lib folders), runs `resnet_ddp doctor`, then short ResNet-18 trainings on the visible GPUs
# (f32, bf16, two replicas sharing a GPU, one replica per GPU when there are several), and
# PyTorch's same model when `import torch` finds CUDA. Writes results/summary.txt.
#   ./run.sh            3 epochs of 10,000 synthetic images per run
#   ./run.sh --quick    1 epoch of 2,000
#   ./run.sh --picture  the whole picture within ~6 minutes (picture.sh): start-up, f32/bf16,
#                       shared GPU, pipeline, PyTorch, kernel families, CPU rows; results.json
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = "--picture" ]; then
  shift
  exec "$here/picture.sh" "$@"
fi
bin="$here/bin/resnet_ddp"
out="${KILN_BUNDLE_OUT:-$here/results}"
epochs=3; samples=10000
[ "${1:-}" = "--quick" ] && { epochs=1; samples=2000; }
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
failures=0
record() { printf '%-34s %s\n' "$1" "$2" | tee -a "$summary"; }

# NVRTC and NCCL from pip wheels (nvidia-cuda-nvrtc, nvidia-nccl-cu13), if python3 has them.
if command -v python3 >/dev/null 2>&1; then
  site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null || true)
  for lib in "$site"/nvidia/*/lib; do
    [ -d "$lib" ] && LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
  done
  export LD_LIBRARY_PATH
fi

record "machine" "$(uname -srm); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
record "GPUs (nvidia-smi -L)" "${gpus:-0}"
nvidia-smi -L 2>/dev/null | sed 's/^/  /' | tee -a "$summary"
all=$(seq -s, -f 'cuda:%g' 0 $(( ${gpus:-1} - 1 )) 2>/dev/null || echo cuda:0)

if "$bin" doctor --devices "${all:-cuda:0}" > "$out/doctor.txt" 2>&1; then
  record "doctor" "pass"
else
  record "doctor" "FAIL (see doctor.txt)"; failures=$((failures + 1))
fi
sed 's/^/  /' "$out/doctor.txt"

# kiln's equivalence checks on the GPUs: two replicas sharing cuda:0, and one per GPU.
selftest() {
  local id=$1 devices=$2
  if "$bin" selftest --devices "$devices" > "$out/$id.log" 2>&1; then
    record "selftest $devices" "pass"
  else
    record "selftest $devices" "FAIL (see $id.log)"; failures=$((failures + 1))
  fi
  sed 's/^/  /' "$out/$id.log"
}
selftest selftest-shared cuda:0,cuda:0
if [ "${gpus:-0}" -gt 1 ]; then selftest selftest-per-gpu "$all"; fi

# Peak GPU memory of a run: nvidia-smi sampled every half second in the background.
train() {
  local id=$1 name=$2; shift 2
  local log="$out/$id.log" mem="$out/$id.mem"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$mem" 2>/dev/null &
  local sampler=$!
  if timeout 3600 "$bin" --width 64 --batch-size 128 --epochs "$epochs" \
      --synthetic-samples "$samples" --plan dp "$@" > "$log" 2>&1; then
    local speed acc peak
    speed=$(grep -oE 'all [0-9]+ replicas of this process: [0-9]+ img/s|done: .*\(([0-9]+) img/s\)' "$log" | tail -1 | grep -oE '[0-9]+ img/s' | tail -1)
    acc=$(grep -oE 'final val acc [0-9.]+%' "$log" | tail -1)
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    peak=$(sort -n "$mem" 2>/dev/null | tail -1)
    record "$name" "pass: ${speed:-? img/s}, ${acc:-no accuracy}, peak ${peak:-?} MiB"
  else
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    record "$name" "FAIL (see $id.log)"; failures=$((failures + 1))
    tail -5 "$log" | sed 's/^/  /'
  fi
}

train f32 "f32, cuda:0" --devices cuda:0
train bf16 "bf16, cuda:0" --devices cuda:0 --amp bf16
train shared "2 replicas sharing cuda:0" --devices cuda:0,cuda:0 --gradient-path device
if [ "${gpus:-0}" -gt 1 ]; then
  train per-gpu "1 replica per GPU ($gpus)" --devices "$all" --gradient-path device
fi

if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  peer=$(python3 "$here/peer/resnet_peer.py" --device cuda --width 64 --batch 128 --warmup 5 --steps 30 2>/dev/null | tail -1)
  record "PyTorch f32, cuda:0 (TF32 off)" "$peer"
else
  record "PyTorch" "skipped (python3 cannot import torch with CUDA)"
fi

record "result" "$([ "$failures" -eq 0 ] && echo pass || echo "$failures FAILED")"
echo "summary: $summary"
[ "$failures" -eq 0 ]
