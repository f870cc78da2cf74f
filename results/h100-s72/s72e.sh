#!/usr/bin/env bash
# Session 72 at main (heavy up experts at 64, 128-row up items): tests/gpu, the layer sweep with traces
# and the step sweep (the README's tables); then, with the time left, one kernel, every dense GEMM tile
# lazy (Tiles.lazy_gemm 1: held claims left a second wave on one-wave Wo / Wqkvg phases in the traced
# steps 1x8 and 16x1) against main (2), two rounds in swapped order.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OUT=$OUT T_GPUTESTS=150 T_SWEEP=170 T_STEPSWEEP=300 bash tools/gpu_session.sh gputests sweep stepsweep
echo "tables done at $((SECONDS-T0)) s"
L="base:,lazy:lazy_gemm=1"
for r in 1 2; do
  left=$((${DEADLINE:-580} - (SECONDS - T0))); [ $left -lt 40 ] && break
  l=$L; [ $r = 2 ] && l="lazy:lazy_gemm=1,base:"
  timeout $left python3 tools/sched_probe.py --out $OUT/lazy_r$r.json --modes dynamic --depths 1 --variants base: --tiles "$l" \
    --cases full-c1-t1,sliding-c1-t8,full-c16-t1 --step 1x8,16x1,1x1,32x1 > $OUT/lazy_r$r.log 2>&1
  echo "lazy round $r rc=$? at $((SECONDS-T0)) s"; grep "us$" $OUT/lazy_r$r.log | tail -14
done
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
