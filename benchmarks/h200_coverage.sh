#!/usr/bin/env bash
# Issue #39 (part B) on the GPU: device memory that grows with the calls fails the timing gate as LEAK. Three cases
# from benchmarks/coverage_cases/ (ref.py: y = 2 x, n = 524288, 2 MiB per buffer), each one session through every
# gate with --kopt-json:
#   leak_cu      leak_malloc.cu: solve() cudaMalloc's 2 MiB per call and never frees it -> timing LEAK, exit 2,
#                about 2 MiB (2097152 bytes) per call
#   twin_cu      scratch_malloc.cu: the same, cudaFree'd before solve() returns -> timing PASSED on the events basis
#                (host work inside the call, issue #41), exit 0, memory flat
#   leak_triton  leak_list.py: a Triton kernel whose run_kernel() keeps each call's 2 MiB output in a module-level
#                list -> timing LEAK, exit 2, about 2 MiB per call (torch's allocated bytes grow by exactly that)
# One line per case: status of the timing item, the session's exit code, bytes per call, a call's peak bytes, the
# basis of the readings and the wall time; then the memory record of each bench.json. Logs and reports in $OUT.
# Usage (device machine, repository root): bash benchmarks/h200_coverage.sh [leak_cu] [twin_cu] [leak_triton]
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kopt-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
python3 -c "import pynvml" 2>/dev/null && echo "nvidia-ml-py: $(python3 -c 'import importlib.metadata as m; print(m.version("nvidia-ml-py"))' 2>/dev/null || echo present)" \
  || echo "nvidia-ml-py: missing (the basis will be device_used)"
CASES=benchmarks/coverage_cases  # not CC: an exported CC is the C compiler Triton builds its driver with
K="-p no:randomly -p no:cacheprovider"
# KOPT_COVERAGE_K: a -k expression for every case (e.g. "not ncu and not roofline and not sass" in a short call)
KSEL=(); [ -n "${KOPT_COVERAGE_K:-}" ] && KSEL=(-k "$KOPT_COVERAGE_K")
report() {  # case, JSON report, session rc, wall s
  python3 - "$@" <<'PY' | tee -a "$OUT/coverage.log"
import glob, json, sys
case, path, rc, wall = sys.argv[1:5]
try:
    doc = json.load(open(path))
except (OSError, ValueError) as exc:
    sys.exit(print(f"{case} | no JSON report ({type(exc).__name__}) | rc {rc} | wall {wall} s"))
timing = next((it for it in doc["items"] if it["gate"] == "timing"), {})
fig = timing.get("figures") or {}
per = fig.get("leak_bytes_per_call", fig.get("memory_bytes_per_call"))
print(f"{case} | timing {timing.get('status')} | exit {doc['exit_code']} (rc {rc}) | bytes/call "
      f"{per if per is None else round(per)} | peak bytes {fig.get('peak_call_bytes')} | basis "
      f"{fig.get('memory_basis')} | wall {wall} s")
for it in doc["items"]:
    text = (it.get("message") or it.get("summary") or "").replace("\n", " ")
    print(f"{case} |   {it['nodeid'].split('::', 1)[1]} | {it['status']} | {text[:240]}")
for f in sorted(glob.glob(f"{doc['outdir']}/**/bench.json", recursive=True)):
    m = json.load(open(f)).get("memory") or {}
    print(f"{case} |   memory: check {m.get('check')}, leak {m.get('leak')}, basis {m.get('basis')} "
          f"({m.get('basis_note')}), readings {m.get('readings')}, held {m.get('held_bytes')}, growth "
          f"{m.get('growth_bytes')}, halves {m.get('halves_bytes')}, per {m.get('per')}, torch {m.get('torch')}, "
          f"peak_call {m.get('peak_call')}")
    print(f"{case} |   points [samples, calls, bytes]: {m.get('points')}")
    b = json.load(open(f)); kt = b.get("kernel_time") or {}
    print(f"{case} |   timing: basis {b.get('timing_basis')}, median {b.get('median_ms')} ms, events "
          f"{(b.get('events') or {}).get('median_ms')} ms, cupti {kt.get('median_us')} us, host_work_ms "
          f"{b.get('host_work_ms')}, idle_median_us {kt.get('idle_median_us')}, host_inside_median_us "
          f"{kt.get('host_inside_median_us')}, suspect {b.get('suspect')}")
PY
}
for s in ${*:-leak_cu twin_cu leak_triton}; do
  case $s in
    leak_cu) kernel=$CASES/leak_malloc.cu ;;
    twin_cu) kernel=$CASES/scratch_malloc.cu ;;
    leak_triton) kernel=$CASES/leak_list.py ;;
    *) echo "unknown case $s"; continue ;;
  esac
  t0=$(date +%s)
  timeout 200 python3 -m pytest $K "${KSEL[@]}" --kopt-baseline $kernel --kopt-ref $CASES/ref.py --kopt-dims n=524288 \
    --kopt-outdir /tmp/kcov/$s --kopt-json "$OUT/coverage_$s.json" > "$OUT/coverage_$s.log" 2>&1
  rc=$?
  report "$s" "$OUT/coverage_$s.json" "$rc" "$(( $(date +%s) - t0 ))"
done
