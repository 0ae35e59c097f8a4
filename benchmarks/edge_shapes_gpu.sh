#!/usr/bin/env bash
# Issue #39 part A on the GPU, one device call (~6 min): the README's main command (naive SGEMM 4096^3, 5 seeds)
# with edge shapes (the default) and with --kopt-edge-shapes off, same session seed, twice each in alternation; then
# every bundled example at its H200 dims with edge shapes on; then the gpu-marked tests of tests/test_edges.py.
# Prints, per run: the exit code, the wall time, the correctness items' time and count, and per example its verdict
# and each edge item's status. Logs and JSON reports in $OUT. Usage (device machine, repository root):
#   bash benchmarks/edge_shapes_gpu.sh [main] [examples] [tests]     (no argument: all three)
#   KOPT_EDGE_K="correctness" bash benchmarks/edge_shapes_gpu.sh examples   (the examples' correctness items only)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kopt-out}
mkdir -p "$OUT"
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
ls .wheels/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-deps --no-index .wheels/*.whl >>"$OUT/install.log" 2>&1
summary() {  # $1 label, $2 report, $3 rc, $4 wall
  python3 - "$1" "$2" "$3" "$4" <<'PY'
import json, sys
label, path, rc, wall = sys.argv[1:]
d = json.load(open(path))
corr = [i for i in d["items"] if i["gate"] == "correctness"]
edge = [i for i in corr if i["figures"].get("edge_shape")]
k = d["kernels"][0]
print(f"{label}: rc={rc} wall={wall}s verdict={k['status']} correctness items={len(corr)} "
      f"({sum(i['duration_s'] for i in corr):.1f} s; edge {len(edge)}: {sum(i['duration_s'] for i in edge):.2f} s) "
      f"edge_shapes={k.get('edge_shapes')!r}")
for i in edge:
    print(f"   {i['case']:<28} {i['status']:<12} {i['duration_s']:.2f} s")
PY
}
sections=" ${*:-main examples tests} "
KSEL=(); [ -n "${KOPT_EDGE_K:-}" ] && KSEL=(-k "$KOPT_EDGE_K")
[[ $sections == *" main "* ]] && for round in 1 2; do
  for mode in auto off; do
    t0=$(date +%s)
    timeout 150 python3 -m pytest -p no:randomly --kopt-baseline examples/gemm/gemm.cu --kopt-ref examples/gemm/ref.py \
      --kopt-dims M=4096,N=4096,K=4096 --kopt-seed 1 --kopt-edge-shapes $mode \
      --kopt-json "$OUT/main_${mode}_$round.json" > "$OUT/main_${mode}_$round.log" 2>&1
    rc=$?
    summary "main gemm edge=$mode round $round" "$OUT/main_${mode}_$round.json" $rc $(( $(date +%s) - t0 ))
  done
done
[[ $sections == *" examples "* ]] && for spec in "gemm_tiled/gemm_tiled.cu M=4096,N=4096,K=4096" "gemm_cutlass/gemm_cutlass.cu M=4096,N=4096,K=4096" \
            "softmax_cuda/softmax.cu M=4096,N=1024" "batchnorm/batchnorm.cu N=16384,C=1024,eps=1e-5" \
            "layernorm/layernorm.cu M=16384,N=4096,eps=1e-5" "softmax_triton/softmax.py M=4096,N=1024" \
            "matmul_triton/matmul.py M=4096,N=4096,K=4096" "matmul_autotune/matmul.py M=4096,N=4096,K=4096"; do
  [ $(( $(date +%s) - T0 )) -gt 520 ] && { echo "skipped $spec (time)"; continue; }
  set -- $spec
  t0=$(date +%s)
  name=$(dirname $1)
  timeout 120 python3 -m pytest -p no:randomly --kopt-baseline examples/$1 --kopt-ref examples/$name/ref.py \
    --kopt-dims $2 --kopt-seed 1 "${KSEL[@]}" --kopt-json "$OUT/ex_$name.json" -q > "$OUT/ex_$name.log" 2>&1
  rc=$?
  summary "$name" "$OUT/ex_$name.json" $rc $(( $(date +%s) - t0 ))
done
[[ $sections == *" tests "* ]] || { echo "total wall=$(( $(date +%s) - T0 ))s"; exit 0; }
t0=$(date +%s)
timeout 60 python3 -m pytest tests/test_edges.py -m gpu -q -p no:randomly -p no:cacheprovider > "$OUT/tests.log" 2>&1
echo "gpu tests of test_edges.py rc=$? wall=$(( $(date +%s) - t0 ))s: $(tail -1 "$OUT/tests.log")"
echo "total wall=$(( $(date +%s) - T0 ))s"
