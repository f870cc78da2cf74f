#!/usr/bin/env bash
# Session 71: Tiles.down_early (the down list started once the up list's items are all taken, each item
# waiting for its expert's up rows) against the default, one kernel: its GPU tests, then two alternated
# rounds of the layers and steps.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python3 tools/prebuild.py base > $OUT/prebuild.log 2>&1; tail -2 $OUT/prebuild.log; echo "built at $((SECONDS-T0)) s"
timeout 120 python3 -m pytest -q tests/gpu/test_muse_layer.py -k "early or code_warmer" > $OUT/tests_early.log 2>&1; echo "early tests rc=$? at $((SECONDS-T0)) s"; tail -3 $OUT/tests_early.log
for r in 1 2; do
  l="base:,early:down_early=1"; [ $r = 2 ] && l="early:down_early=1,base:"
  left=$((585 - (SECONDS - T0))); lim=$(( r == 1 ? (left - 10) / 2 : left - 10 ))
  timeout $lim python3 tools/sched_probe.py --out $OUT/early_r$r.json --modes dynamic --depths 1 --variants base: --tiles "$l" \
    --cases full-c32-t8,sliding-c32-t8,full-c16-t8,sliding-c16-t8,full-c16-t1,full-c1-t1 --step 32x8,16x8 > $OUT/early_r$r.log 2>&1
  echo "round $r rc=$? at $((SECONDS-T0)) s"; grep "us$\|ms$" $OUT/early_r$r.log | tail -20
done
