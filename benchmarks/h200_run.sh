#!/usr/bin/env bash
# Runs the README's main job on both examples and the GPU tests on a GPU machine; logs and reports go to $OUT.
# Usage (device machine): bash benchmarks/h200_run.sh
set -u
OUT=${OUT:-/tmp/kopt-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/smi.txt"
t0=$(date +%s)
python3 -m pytest --kopt-baseline examples/gemm/gemm.cu --kopt-ref examples/gemm/ref.py \
  --kopt-dims M=4096,N=4096,K=4096 --kopt-json "$OUT/gemm.json" --kopt-outdir "$OUT/kopt" -rs 2>&1 | tee "$OUT/gemm.log"
echo "gemm rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - t0 ))s"
t0=$(date +%s)
python3 -m pytest --kopt-baseline examples/softmax_triton/softmax.py --kopt-ref examples/softmax_triton/ref.py \
  --kopt-dims M=4096,N=1024 --kopt-json "$OUT/softmax.json" --kopt-outdir "$OUT/kopt" -rs 2>&1 | tee "$OUT/softmax.log"
echo "softmax rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - t0 ))s"
if [ "${KOPT_GPU_TESTS:-1}" = 1 ]; then
  python3 -m pytest tests -m gpu -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.log" | tail -25
fi
