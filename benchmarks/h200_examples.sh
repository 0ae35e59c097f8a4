#!/usr/bin/env bash
# One device call: GPU tests, the loop-speed scenario, every example at full size (the README table). Logs in $OUT.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
python3 -m pip install -q --no-deps .wheels/nvidia_cutlass-*.whl >>"$OUT/install.log" 2>&1
t0=$(date +%s)
timeout 230 python3 -m pytest tests -m gpu -q -rfEs -p no:cacheprovider -p no:randomly -n 4 > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/walls.txt"
tail -6 "$OUT/gpu-tests.log"
t0=$(date +%s)
timeout 150 python3 benchmarks/loop_gemm.py --out /tmp/kl -n 4 --iterations 1 > "$OUT/loop.log" 2>&1
echo "loop rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/walls.txt"
grep -A5 "^phase" "$OUT/loop.log"
: > "$OUT/examples.log"
for spec in "gemm_tiled/gemm_tiled.cu M=4096,N=4096,K=4096" "gemm_cutlass/gemm_cutlass.cu M=4096,N=4096,K=4096" \
            "softmax_cuda/softmax.cu M=4096,N=1024" "matmul_triton/matmul.py M=4096,N=4096,K=4096" \
            "batchnorm/batchnorm.cu N=16384,C=1024,eps=1e-5"; do
  [ $(( $(date +%s) - T0 )) -gt 470 ] && { echo "skipped $spec (time)" >> "$OUT/examples.log"; continue; }
  set -- $spec
  t0=$(date +%s)
  timeout 90 python3 -m pytest -p no:randomly --kopt-baseline examples/$1 --kopt-ref examples/$(dirname $1)/ref.py \
    --kopt-dims $2 --kopt-seed 1 --kopt-json "$OUT/ex_$(dirname $1).json" -q > "$OUT/ex.tmp" 2>&1
  echo "== $1 $2 rc=$? wall=$(( $(date +%s) - t0 ))s" >> "$OUT/examples.log"
  sed -n '/kopt gates/,$p' "$OUT/ex.tmp" >> "$OUT/examples.log"
  python3 - "$OUT/ex_$(dirname $1).json" >> "$OUT/examples.log" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for i in d["items"]:
    if i["gate"] in ("timing", "ncu", "roofline"):
        print(f"  {i['gate']}: {i['status']} {i['summary'] or i['message']}"[:330])
PY
done
rm -f "$OUT/ex.tmp"
cat "$OUT/examples.log" | grep -E "^==|timing:|ncu:|roofline:|skipped" 
(cd "$OUT" && tar czf ex_json.tgz ex_*.json && rm -f ex_*.json)
echo "total wall=$(( $(date +%s) - T0 ))s"
