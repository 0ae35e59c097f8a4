#!/usr/bin/env bash
# Issue #37's acceptance on the device machine: an agent (benchmarks/drive_loop.py, plan
# benchmarks/drive_plans/transpose_h200.py) drives the loop on an fp32 transpose it has not met before, from the JSON
# report alone: three iterations closed, then finish; then the walkthrough is generated from the run's files.
# Usage, repository root:
#   bash benchmarks/h200_drive.sh            a fresh drive (the work folder .kopt/drive/transpose is made anew)
#   bash benchmarks/h200_drive.sh resume     go on from the last report (after a call cut off by its time limit,
#                                            on the same warm machine: .kopt/ is kept between calls)
# Prints each step (exit code, wall s, stage, next action, message), then the walkthrough's closing note. $OUT gets
# drive.tgz (the work folder: steps.jsonl, the reports, the run directory), loop-walkthrough.md and its assets.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kopt-out}
W=.kopt/drive/transpose
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
ls .wheels/*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-deps --no-index .wheels/*.whl >>"$OUT/install.log" 2>&1
if [ "${1:-}" = resume ]; then
  resume=--resume
else
  resume=
  rm -rf "$W"
fi
# the device's 10-minute limit per call: stop the drive in time to pack what it did (resume goes on from there)
timeout "${DRIVE_TIMEOUT:-520}" python3 benchmarks/drive_loop.py "$W" --plan benchmarks/drive_plans/transpose_h200.py $resume
rc=$?
tar czf "$OUT/drive.tgz" --exclude='*.lock' --exclude='*.so' .kopt/drive
python3 benchmarks/walkthrough.py "$W" --title "The loop driven as an agent drives it (H200, transpose 8192x8192)" \
  --assets "$OUT/walkthrough" --out "$OUT/loop-walkthrough.md"
sed -n '/^## Closing note/,$p' "$OUT/loop-walkthrough.md"
echo "drive rc=$rc"
