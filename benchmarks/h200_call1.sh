#!/usr/bin/env bash
# Device call: install, GPU tests, README main job, smoke runs of the new examples. Logs under $OUT.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
python3 -m pip install -q --no-deps .wheels/nvidia_cutlass-*.whl >>"$OUT/install.log" 2>&1
t0=$(date +%s)
python3 -m pytest tests -m gpu -q -rs -p no:cacheprovider -p no:randomly -x -k "sanitizer" 2>&1 | tail -15 > "$OUT/gpu-san.log"
echo "sanitizer test wall=$(( $(date +%s) - t0 ))s" >> "$OUT/gpu-san.log"
t0=$(date +%s)
python3 -m pytest tests -m gpu -q -rs -p no:cacheprovider -p no:randomly -k "not sanitizer" 2>&1 | tail -30 > "$OUT/gpu-tests.log"
echo "gpu tests wall=$(( $(date +%s) - t0 ))s" >> "$OUT/gpu-tests.log"
for spec in "gemm/gemm.cu gemm/ref.py M=4096,N=4096,K=4096 5" "gemm_cutlass/gemm_cutlass.cu gemm_cutlass/ref.py M=4096,N=4096,K=4096 1" "softmax_cuda/softmax.cu softmax_cuda/ref.py M=4096,N=1024 1"; do
  set -- $spec
  t0=$(date +%s)
  if [ "$4" = 5 ]; then seeds=(--kopt-seed 1); else seeds=(--kopt-seeds 11); fi
  python3 -m pytest --kopt-baseline examples/$1 --kopt-ref examples/$2 --kopt-dims $3 "${seeds[@]}" \
    --kopt-json "$OUT/$(basename $1).json" -rs -p no:randomly > "$OUT/$(basename $1).log" 2>&1
  echo "$1 rc=$? wall=$(( $(date +%s) - t0 ))s" >> "$OUT/walls.txt"
done
