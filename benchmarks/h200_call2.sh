#!/usr/bin/env bash
# Device call 2: GPU tests, the loop-speed scenario (set-up + one close), the PR gate on three pairs. Logs in $OUT.
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
python3 -m pip install -q --no-deps .wheels/nvidia_cutlass-*.whl >>"$OUT/install.log" 2>&1
t0=$(date +%s)
timeout 300 python3 -m pytest tests -m gpu -q -rfEs -p no:cacheprovider -p no:randomly -n 4 > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/walls.txt"
tail -25 "$OUT/gpu-tests.log"
t0=$(date +%s)
timeout 200 python3 benchmarks/loop_gemm.py --out /tmp/kl -n 4 --iterations 1 > "$OUT/loop.log" 2>&1
echo "loop rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/walls.txt"
grep -A8 "^phase" "$OUT/loop.log"
mkdir -p /tmp/pr/main /tmp/pr/pr
cp examples/gemm/gemm.cu /tmp/pr/main/naive.cu; cp examples/gemm/ref.py /tmp/pr/ref.py
for d in main pr; do cp examples/gemm_tiled/gemm_tiled.cu examples/gemm_tiled/reg_tiled.cuh /tmp/pr/$d/; done
cp examples/gemm/gemm.cu /tmp/pr/pr/naive.cu
for pair in "main/naive.cu pr/gemm_tiled.cu" "main/gemm_tiled.cu pr/gemm_tiled.cu" "main/gemm_tiled.cu pr/naive.cu"; do
  set -- $pair
  t0=$(date +%s)
  (cd /tmp/pr && timeout 150 python3 -m pytest -p no:randomly --kopt-baseline $1 --kopt-candidate $2 --kopt-ref ref.py \
     --kopt-dims M=4096,N=4096,K=4096 --kopt-seeds 1,2 --kopt-fail-slower 3 -k "correctness or timing" -q) > "$OUT/pr.log.tmp" 2>&1
  rc=$?
  echo "PR $1 -> $2 rc=$rc wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/walls.txt"
  grep -E "kopt PR gate|timing " "$OUT/pr.log.tmp" | tee -a "$OUT/pr.txt"
done
