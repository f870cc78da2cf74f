#!/usr/bin/env bash
# Session 73, H100, the last ~300 s: DOWN's walk with its experts' up-row counts read beside the meta
# reads (one round trip instead of a second after the ranking; the one-token timeline at main showed
# DOWN's walk 2.2 us against UP's 1.8) against main (ab/main), trees alternated (new, main, main, new)
# on one-conversation layers and steps, then tests/gpu's layer tests on the new tree, then (time left) the
# one-token timeline without the walk's ranking (GVM_EXP_LPT=0).
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OUT=$OUT AB_SHAPES=none AB_CASES=full-c1-t1,sliding-c1-t1 AB_STEPS=1x1,1x8 T_AB_PROBE=60 bash tools/gpu_session.sh trees
echo "trees done at $((SECONDS-T0)) s"
left=$((${DEADLINE:-250} - (SECONDS - T0)))
[ $left -gt 30 ] && { timeout $left python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_muse_layer.py > $OUT/tests_layer.log 2>&1; echo "layer tests rc=$? at $((SECONDS-T0)) s"; tail -3 $OUT/tests_layer.log; }
left=$((${DEADLINE:-250} - (SECONDS - T0)))
[ $left -gt 45 ] && { timeout $left python3 tools/step_trace.py --layers 16 --shape 1x1 --timeline --define GVM_EXP_LPT=0 --out $OUT/tl-1x1-lpt0.npz > $OUT/tl-1x1-lpt0.log 2>&1; echo "timeline lpt0 rc=$? at $((SECONDS-T0)) s"; tail -4 $OUT/tl-1x1-lpt0.log; rm -f $OUT/tl-1x1-lpt0.npz; }
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
