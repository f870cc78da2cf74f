#!/usr/bin/env bash
# Session 74, H100: the stack ("new": operands' descriptors in the group's slot, UP's end of item behind
# one fence, the counter poll's two loads together, the walk's ranking from ballots) and its first part
# alone ("desc", desc-shared) against main, trees alternated (new desc main main desc new) on the
# one-conversation layers and steps; then (time left) tests/gpu on new.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OUT=$OUT AB_SHAPES=none AB_CASES=full-c1-t1,sliding-c1-t1 AB_STEPS=1x1,1x8 T_AB_PROBE=70 bash tools/gpu_session.sh trees
echo "trees done at $((SECONDS-T0)) s"
left=$((${DEADLINE:-585} - (SECONDS - T0)))
[ $left -gt 60 ] && { timeout $left python3 -m pytest -q -x -p no:cacheprovider tests/gpu > $OUT/tests_gpu.log 2>&1; echo "tests/gpu rc=$? at $((SECONDS-T0)) s"; tail -3 $OUT/tests_gpu.log; }
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
