#!/usr/bin/env bash
# Session 73 on an H100 at main (the code of 10bde3e: lazy GEMM tiles up to 16 tokens): tests/gpu, the
# layer sweep with traces and the step sweep (the README's H100 tables).
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OUT=$OUT T_GPUTESTS=150 T_SWEEP=170 T_STEPSWEEP=300 bash tools/gpu_session.sh gputests sweep stepsweep
echo "tables done at $((SECONDS-T0)) s"
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
