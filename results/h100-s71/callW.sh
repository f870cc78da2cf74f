#!/usr/bin/env bash
# Session 71: the layer sweep (with traces) and the step sweep at main with down_early on.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
OUT=$OUT T_SWEEP=170 T_STEPSWEEP=360 bash tools/gpu_session.sh sweep stepsweep 2>&1 | tail -40
echo "done at $((SECONDS-T0)) s"
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
