#!/usr/bin/env bash
# Session 70: hbuf as F16K (DOWN's x copied into its tile as it lies, ldmatrix fragments, no
# staging pass) against main. GPU ops_check of both expert ops (shard and small sizes), then
# gpu_session.sh trees: the lists alone and the many-token layers and step 32x8, two rounds.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT; OUT=$(cd $OUT && pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for sz in small; do
  timeout 150 python3 tools/ops_check.py --sizes $sz --only expert_up,expert_down > $OUT/ops_experts_$sz.log 2>&1; echo "ops_check $sz rc=$? at $((SECONDS-T0)) s"; tail -3 $OUT/ops_experts_$sz.log
done
OUT=$OUT AB_SHAPES=${AB_SHAPES:-8x16,32x16,32x32,skew256} AB_CASES=${AB_CASES:-full-c32-t8,sliding-c32-t8,full-c16-t8,sliding-c16-t8,full-c1-t1} \
  AB_STEPS=${AB_STEPS:-32x8,16x8} T_AB_PROBE=${T_AB_PROBE:-110} bash tools/gpu_session.sh trees
echo "probes done at $((SECONDS-T0)) s"
M=/tmp/gvm_tree_base; mkdir -p $OUT/lt
for d in $PWD $M; do (cd $d && PYTHONPATH=$d timeout 100 python3 tools/prebuild.py --trace base > /dev/null 2>&1) & done; wait
for r in 1 2; do for t in new base; do
  [ $((SECONDS-T0)) -lt 540 ] || break 2
  d=$PWD; [ $t = base ] && d=$M
  (cd $d && PYTHONPATH=$d timeout 60 python3 tools/step_trace.py --layers 4 --shape 32x8 --out $OUT/lt/st-32x8-$t-$r.npz > $OUT/lt/st-32x8-$t-$r.log 2>&1); echo "trace $t $r rc=$? at $((SECONDS-T0)) s"
done; done
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
