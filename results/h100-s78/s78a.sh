#!/usr/bin/env bash
# Session 78, first call. On an H200 (none since session 67): the layer sweep at main (the README's
# H200 table), then ops_check with what is left. On an H100: ops_check on the GPU (every op; the
# gvm_descs alignment fix of session 77 has not run on a GPU), the one-token expert timeline of main
# and of seen-early (DOWN's acquire read of its experts' up-row counts beside the meta reads: the
# walk should be one round trip shorter), then the two trees alternated on one-token layers and 1x1.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader); echo "$gpu"
left() { echo $((${DEADLINE:-575} - (SECONDS - T0))); }
ops() { timeout $1 python3 tools/ops_check.py > $OUT/ops_check.log 2>&1; echo "ops_check rc=$? at $((SECONDS-T0)) s"; grep -cE " ok *$" $OUT/ops_check.log; grep -E "FAIL|ALL|rror" $OUT/ops_check.log | head -12; tail -2 $OUT/ops_check.log; }
if [[ $gpu == *H200* ]]; then
  OUT=$OUT T_SWEEP=$(( $(left) - 100 )) bash tools/gpu_session.sh sweep
  ops $(( $(left) - 5 ))
else
  S=/tmp/gvm_tree_seen; rm -rf $S; mkdir -p $S; tar cf - --exclude=./results --exclude=./ab . | tar xf - -C $S; cp ab/seen/ops%experts.cuh $S/ops/experts.cuh
  (cd $S && PYTHONPATH=$S python3 tools/prebuild.py base trace:GVM_EXPR_PROBE=2048 > $OUT/prebuild_seen.log 2>&1) &
  python3 tools/prebuild.py base trace:GVM_EXPR_PROBE=2048 > $OUT/prebuild_new.log 2>&1 &
  ops 200
  wait; echo "prebuilt at $((SECONDS-T0)) s: $(tail -1 $OUT/prebuild_new.log) / $(tail -1 $OUT/prebuild_seen.log)"
  for t in new seen; do d=$([ $t = new ] && echo $PWD || echo $S)
    (cd $d && PYTHONPATH=$d timeout 90 python3 tools/step_trace.py --layers 16 --shape 1x1 --timeline --out $OUT/tl_$t.npz > $OUT/tl_$t.log 2>&1); echo "timeline $t rc=$? at $((SECONDS-T0)) s"; tail -12 $OUT/tl_$t.log
  done
  (cd $OUT && tar czf timeline.tgz tl_*.npz && rm -f tl_*.npz)
  for r in 1 2; do for t in $([ $r = 1 ] && echo "new seen" || echo "seen new"); do d=$([ $t = new ] && echo $PWD || echo $S)
    [ $(left) -lt 60 ] && break 2
    (cd $d && PYTHONPATH=$d timeout $(( $(left) < 75 ? $(left) : 75 )) python3 tools/sched_probe.py --out $OUT/probe_${r}_$t.json --modes dynamic --depths 1 --variants base: --cases full-c1-t1,sliding-c1-t1 --step 1x1 > $OUT/probe_${r}_$t.log 2>&1); echo "probe $r $t rc=$? at $((SECONDS-T0)) s"; grep dynamic $OUT/probe_${r}_$t.log | tail -4
  done; done
fi
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
