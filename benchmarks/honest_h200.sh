#!/usr/bin/env bash
# Issue #41 on the GPU: kernels written as people write them pass as written. Cases from
# benchmarks/honest_cases/, each one session through every gate, one line per item plus the timing figures:
#   cub       a .cu that includes CUB (BlockLoad, BlockReduce): sass PASSED, CUB's EmptyKernel<void> listed as a
#             library kernel, not EMPTY_KERNEL
#   scan      a recursive Blelloch scan whose solve() cudaMalloc's and cudaFree's per call: timing PASSED on the
#             events basis with host_work_ms and idle_median_us, not SUSPECT
#   gpumode   a GPU MODE problem with 5 benchmark shapes (Triton submission): every gate within 60 s, each shape's
#             stop_reason (converged / budget / capped)
#   l2        a gather of >= 0.1 ms whose 8 rotating input sets fit in the L2 (the side-stream probe runs them warm,
#             the timed calls after a flush): timing PASSED, its probe/events ratio above the 0.8 rule
# Usage (device machine, repository root): bash benchmarks/honest_h200.sh [cub] [scan] [gpumode] [l2]; logs in $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kopt-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
HC=benchmarks/honest_cases
K="-p no:randomly -p no:cacheprovider"
report() {  # case, JSON report, session rc, wall s
  python3 - "$@" <<'PY' | tee -a "$OUT/honest.log"
import glob, json, sys
case, path, rc, wall = sys.argv[1:5]
try:
    doc = json.load(open(path))
except (OSError, ValueError) as exc:
    sys.exit(print(f"{case} | no JSON report ({type(exc).__name__}) | rc {rc} | wall {wall} s"))
print(f"{case} | exit {doc['exit_code']} (rc {rc}) | wall {wall} s")
for it in doc["items"]:
    text = (it.get("message") or it.get("summary") or "").replace("\n", " ")
    print(f"{case} | {it['nodeid'].split('::', 1)[1]} | {it['status']} | {it.get('duration_s')} s | {text[:260]}")
for f in sorted(glob.glob(f"{doc['outdir']}/**/bench.json", recursive=True)):
    b = json.load(open(f)); kt = b.get("kernel_time") or {}
    print(f"{case} |   {f.split(doc['outdir'])[-1]}: basis {b.get('timing_basis')}, median {b.get('median_ms')} ms, "
          f"events {(b.get('events') or {}).get('median_ms')} ms, host_work_ms {b.get('host_work_ms')}, "
          f"idle_median_us {kt.get('idle_median_us')}, host_inside_median_us {kt.get('host_inside_median_us')}, cupti {kt.get('median_us')} us ({kt.get('backend')}, "
          f"{kt.get('batches')} batches, {kt.get('profile_s')} s), stop {b.get('stop_reason')}, "
          f"shapes {[(r['label'], r.get('stop_reason')) for r in b.get('shapes') or []]}, probes "
          f"{b.get('host_probes_ms')} ms, rotating_sets {(b.get('timing_method') or {}).get('rotating_sets')}, "
          f"suspect {b.get('suspect')}")
PY
}
for s in ${*:-cub scan gpumode}; do
  t0=$(date +%s)
  case $s in
    cub) timeout 300 python3 -m pytest $K --kopt-baseline $HC/cub_blocksum.cu --kopt-ref $HC/cub_blocksum_ref.py \
           --kopt-dims n=4194304 --kopt-json "$OUT/honest_cub.json" > "$OUT/honest_cub.log" 2>&1 ;;
    scan) timeout 300 python3 -m pytest $K --kopt-baseline $HC/scan_malloc.cu --kopt-ref $HC/scan_malloc_ref.py \
            --kopt-dims N=1048576 --kopt-json "$OUT/honest_scan.json" > "$OUT/honest_scan.log" 2>&1 ;;
    gpumode) timeout 300 python3 -m pytest $K --kopt-baseline $HC/gpumode_rowsum/submission.py \
               --kopt-ref $HC/gpumode_rowsum/reference.py --kopt-json "$OUT/honest_gpumode.json" \
               > "$OUT/honest_gpumode.log" 2>&1 ;;
    l2) timeout 300 python3 -m pytest $K --kopt-baseline $HC/l2_passes.cu --kopt-ref $HC/l2_passes_ref.py \
          --kopt-dims N=524288,P=512 --kopt-json "$OUT/honest_l2.json" > "$OUT/honest_l2.log" 2>&1 ;;
    *) echo "unknown section $s"; continue ;;
  esac
  rc=$?
  report "$s" "$OUT/honest_$s.json" "$rc" "$(( $(date +%s) - t0 ))"
done
