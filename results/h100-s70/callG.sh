#!/usr/bin/env bash
# Session 70: the expert lists' walk order, GVM_EXP_LPT 3 (each path's experts by tokens, interleaved) against
# 2 (by chunks, the default) and 1 (by tokens): two rounds of the 128/256-token layers and steps 32x8, 16x8
# (the second in reverse order), then traced 4-layer 16x8 steps of 3 for the lists' medians and tails.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT/lt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python3 tools/prebuild.py base GVM_EXP_LPT=3 GVM_EXP_LPT=1 > $OUT/prebuild.log 2>&1; tail -3 $OUT/prebuild.log; echo "built at $((SECONDS-T0)) s"
(timeout 150 python3 tools/prebuild.py --trace base GVM_EXP_LPT=3 > $OUT/prebuild_trace.log 2>&1) &
for r in 1 2; do
  l="ch:,mix:GVM_EXP_LPT=3,tok:GVM_EXP_LPT=1"; [ $r = 2 ] && l="tok:GVM_EXP_LPT=1,mix:GVM_EXP_LPT=3,ch:"
  timeout 170 python3 tools/sched_probe.py --out $OUT/order_r$r.json --modes dynamic --depths 1 --variants "$l" \
    --cases full-c16-t8,sliding-c16-t8,full-c32-t8,sliding-c32-t8 --step 32x8,16x8 > $OUT/order_r$r.log 2>&1; echo "order round $r rc=$? at $((SECONDS-T0)) s"; grep "us$" $OUT/order_r$r.log | tail -18
done
wait
for r in 1 2; do for v in 3 2; do
  [ $((SECONDS-T0)) -lt 430 ] || break 2
  d=""; [ $v = 3 ] && d="--define GVM_EXP_LPT=3"
  timeout 40 python3 tools/step_trace.py --layers 4 --shape 16x8 $d --out $OUT/lt/st-16x8-lpt$v-$r.npz > $OUT/lt/st-16x8-lpt$v-$r.log 2>&1; echo "trace lpt $v round $r rc=$? at $((SECONDS-T0)) s"
done; done
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
