#!/usr/bin/env bash
# Session 76, first call. On an H200 (none since session 67): tests/gpu and the layer sweep at main
# (the step sweep follows in a second call). On an H100: the step 32x8 that session 75's sweep cut,
# then main against prepared/claim-first traced op by op (4 layers at 32x8: which phase lost 1.3%)
# and the one-token expert timeline of each (16 layers: the argument check's 0.5-0.8 us an item).
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); echo "$gpu"
left() { echo $((${DEADLINE:-560} - (SECONDS - T0))); }
if [[ $gpu == *H200* ]]; then
  timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu -rA > $OUT/tests_gpu.log 2>&1; echo "tests/gpu rc=$? at $((SECONDS-T0)) s"; grep -aE "us per empty|TB/s =|passed|failed" $OUT/tests_gpu.log | tail -8
  OUT=$OUT T_SWEEP=$(( $(left) - 10 )) bash tools/gpu_session.sh sweep
else
  OUT=$OUT T_STEPSWEEP=170 STEPSWEEP_ARGS="--conversations 32 --tokens 8" bash tools/gpu_session.sh stepsweep
  echo "stepsweep done at $((SECONDS-T0)) s"
  OUT=$OUT TT_ROWS=30 timeout $(left) bash tools/gpu_session.sh treetrace
  echo "treetrace done at $((SECONDS-T0)) s"
  for t in new claim; do d=$([ $t = new ] && echo $PWD || echo /tmp/gvm_tree_$t)
    (cd $d && PYTHONPATH=$d timeout $(( $(left) / 2 )) python3 tools/step_trace.py --layers 16 --shape 1x1 --timeline --out $OUT/tl_$t.npz > $OUT/tl_$t.log 2>&1); echo "timeline $t rc=$? at $((SECONDS-T0)) s"; tail -30 $OUT/tl_$t.log
  done
  (cd $OUT && tar czf timeline.tgz tl_*.npz && rm -f tl_*.npz)
fi
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
