#!/usr/bin/env bash
# Session 71: down_early on by default: tests/gpu, then the other cases and steps against down_early=0.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python3 tools/prebuild.py base > $OUT/prebuild.log 2>&1; tail -2 $OUT/prebuild.log; echo "built at $((SECONDS-T0)) s"
timeout 260 python3 -m pytest -q tests/gpu > $OUT/tests_gpu.log 2>&1; echo "tests/gpu rc=$? at $((SECONDS-T0)) s"; tail -4 $OUT/tests_gpu.log
for r in 1 2; do
  l="early:,base:down_early=0"; [ $r = 2 ] && l="base:down_early=0,early:"
  left=$((585 - (SECONDS - T0))); lim=$(( r == 1 ? (left - 10) / 2 : left - 10 ))
  [ $lim -gt 40 ] || break
  timeout $lim python3 tools/sched_probe.py --out $OUT/rest_r$r.json --modes dynamic --depths 1 --variants base: --tiles "$l" \
    --cases sliding-c1-t1,full-c1-t8,sliding-c1-t8,sliding-c16-t1,full-c32-t1,sliding-c32-t1 --step 1x1,1x8,32x1 > $OUT/rest_r$r.log 2>&1
  echo "round $r rc=$? at $((SECONDS-T0)) s"; grep "us$" $OUT/rest_r$r.log | tail -20
done
