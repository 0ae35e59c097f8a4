#!/usr/bin/env bash
# The loop walkthrough (docs/loop-walkthrough.md) on the device machine: one step of two runs, driven from the
# --kopt-json report alone (benchmarks/walk_agent.py). The runs live in .walk/ (carried to and from the machine
# as $OUT/walk.tgz). Usage, repository root:
#   bash benchmarks/walk.sh init    seed both runs (naive SGEMM 4096^3, naive layer norm 16384x4096)
#   bash benchmarks/walk.sh close   run each run's next command (and the ablation step it asks for), writing the
#                                   agent's prepared iteration (.walk/<name>/plan/, docs/walkthrough/plan.py) first
#   bash benchmarks/walk.sh init close   both, in order (WALK_ONLY=layernorm: that run only)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kopt-out}
mkdir -p "$OUT" .walk
steps=${*:-init}
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
ls .wheels/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-deps --no-index .wheels/*.whl >>"$OUT/install.log" 2>&1
declare -A DIMS=([gemm]=M=4096,N=4096,K=4096 [layernorm]=M=16384,N=4096,eps=1e-5)
declare -A SRC=([gemm]=examples/gemm/gemm.cu [layernorm]=examples/layernorm/layernorm.cu)
one() {
  local name=$1 t0; t0=$(date +%s.%N)
  if [ "$step" = init ]; then
    mkdir -p ".walk/$name" && cp "${SRC[$name]}" "$(dirname "${SRC[$name]}")/ref.py" ".walk/$name/"
    python3 -m pytest -p no:randomly --kopt-init --kopt-baseline ".walk/$name/$(basename "${SRC[$name]}")" \
      --kopt-ref ".walk/$name/ref.py" --kopt-dims "${DIMS[$name]}" --kopt-iterations 3 --kopt-branches 4 \
      --kopt-seeds 1,2,3 --kopt-json ".walk/$name/init.json" > ".walk/$name/init.log" 2>&1
    echo "$name init rc=$? wall=$(python3 -c "import time;print(round(time.time()-$t0,1))")s" | tee -a .walk/walls.txt
  else
    python3 benchmarks/walk_agent.py ".walk/$name" 2>&1 | tee -a .walk/walls.txt
  fi
}
for step in $steps; do
  for n in ${WALK_ONLY:-gemm layernorm}; do one $n & done; wait
  tar czf "$OUT/walk.tgz" --exclude='*.lock' .walk  # after every step: a later one may be cut off
done
ls -la "$OUT/walk.tgz"
