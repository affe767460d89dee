#!/usr/bin/env bash
# Several members per GPU, measured: the paper's MNIST and CIFAR-10 members (FedPSA, runtime.execution=loop, the
# stand-ins when tfds' data is absent) at N = 1, 2, 4, 8 at once on one device (benchmarks/gpu_backends.py
# --per_device), each a process with a Ray member's 1/N share of the GPU. Sized for under 10 minutes of one H100-class
# GPU: 0.03 virtual days per member (after 0.01 of warm-up) is about 5 s of a CIFAR-10 member's training alone at the
# H100's measured 153 s per virtual day; most of each row is its processes starting and compiling.
#
#   OUT=DIR bash benchmarks/several_per_gpu.sh [more gpu_backends.py flags, which win]
#
# Writes DIR/several_per_gpu.txt (the table, row by row, so a stopped run keeps what it measured) and
# DIR/environment.txt (the GPU, its driver, JAX's version and devices). PYTHON names the interpreter (default: .venv's,
# else python3). The CPU check of this script: `OUT=/tmp/x bash benchmarks/several_per_gpu.sh --small
# --members=cifar10 --per_device=1,2 --model=tiny_mlp`.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the table goes to}"
mkdir -p "$OUT"
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
{
  if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; else echo "no nvidia-smi"; fi
  "$PYTHON" -c "import jax, flax, optax, ml_collections; print('jax', jax.__version__, jax.devices())" 2>&1
} | tee "$OUT/environment.txt"
"$PYTHON" benchmarks/gpu_backends.py --members=mnist,cifar10 --executions=loop --per_device=1,2,4,8 \
  --days=0.03 --warmup_days=0.01 "$@" 2>"$OUT/stderr.txt" | tee "$OUT/several_per_gpu.txt"
