#!/usr/bin/env bash
# Session 73 (H100, main 7101dbc): every dense GEMM tile lazy at every token count (Tiles.lazy_gemm_tokens
# 256) against main (16), one kernel, two rounds in swapped order, on the 32- to 256-token layers and steps.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T="base:,lazy:lazy_gemm_tokens=256"
for r in 1 2; do
  left=$((${DEADLINE:-585} - (SECONDS - T0))); [ $left -lt 40 ] && break
  t=$T; [ $r = 2 ] && t=$(tr ',' '\n' <<< "$T" | tac | paste -sd, -)
  timeout $left python3 tools/sched_probe.py --out $OUT/lazy256_r$r.json --modes dynamic --depths 1 --variants base: --tiles "$t" \
    --cases full-c32-t8,sliding-c32-t8,full-c16-t8,sliding-c16-t8,full-c32-t1 --step 32x8,16x8,32x1 > $OUT/lazy256_r$r.log 2>&1
  echo "round $r rc=$? at $((SECONDS-T0)) s"; grep "us$" $OUT/lazy256_r$r.log | tail -16
done
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
