#!/usr/bin/env bash
# One device call that re-checks every GPU path after CPU-only changes (run it first in a session with device
# time): GPU tests, saved baselines (--kopt-save/--kopt-compare), the loop-speed scenario, the timing-fidelity
# table (events, graph, do_bench vs ncu). Logs in $OUT (at most 8 files).
# Usage (device machine, repository root): bash benchmarks/h200_verify.sh
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
ls .wheels/nvidia_cutlass-*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-deps .wheels/nvidia_cutlass-*.whl >>"$OUT/install.log" 2>&1
t0=$(date +%s)
timeout 240 python3 -m pytest tests -m gpu -q -rfEsxX -p no:cacheprovider -p no:randomly -n 4 > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/walls.txt"; tail -12 "$OUT/gpu-tests.log"
t0=$(date +%s)
for step in "--kopt-save main" "--kopt-compare main"; do
  timeout 90 python3 -m pytest -p no:randomly --kopt-baseline examples/gemm_tiled/gemm_tiled.cu \
    --kopt-ref examples/gemm_tiled/ref.py --kopt-dims M=4096,N=4096,K=4096 --kopt-seeds 1 -k "correctness or timing" \
    --kopt-storage /tmp/kbench $step -q 2>&1 | grep -E "kopt|passed|failed" >> "$OUT/saved.log"
done
echo "saved baselines wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/walls.txt"; cat "$OUT/saved.log"
t0=$(date +%s)
timeout 150 python3 benchmarks/loop_gemm.py --out /tmp/kl -n 4 --iterations 1 > "$OUT/loop.log" 2>&1
echo "loop rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a "$OUT/walls.txt"; grep -A5 "^phase" "$OUT/loop.log"
left=$(( 560 - ($(date +%s) - T0) ))
[ $left -gt 60 ] && timeout $left python3 benchmarks/timing_fidelity.py --out /tmp/tf > "$OUT/fidelity.log" 2>&1
tail -10 "$OUT/fidelity.log" 2>/dev/null
echo "total wall=$(( $(date +%s) - T0 ))s"
