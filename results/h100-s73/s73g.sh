#!/usr/bin/env bash
# Session 73, H100 at main (611ad45's code), with the last ~400 s of device time: the one-token expert
# items' timeline in a 16-layer 1x1 step (GVM_EXPR_PROBE=2048; last measured in session 32 at ed22b9c),
# and traced 8-layer 1x8 steps in both modes (static still ran 1x8 0.35% faster in the tables).
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 120 python3 tools/step_trace.py --layers 16 --shape 1x1 --timeline --out $OUT/tl-1x1.npz > $OUT/tl-1x1.log 2>&1; echo "timeline rc=$? at $((SECONDS-T0)) s"; tail -8 $OUT/tl-1x1.log
for m in dynamic static; do
  left=$((${DEADLINE:-270} - (SECONDS - T0))); [ $left -lt 30 ] && break
  timeout $left python3 tools/step_trace.py --layers 8 --shape 1x8 --mode $m --out $OUT/st-1x8-$m.npz > $OUT/st-1x8-$m.log 2>&1; echo "1x8 $m rc=$? at $((SECONDS-T0)) s"
done
python3 -m gpuvm trace $OUT/st-1x8-dynamic.npz --against $OUT/st-1x8-static.npz 2>&1 | head -60
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
