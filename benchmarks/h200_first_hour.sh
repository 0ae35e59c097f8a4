#!/usr/bin/env bash
# Issue #38 on the H200, in device calls of at most 10 minutes each (logs and charts in $OUT):
#   bash benchmarks/h200_first_hour.sh examples   every example with docs/examples.md's H200 command (--kopt-seed 1),
#                                                 the verdict line each, the GPU probe's backend, a PR-gate summary
#   bash benchmarks/h200_first_hour.sh loop       a 1-iteration loop on the naive SGEMM; its charts and roofline.png
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kopt-out}
mkdir -p "$OUT"
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
ls .wheels/nvidia_cutlass-*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-deps .wheels/nvidia_cutlass-*.whl >>"$OUT/install.log" 2>&1

examples() {
  : > "$OUT/examples.log"
  for spec in "gemm/gemm.cu ref.py M=4096,N=4096,K=4096" "gemm_tiled/gemm_tiled.cu ref.py M=4096,N=4096,K=4096" \
              "gemm_cutlass/gemm_cutlass.cu ref.py M=4096,N=4096,K=4096" "softmax_cuda/softmax.cu ref.py M=4096,N=1024" \
              "batchnorm/batchnorm.cu ref.py N=16384,C=1024,eps=1e-5" "layernorm/layernorm.cu ref.py M=16384,N=4096,eps=1e-5" \
              "softmax_triton/softmax.py ref.py M=4096,N=1024" "matmul_triton/matmul.py ref.py M=4096,N=4096,K=4096" \
              "matmul_autotune/matmul.py ref.py M=4096,N=4096,K=4096" "kernelbench_linear/model_new.py problem.py -" \
              "gpumode_tril/submission.py reference.py -"; do
    [ $(( $(date +%s) - T0 )) -gt 540 ] && { echo "skipped $spec (time)" >> "$OUT/examples.log"; continue; }
    set -- $spec
    dims=(); [ "$3" != - ] && dims=(--kopt-dims "$3")
    name=$(dirname "$1"); t0=$(date +%s)
    timeout 120 python3 -m pytest -p no:randomly --kopt-baseline "examples/$1" --kopt-ref "examples/$name/$2" "${dims[@]}" \
      --kopt-seed 1 --kopt-json "$OUT/ex_$name.json" -q > "$OUT/ex_$name.log" 2>&1
    rc=$?
    echo "== $name rc=$rc wall=$(( $(date +%s) - t0 ))s" >> "$OUT/examples.log"
    python3 - "$OUT/ex_$name.json" >> "$OUT/examples.log" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k in d["kernels"]:
    print(f"  {k['status']} output_checked={k['output_checked']} median_ms={k['median_ms']} speedup={k['speedup_vs_ref']}")
for i in d["items"]:
    if i["outcome"] == "failed" or i["gate"] in ("timing", "roofline"):
        print(f"  {i['gate']}: {i['status']} {i['summary'] or i['message']}"[:300])
print("  probe:", [a.get("probe") for a in d["env"].get("hardware_attempts", [])])
PY
  done
  # the PR gate's Markdown summary and annotations: naive vs tiled SGEMM at 2048^3
  GITHUB_ACTIONS=true timeout 120 python3 -m pytest --kopt-baseline examples/gemm/gemm.cu \
    --kopt-candidate examples/gemm_tiled/gemm_tiled.cu --kopt-ref examples/gemm/ref.py --kopt-dims M=2048,N=2048,K=2048 \
    --kopt-seeds 1,2 --kopt-fail-slower 3 -k "correctness or timing" --kopt-summary-md "$OUT/pr.md" -q \
    > "$OUT/pr.log" 2>&1
  echo "== pr gate rc=$?" >> "$OUT/examples.log"
  grep "^::" "$OUT/pr.log" >> "$OUT/examples.log"
  cat "$OUT/examples.log" "$OUT/pr.md"
}

loop() {
  rm -rf /tmp/kl
  timeout 480 python3 benchmarks/loop_gemm.py --out /tmp/kl -n 4 --iterations 1 > "$OUT/loop.log" 2>&1
  echo "loop rc=$? wall=$(( $(date +%s) - T0 ))s"
  tail -5 "$OUT/loop.log"
  for f in $(find /tmp/kl -name "*.png" -o -name summary.md | head -20); do
    cp "$f" "$OUT/$(echo "${f#/tmp/kl/}" | tr / _)"
  done
  ls "$OUT"
}

"${1:-examples}"
echo "total wall=$(( $(date +%s) - T0 ))s"
