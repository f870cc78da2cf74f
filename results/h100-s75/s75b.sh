#!/usr/bin/env bash
# Session 75 (device time short after failed starts): tests/gpu on main first (1c78832's tensor-less
# instructions, the ranking's if/else and the offsetof guard have not run on a GPU), then main against
# prepared/both (claim atomic and meta reads before the inline argument check, DOWN's seen counts right
# after it), trees alternated in two rounds on one-token layers, full-c32-t8 and steps 1x1, 1x8.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu -rA > $OUT/tests_gpu.log 2>&1; echo "tests/gpu rc=$? at $((SECONDS-T0)) s"; grep -aE "us per empty|TB/s =|passed|failed" $OUT/tests_gpu.log | tail -8
OUT=$OUT AB_SHAPES=none AB_CASES=full-c1-t1,sliding-c1-t1,full-c32-t8 AB_STEPS=1x1,1x8 T_AB_PROBE=70 timeout $((${DEADLINE:-480} - (SECONDS - T0))) bash tools/gpu_session.sh trees
echo "trees done at $((SECONDS-T0)) s"
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
