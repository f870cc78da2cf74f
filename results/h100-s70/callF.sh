#!/usr/bin/env bash
# Session 70: traced 4-layer 16x8 steps (layers 1 and 3 full) with the expert lists walked by chunks
# (GVM_EXP_LPT 2, the default) and by tokens (1), alternated, four of each: session 68's question
# of why by tokens costs full-c16-t8 ~1.3%, read from the lists' phases and tails by layer.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT/lt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python3 tools/prebuild.py --trace base GVM_EXP_LPT=1 > $OUT/prebuild.log 2>&1; tail -2 $OUT/prebuild.log; echo "built at $((SECONDS-T0)) s"
for r in 1 2 3 4; do for v in 2 1; do
  [ $((SECONDS-T0)) -lt 400 ] || break 2
  d=""; [ $v = 1 ] && d="--define GVM_EXP_LPT=1"
  timeout 60 python3 tools/step_trace.py --layers 4 --shape 16x8 $d --out $OUT/lt/st-16x8-lpt$v-$r.npz > $OUT/lt/st-16x8-lpt$v-$r.log 2>&1; echo "lpt $v round $r rc=$? at $((SECONDS-T0)) s"
done; done
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
