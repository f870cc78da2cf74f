#!/usr/bin/env bash
# Session 71: with the early down list on, the up list's items at 128 rows (its tail no longer idles
# the groups) and the down list's at 64 (a shorter tail before the combine), against the defaults;
# then static against dynamic at steps 1x8 and 16x1, twice.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python3 tools/prebuild.py base > $OUT/prebuild.log 2>&1; tail -2 $OUT/prebuild.log; echo "built at $((SECONDS-T0)) s"
for r in 1 2; do
  l="base:,capup:expert_cap_up=128,capdown:expert_cap_down=64"; [ $r = 2 ] && l="capdown:expert_cap_down=64,capup:expert_cap_up=128,base:"
  timeout 150 python3 tools/sched_probe.py --out $OUT/caps_r$r.json --modes dynamic --depths 1 --variants base: --tiles "$l" \
    --cases full-c32-t8,sliding-c32-t8,full-c16-t8,sliding-c16-t8,full-c32-t1,full-c16-t1 --step 32x8,16x8 > $OUT/caps_r$r.log 2>&1
  echo "caps round $r rc=$? at $((SECONDS-T0)) s"; grep "us$" $OUT/caps_r$r.log | tail -24
done
for r in 1 2; do
  timeout 120 python3 tools/sched_probe.py --out $OUT/modes_r$r.json --modes dynamic,static --depths 1 --variants base: \
    --cases sliding-c1-t8 --step 1x8,16x1 > $OUT/modes_r$r.log 2>&1
  echo "modes round $r rc=$? at $((SECONDS-T0)) s"; grep "us$" $OUT/modes_r$r.log | tail -6
done
