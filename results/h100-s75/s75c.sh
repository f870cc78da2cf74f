#!/usr/bin/env bash
# Session 75, second call: main against prepared/claim-first alone (both lost 1.7% on full-c32-t8; the
# seen read's early ballot is the suspect), two rounds, one-token layer, full-c32-t8, steps 1x1, 1x8.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
OUT=$OUT AB_SHAPES=none AB_CASES=full-c1-t1,full-c32-t8 AB_STEPS=1x1,1x8 T_AB_PROBE=60 timeout ${DEADLINE:-250} bash tools/gpu_session.sh trees
echo "trees done at $((SECONDS-T0)) s"
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
