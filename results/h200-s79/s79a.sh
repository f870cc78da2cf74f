#!/usr/bin/env bash
# Session 79, first call. On an H200 (none since session 67): the layer sweep and the
# step sweep at main (the README's H200 tables). On an H100: ops_check on the GPU of the ops not
# checked there since session 74 (expert_down, expert_combine, gemm), with the new case inputs.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader); echo "$gpu"
if [[ $gpu == *H200* ]]; then
  D=${DEADLINE:-585}
  OUT=$OUT T_SWEEP=$(( D < 330 ? D - 15 : 300 )) bash tools/gpu_session.sh sweep
  left=$(( D - (SECONDS - T0) ))
  if [ $left -ge 330 ]; then OUT=$OUT T_STEPSWEEP=$(( left - 10 )) bash tools/gpu_session.sh stepsweep
  elif [ $left -ge 120 ]; then OUT=$OUT T_STEPSWEEP=$(( left - 10 )) STEPSWEEP_ARGS="--conversations 1 --tokens 1,8" bash tools/gpu_session.sh stepsweep
  else echo "no time for the step sweep ($left s)"; fi
  OUT=$OUT bash tools/gpu_session.sh pack
else
  for o in expert_down,expert_combine gemm; do
    timeout $(( (${DEADLINE:-585} - 30) / 2 )) python3 tools/ops_check.py --only $o > $OUT/ops_${o%%,*}.log 2>&1; echo "ops_check $o rc=$? at $((SECONDS-T0)) s"
    grep -cE " ok *$" $OUT/ops_${o%%,*}.log; grep -E "FAIL|ALL|rror|spill" $OUT/ops_${o%%,*}.log | head -12; tail -3 $OUT/ops_${o%%,*}.log
  done
  t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"
fi
echo "done at $((SECONDS-T0)) s"
