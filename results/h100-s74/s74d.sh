#!/usr/bin/env bash
# Session 74, H100, second call: the stack ("new": descriptors in the group's slot with the loop state a
# word a warp, so that the block stays at 196 KB of shared memory; UP's end of item behind one fence; the
# counter poll's two loads together; the walk's ranking from ballots), the last three alone ("small3")
# and main, trees alternated (new main small3 small3 main new) on one-token layers, full-c32-t8 and
# steps 1x1, 1x8; then tests/gpu and the one-token expert timeline on new.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OUT=$OUT AB_SHAPES=none AB_CASES=full-c1-t1,sliding-c1-t1,full-c32-t8 AB_STEPS=1x1,1x8 T_AB_PROBE=80 bash tools/gpu_session.sh trees
echo "trees done at $((SECONDS-T0)) s"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu > $OUT/tests_gpu.log 2>&1; echo "tests/gpu rc=$? at $((SECONDS-T0)) s"; tail -3 $OUT/tests_gpu.log
left=$((${DEADLINE:-430} - (SECONDS - T0)))
[ $left -gt 40 ] && { timeout $left python3 tools/step_trace.py --layers 16 --shape 1x1 --timeline --out $OUT/tl-1x1.npz > $OUT/tl-1x1.log 2>&1; echo "timeline rc=$? at $((SECONDS-T0)) s"; tail -14 $OUT/tl-1x1.log; rm -f $OUT/tl-1x1.npz; }
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
