#!/usr/bin/env bash
# Session 60 call 3: the predicated zero-fill loads in the bf16 unit (t-pred1; t-pred also with the split units loop)
# against main: the GEMM stream on four trees, ops_check gemm, then layers and steps, trees alternated.
set -uo pipefail
export GPUVM_CACHE=/tmp/gpuvm-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for t in pred2 main; do (cd ab/t-$t && PYTHONPATH=$PWD python3 tools/prebuild.py base > $OUT/prebuild_$t.log 2>&1) & done
timeout 300 python3 tools/stream_trees.py ab/t-9ddf049 ab/t-main ab/t-pred1 ab/t-pred2 --rounds 2 --out $OUT/stream_trees.json > $OUT/stream_trees.log 2>&1
echo "stream_trees rc=$?"; grep round $OUT/stream_trees.log
wait; for t in pred2 main; do tail -1 $OUT/prebuild_$t.log; done
(cd ab/t-pred2 && PYTHONPATH=$PWD timeout 100 python3 tools/ops_check.py --only gemm > $OUT/ops_gemm.log 2>&1; echo "ops_check gemm rc=$?"; tail -1 $OUT/ops_gemm.log)
C=${CASES:-full-c1-t1,sliding-c1-t1,full-c1-t8,full-c16-t1,full-c32-t1}; S=${STEPS:-1x1,1x8}
for t in pred2 main main pred2; do
  n=$((${n:-0} + 1))
  (cd ab/t-$t && PYTHONPATH=$PWD timeout 150 python3 tools/sched_probe.py --out $OUT/probe_${n}_$t.json --modes dynamic --depths 1 --variants "$t:" --cases $C --step $S > $OUT/probe_${n}_$t.log 2>&1; echo "probe $n $t rc=$?"; grep dynamic $OUT/probe_${n}_$t.log | tail -8)
done
cd $OUT && tar czf all.tgz *.log *.json && ls
