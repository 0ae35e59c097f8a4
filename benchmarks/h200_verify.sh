#!/usr/bin/env bash
# Device-machine check of every GPU path, in named sections so one device call can run the ones it has time for.
# Logs in $OUT (one file per section). Usage (device machine, repository root):
#   bash benchmarks/h200_verify.sh [main] [tests] [loop] [saved] [pr] [speed] [fidelity]  (no argument: all, in order)
#   main      the README's main command on the naive SGEMM, and the Triton softmax example (JSON reports in $OUT)
#   tests     GPU tests (pytest tests -m gpu -n 4)
#   loop      the loop-speed scenario: benchmarks/loop_gemm.py -n 4 --iterations 1 (naive SGEMM 4096^3)
#   saved     --kopt-save / --kopt-compare on the tiled SGEMM
#   pr        the PR gate on (naive, tiled), (tiled, tiled), (tiled, naive) SGEMM at 4096^3
#   speed     benchmarks/loop_speed.py --jobs 8 (compile -n 8 vs -n 0, cache hits, collection of 64 candidates)
#   fidelity  benchmarks/timing_fidelity.py (kopt events and graph, do_bench, ncu)
#   multi     benchmarks/multi_gpu.py -n 9 (one worker per kernel): one 8-branch iteration closed on GPU 0 and on GPUs 0,1 (needs 2 GPUs)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kopt-out}
mkdir -p "$OUT"
T0=$(date +%s)
sections=${*:-main tests loop saved pr speed fidelity}
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
# wheels the image lacks (nvidia-cutlass, jsonschema and its dependencies), carried in .wheels/
ls .wheels/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-deps --no-index .wheels/*.whl >>"$OUT/install.log" 2>&1
wall() { echo "$1 rc=$2 wall=$(( $(date +%s) - $3 ))s" | tee -a "$OUT/walls.txt"; }
DIMS=M=4096,N=4096,K=4096
for s in $sections; do
  t0=$(date +%s)
  case $s in
    main)
      timeout 150 python3 -m pytest -p no:randomly --kopt-baseline examples/gemm/gemm.cu --kopt-ref examples/gemm/ref.py \
        --kopt-dims $DIMS --kopt-json "$OUT/main_gemm.json" > "$OUT/main.log" 2>&1
      rc=$?; sed -n '/kopt gates/,$p' "$OUT/main.log"
      timeout 120 python3 -m pytest -p no:randomly --kopt-baseline examples/softmax_triton/softmax.py \
        --kopt-ref examples/softmax_triton/ref.py --kopt-dims M=4096,N=1024 --kopt-json "$OUT/main_softmax.json" \
        > "$OUT/main_softmax.log" 2>&1
      echo "softmax rc=$?"; sed -n '/kopt gates/,$p' "$OUT/main_softmax.log"
      wall main $rc $t0 ;;
    tests)
      timeout 300 python3 -m pytest tests -m gpu -q -rfEsxX -p no:cacheprovider -p no:randomly -n 4 > "$OUT/gpu-tests.log" 2>&1
      wall tests $? $t0; tail -12 "$OUT/gpu-tests.log" ;;
    loop)
      timeout 420 python3 benchmarks/loop_gemm.py --out /tmp/kl -n 4 --iterations 1 > "$OUT/loop.log" 2>&1
      rc=$?; cp /tmp/kl/loop/init.log "$OUT/loop-init.log" 2>/dev/null; cp /tmp/kl/loop/iter1.log "$OUT/loop-iter1.log" 2>/dev/null
      python3 - >> "$OUT/loop.log" <<'PY'
import glob, json
for f in sorted(glob.glob("/tmp/kl/loop/**/correctness/*.json", recursive=True)):
    r = json.load(open(f))
    print("phase_s", f.split("/loop/")[-1], r.get("reference_cache_hit"), r.get("phase_s"))
PY
      wall loop $rc $t0; grep -A5 "^phase" "$OUT/loop.log"; grep "^phase_s" "$OUT/loop.log" | head -8 ;;
    saved)
      for step in "--kopt-save main" "--kopt-compare main"; do
        timeout 90 python3 -m pytest -p no:randomly --kopt-baseline examples/gemm_tiled/gemm_tiled.cu \
          --kopt-ref examples/gemm_tiled/ref.py --kopt-dims $DIMS --kopt-seeds 1 -k "correctness or timing" \
          --kopt-storage /tmp/kbench $step -q 2>&1 | grep -E "kopt|passed|failed" >> "$OUT/saved.log"
      done
      wall saved 0 $t0; cat "$OUT/saved.log" ;;
    pr)
      rm -rf /tmp/pr && mkdir -p /tmp/pr/main /tmp/pr/pr && cp examples/gemm/ref.py /tmp/pr/
      for side in main pr; do
        cp examples/gemm/gemm.cu /tmp/pr/$side/naive.cu
        cp examples/gemm_tiled/gemm_tiled.cu examples/gemm_tiled/*.cuh /tmp/pr/$side/ 2>/dev/null
      done
      for pair in "main/naive.cu pr/gemm_tiled.cu" "main/gemm_tiled.cu pr/gemm_tiled.cu" "main/gemm_tiled.cu pr/naive.cu"; do
        set -- $pair; p0=$(date +%s)
        (cd /tmp/pr && timeout 150 python3 -m pytest -p no:randomly --kopt-baseline $1 --kopt-candidate $2 --kopt-ref ref.py \
          --kopt-dims $DIMS --kopt-seeds 1,2 --kopt-fail-slower 3 -k "correctness or timing" -q \
          --kopt-json "pr_${1%%/*}_$(basename $1 .cu)__$(basename $2 .cu).json" > /tmp/pr/out.log 2>&1)
        rc=$?; grep "kopt PR gate" /tmp/pr/out.log | sed "s/\$/      exit $rc, $(( $(date +%s) - p0 )) s/" | tee -a "$OUT/pr.log"
        [ $rc -ne 0 ] && [ $rc -ne 2 ] && tail -30 /tmp/pr/out.log >> "$OUT/pr.log"
      done
      cp /tmp/pr/pr_main_naive__gemm_tiled.json "$OUT/h200_report.json" 2>/dev/null
      wall pr 0 $t0 ;;
    speed)
      timeout 200 python3 benchmarks/loop_speed.py --jobs 8 > "$OUT/speed.log" 2>&1
      wall speed $? $t0; cat "$OUT/speed.log" ;;
    fidelity)
      left=$(( 580 - ($(date +%s) - T0) ))
      [ $left -gt 60 ] && timeout $left python3 benchmarks/timing_fidelity.py --out /tmp/tf > "$OUT/fidelity.log" 2>&1
      wall fidelity $? $t0; tail -10 "$OUT/fidelity.log" 2>/dev/null ;;
    multi)
      nvidia-smi -L | tee "$OUT/multi.log"
      timeout 560 python3 benchmarks/multi_gpu.py --out /tmp/km -n ${KOPT_MULTI_N:-9} --order ${KOPT_MULTI_ORDER:-1,2} >> "$OUT/multi.log" 2>&1
      rc=$?; for f in init close_1gpu close_2gpu; do cp /tmp/km/multi/$f.log "$OUT/multi-$f.log" 2>/dev/null; done
      cp /tmp/km/multi/run_*_2gpu/iterv1/decision.json "$OUT/multi-decision.json" 2>/dev/null
      wall multi $rc $t0; tail -16 "$OUT/multi.log" ;;
    *) echo "unknown section $s" ;;
  esac
done
echo "total wall=$(( $(date +%s) - T0 ))s"
