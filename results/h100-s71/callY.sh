#!/usr/bin/env bash
# Session 71: tests/gpu at main (the up list's few-token cap on by default).
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 60 python3 tools/prebuild.py base > $OUT/prebuild.log 2>&1; tail -1 $OUT/prebuild.log; echo "built at $((SECONDS-T0)) s"
timeout 150 python3 -m pytest -q tests/gpu > $OUT/tests_gpu.log 2>&1; echo "tests/gpu rc=$? at $((SECONDS-T0)) s"; tail -4 $OUT/tests_gpu.log
