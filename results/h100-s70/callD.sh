#!/usr/bin/env bash
# Session 70: traced steps (4 layers at 32x8) of F16K hbuf ("new") and main ("base"), two
# runs each alternated, for gpuvm trace --against: which op's phase moved.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; OUT=$(cd $OUT 2>/dev/null && pwd || (mkdir -p $OUT && cd $OUT && pwd)); mkdir -p $OUT/lt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M=/tmp/gvm_tree_base; rm -rf $M; mkdir -p $M; tar cf - --exclude=./results --exclude=./ab . | tar xf - -C $M
for f in ab/base/*%*; do cp "$f" "$M/$(basename "$f" | sed 's|%|/|g')"; done
for d in $PWD $M; do (cd $d && PYTHONPATH=$d timeout 200 python3 tools/prebuild.py --trace base > $OUT/prebuild_$(basename $d).log 2>&1) & done; wait
tail -1 $OUT/prebuild_*.log; echo "built at $((SECONDS-T0)) s"
for r in 1 2; do for sh in 32x8; do for t in new base; do
  [ $((SECONDS-T0)) -lt 330 ] || break 3
  d=$PWD; [ $t = base ] && d=$M
  (cd $d && PYTHONPATH=$d timeout 90 python3 tools/step_trace.py --layers 4 --shape $sh --out $OUT/lt/st-$sh-$t-$r.npz > $OUT/lt/st-$sh-$t-$r.log 2>&1); echo "$sh $t $r rc=$? at $((SECONDS-T0)) s"; grep -i "step\b\|us" $OUT/lt/st-$sh-$t-$r.log | head -3
done; done; done
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
