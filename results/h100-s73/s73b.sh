#!/usr/bin/env bash
# Session 73: tests/gpu with DOWN's register path waiting for its expert's up rows after its first
# weight copies (GVM_EXP_AWAIT_LATE 1, the new default), then two rounds in swapped order of
# await late / early (the old order) x tilings: base, w132 (132 up and 132 down workers, so the early
# down list holds groups of its own), wu132 (132 up workers only); one-conversation and 16x1 cases.
cd "$(dirname "$0")/.."
T0=$SECONDS
export GVM_COMMIT=$(cat ab/commit) GPUVM_COMMIT=$(cat ab/commit) PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
OUT=$OUT T_GPUTESTS=150 bash tools/gpu_session.sh gputests
echo "tests done at $((SECONDS-T0)) s"
T="base:,w132:expert_workers_up=132+expert_workers_down=132,wu132:expert_workers_up=132"
V="late:,early:GVM_EXP_AWAIT_LATE=0+tiles=base/w132"
for r in 1 2; do
  left=$((${DEADLINE:-585} - (SECONDS - T0))); [ $left -lt 40 ] && break
  t=$T; [ $r = 2 ] && t=$(tr ',' '\n' <<< "$T" | tac | paste -sd, -)
  timeout $left python3 tools/sched_probe.py --out $OUT/aw_r$r.json --modes dynamic --depths 1 --variants "$V" --tiles "$t" \
    --cases full-c1-t1,sliding-c1-t1,full-c1-t8,full-c16-t1 --step 1x1,1x8,16x1 > $OUT/aw_r$r.log 2>&1
  echo "round $r rc=$? at $((SECONDS-T0)) s"; grep "us$" $OUT/aw_r$r.log | tail -40
done
t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed at $((SECONDS-T0)) s"
