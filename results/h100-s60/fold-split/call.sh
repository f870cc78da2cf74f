#!/usr/bin/env bash
# Session 60 call 2: the GEMM stream on four trees, then one- and 8-token layers: split form (this tree), fold off, main.
set -uo pipefail
export GPUVM_CACHE=/tmp/gpuvm-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
R=$PWD
(cd ab/t-split && PYTHONPATH=$PWD python3 tools/prebuild.py base GVM_GEMM_FOLD=0 > $OUT/prebuild_split.log 2>&1) &
(cd ab/t-main && PYTHONPATH=$PWD python3 tools/prebuild.py base > $OUT/prebuild_main.log 2>&1) &
timeout 300 python3 tools/stream_trees.py ab/t-9ddf049 ab/t-main ab/t-split ab/t-nofold --rounds 2 --out $OUT/stream_trees.json > $OUT/stream_trees.log 2>&1
echo "stream_trees rc=$?"; grep round $OUT/stream_trees.log
wait; tail -2 $OUT/prebuild_*.log
(cd ab/t-split && PYTHONPATH=$PWD timeout 100 python3 tools/ops_check.py --only gemm > $OUT/ops_gemm.log 2>&1; echo "ops_check gemm rc=$?"; tail -2 $OUT/ops_gemm.log)
C=${CASES:-full-c1-t1,sliding-c1-t1,full-c1-t8,full-c16-t1}; S=${STEPS:-1x1,1x8}
for r in 1 2; do
  o="split main"; [ $r = 2 ] && o="main split"
  for t in $o; do
    [ $t = split ] && v="split:,nofold:GVM_GEMM_FOLD=0" || v="main:"
    [ $r = 2 ] && [ $t = split ] && v="nofold:GVM_GEMM_FOLD=0,split:"
    (cd ab/t-$t && PYTHONPATH=$PWD timeout 200 python3 tools/sched_probe.py --out $OUT/probe_${t}_r$r.json --modes dynamic --depths 1 --variants "$v" --cases $C --step $S > $OUT/probe_${t}_r$r.log 2>&1; echo "probe $t r$r rc=$?"; grep dynamic $OUT/probe_${t}_r$r.log | tail -12)
  done
done
cd $OUT && tar czf all.tgz *.log *.json && ls
