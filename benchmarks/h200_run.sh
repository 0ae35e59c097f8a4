#!/usr/bin/env bash
# GPU-machine check: the README's main job on both examples, the timing-fidelity benchmark, the GPU tests.
# Usage (device machine): bash benchmarks/h200_run.sh [examples|tests|all]; logs and reports go to $OUT.
set -u
OUT=${OUT:-/tmp/kopt-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
what=${1:-all}
examples=${KOPT_EXAMPLES:-gemm softmax}
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if [ "$what" = examples ] || [ "$what" = all ]; then
  for name in $examples; do
    case $name in
      gemm) set -- gemm/gemm.cu gemm/ref.py M=4096,N=4096,K=4096 ;;
      softmax) set -- softmax_triton/softmax.py softmax_triton/ref.py M=4096,N=1024 ;;
    esac
    t0=$(date +%s)
    python3 -m pytest --kopt-baseline examples/$1 --kopt-ref examples/$2 --kopt-dims $3 --kopt-seed 1 \
      --kopt-json "$OUT/$(basename $1).json" --kopt-outdir "$OUT/kopt" -rs -p no:randomly 2>&1 | tee "$OUT/$(basename $1).log" | sed -n '/kopt gates/,$p'
    echo "$1 rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - t0 ))s"
  done
  for d in "$OUT"/kopt/*/; do
    [ -f "$d/kernel.ncu-rep" ] && ncu --import "$d/kernel.ncu-rep" --csv --page raw > "${d%/}_raw.csv" 2>/dev/null
  done
  python3 benchmarks/timing_fidelity.py --out "$OUT/kopt" 2>&1 | tail -12
  tar czf "$OUT/kopt.tgz" -C "$OUT" kopt && rm -rf "$OUT/kopt"
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest tests -m gpu -q -rs -p no:cacheprovider -p no:randomly 2>&1 | tee "$OUT/gpu-tests.log" | tail -30
fi
