#!/usr/bin/env bash
# Session 72: heavy experts' items at half the cap as instruction args (Tiles.expert_heavy_up / _down,
# the lists' a6; one kernel): the new GPU tests, two rounds of the 128/256-token layers and steps;
# then traced 8-layer steps 1x8 and 16x1 in dynamic and static mode, and both modes timed once more.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python3 tools/prebuild.py base > $OUT/prebuild.log 2>&1; tail -1 $OUT/prebuild.log; echo "built at $((SECONDS-T0)) s"
timeout 120 python3 -m pytest -q tests/gpu/test_muse_layer.py -k "heavy or early" > $OUT/tests_heavy.log 2>&1; echo "tests rc=$? at $((SECONDS-T0)) s"; tail -3 $OUT/tests_heavy.log
L="base:,hvup:expert_heavy_up=64+expert_cap_up_few_tokens=256,hv:expert_heavy_up=64+expert_heavy_down=64+expert_cap_up_few_tokens=256,hvup32:expert_heavy_up=32+expert_cap_up_few_tokens=256"
for r in 1 2; do
  l=$L; [ $r = 2 ] && l=$(tr ',' '\n' <<< "$L" | tac | paste -sd, -)
  timeout 170 python3 tools/sched_probe.py --out $OUT/heavy_r$r.json --modes dynamic --depths 1 --variants base: --tiles "$l" \
    --cases full-c32-t8,sliding-c32-t8,full-c16-t8,sliding-c16-t8 --step 32x8,16x8 > $OUT/heavy_r$r.log 2>&1
  echo "heavy round $r rc=$? at $((SECONDS-T0)) s"; grep "us$" $OUT/heavy_r$r.log | tail -24
done
mkdir -p $OUT/st
for s in 1x8 16x1; do for m in dynamic static; do
  timeout 60 python3 tools/step_trace.py --layers 8 --shape $s --mode $m --out $OUT/st/step-trace-$s-$m.npz > $OUT/st/step_trace_$s-$m.log 2>&1
  echo "trace $s $m rc=$? at $((SECONDS-T0)) s"
done; done
timeout 100 python3 tools/sched_probe.py --out $OUT/modes.json --modes dynamic,static --depths 1 --variants base: --step 1x8,16x1 --cases sliding-c1-t8 > $OUT/modes.log 2>&1
echo "modes rc=$? at $((SECONDS-T0)) s"; grep "us$" $OUT/modes.log | tail -6
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
