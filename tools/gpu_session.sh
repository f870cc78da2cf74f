#!/usr/bin/env bash
# One call on the H200 (the device tool): the VM proofs and timings, the Muse
# ops standalone, and the decode-case sweep, each under its own time limit,
# logs and results under $OUT (at most 8 files come back: traces are tarred).
#   GPUVM_COMMIT=<sha> bash tools/gpu_session.sh [check|fold|ops|opstime|sweep|step|stepsweep|probe|experts|router|park|ring|lists|steptrace|tiles|rowpf|fill|fill2|xstage|trace62|xprobe|smem|tiles2|xbench|against|slots|naps|icache|workers|slices|statsprobe|topkprobe|layertrace|oneop|fusedqk|ringbench|ringprobe|opsgemm|tail|attstop|gputests|vmtest|next|attntail|qksplit|lazygemm|lazyattn|lazyctl|ncuattn|clocks|codewarm|lazyexperts|lazyone|lazyall|toolcheck|gearly|kparts|kpartslayers|glate|glate16|fixed16|dispdepth|shares|cap33|weightcal|bare|refit|stagger|tileprobe|dbl2|heavy|capup|c16t1|ncu|ncusrc|treeab|trees|treetrace|bounds|pfbound|resched|partsprobe|qktok|xdirect|lpt ...]
# (set GPUVM_COMMIT when running a snapshot without .git: else the results name the enclosing checkout)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 GPUVM_CACHE=/tmp/gpuvm-cache
OUT=${OUT:-out}
mkdir -p "$OUT"
steps=${*:-check ops sweep}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -c "import torch, cuda.core; print('torch', torch.__version__, 'cuda.core', cuda.core.__version__)"
# A variant "name:MACRO=v+MACRO=v" of a lists-alone loop: sets n (its name) and args (its --define flags).
variant() { n=${1%%:*}; local d=${1#*:} x; args=(); for x in ${d//+/ }; do args+=(--define "$x"); done; }
# Two sched_probe rounds (dynamic, claim depth 1), the second with the list reversed so
# that a drift over the run shows as a swap: ab_rounds <name> <tiles|variants> <list>
# <timeout s> <sched_probe args>. Writes $OUT/<name>_r{1,2}.{json,log}.
ab_rounds() {
  local name=$1 kind=$2 list=$3 limit=$4 r l
  local -a sel
  shift 4
  for r in 1 2; do
    l=$list
    [ "$r" = 2 ] && l=$(tr ',' '\n' <<< "$list" | tac | paste -sd, -)
    if [ "$kind" = tiles ]; then sel=(--variants base: --tiles "$l"); else sel=(--variants "$l"); fi
    timeout "$limit" python3 tools/sched_probe.py --out "$OUT/${name}_r$r.json" --modes dynamic --depths 1 "${sel[@]}" "$@" > "$OUT/${name}_r$r.log" 2>&1
    echo "$name probe $r rc=$?"; grep -v "^$" "$OUT/${name}_r$r.log" | tail -"${AB_TAIL:-16}"
  done
}

# Tree comparisons (treeab, trees): tree_copy <dir> <file>... makes <dir> this tree with each
# ab file <x>/<dir>%<file> put back at <dir>/<file>; tree_bench <name> <dir> runs the expert
# lists alone there (AB_SHAPES); tree_probe <tag> <dir> the dynamic layers and steps (AB_CASES,
# AB_STEPS). Each writes $OUT/{bench,probe}_<name|tag>.{json,log}.
tree_copy() {
  local M=$1 f; shift
  rm -rf "$M"; mkdir -p "$M"; tar cf - --exclude=./results --exclude=./ab . | tar xf - -C "$M"
  for f in "$@"; do cp "$f" "$M/$(basename "$f" | sed 's|%|/|g')"; done
}
tree_bench() {  # AB_SHAPES=none: no lists alone (a change outside the expert lists)
  [ "${AB_SHAPES:-}" = none ] && return
  (cd "$2" && PYTHONPATH=$2 timeout ${T_AB_BENCH:-100} python3 tools/expert_bench.py --reps 10 --shapes ${AB_SHAPES:-8x16,32x16,32x32,skew256} --out "$OUT/bench_$1.json" > "$OUT/bench_$1.log" 2>&1)
  echo "expert_bench $1 rc=$?"; tail -10 "$OUT/bench_$1.log"
}
tree_probe() {
  (cd "$2" && PYTHONPATH=$2 timeout ${T_AB_PROBE:-170} python3 tools/sched_probe.py --out "$OUT/probe_$1.json" --modes dynamic --depths 1 --variants base: --cases ${AB_CASES:-full-c32-t8,sliding-c32-t8,full-c16-t8,sliding-c16-t8,full-c16-t1} --step ${AB_STEPS:-32x8} ${AB_DRAWS:+--draws $AB_DRAWS} > "$OUT/probe_$1.log" 2>&1)
  echo "probe $1 rc=$?"; grep "dynamic" "$OUT/probe_$1.log" | tail -8
}

# The trees of `trees` and `treetrace`: sets names (new, then each ab/<name>/) and treedir, and makes
# each ab tree's copy under /tmp (tree_copy).
tree_names() {
  names=(new); for d in ab/*/; do [ -d "$d" ] && names+=("$(basename "$d")"); done
  [ ${#names[@]} -gt 1 ] || { echo "$1: no ab/<name>/ (run tools/ab_trees.sh first)"; return 2; }
  for t in "${names[@]:1}"; do tree_copy "$(treedir "$t")" ab/"$t"/*%*; done
}
treedir() { [ "$1" = new ] && echo "$PWD" || echo "/tmp/gvm_tree_$1"; }

for s in $steps; do
  case $s in
    check) timeout ${T_CHECK:-280} python3 tools/gpu_check.py --out "$OUT/gpu_check.json" > "$OUT/gpu_check.log" 2>&1; echo "gpu_check rc=$?"; tail -25 "$OUT/gpu_check.log" ;;
    ops) timeout ${T_OPS:-300} python3 tools/ops_check.py > "$OUT/ops_check.log" 2>&1; echo "ops_check rc=$?"; tail -25 "$OUT/ops_check.log" ;;
    sweep) timeout ${T_SWEEP:-420} python3 -m gpuvm sweep --out "$OUT" --trace ${SWEEP_ARGS:-} > "$OUT/sweep.log" 2>&1; echo "sweep rc=$?"; tail -22 "$OUT/sweep.log"
           (cd "$OUT" && ls trace-*.npz >/dev/null 2>&1 && tar czf traces.tgz trace-*.npz && rm -f trace-*.npz) ;;
    opstime) timeout ${T_OPSTIME:-90} python3 tools/ops_check.py --time 200 > "$OUT/ops_time.log" 2>&1; echo "ops_time rc=$?"; tail -30 "$OUT/ops_time.log" ;;
    step) timeout ${T_STEP:-400} python3 tools/step_check.py --out "$OUT/step.json" ${STEP_ARGS:-} > "$OUT/step.log" 2>&1; echo "step rc=$?"; tail -15 "$OUT/step.log" ;;
    stepsweep) timeout ${T_STEPSWEEP:-580} python3 -m gpuvm sweep --step --out "$OUT/step" ${STEPSWEEP_ARGS:-} > "$OUT/step_sweep.log" 2>&1; echo "step sweep rc=$?"; tail -14 "$OUT/step_sweep.log"
               (cd "$OUT" && [ -d step ] && tar czf step.tgz step && rm -rf step) ;;  # one file back, not three (8 come back a call)
    probe) timeout ${T_PROBE:-270} python3 tools/dispatch_probe.py --out "$OUT/dispatch_probe.json" > "$OUT/dispatch_probe.log" 2>&1; echo "probe rc=$?"; tail -40 "$OUT/dispatch_probe.log" ;;
    experts) # the build switches' defaults against their other settings (GVM_EXPERT_REG, GVM_GEMM_TT, the router's tile): alone, in layers and steps
           timeout ${T_EXPERTS:-100} python3 tools/ops_check.py --sizes small --only expert_up,expert_down,gemm --define GVM_EXPERT_REG=0 --define GVM_GEMM_TT=1 --define GVM_GEMM_F32_RN=4 --define GVM_GEMM_F32_TT=4 > "$OUT/experts_check.log" 2>&1; echo "switches check rc=$?"; tail -2 "$OUT/experts_check.log"
           timeout ${T_SWITCH_LAYERS:-200} python3 -m pytest -q -p no:cacheprovider tests/gpu/test_muse_layer.py -k switches > "$OUT/switch_layers.log" 2>&1; echo "switch layers rc=$?"; tail -3 "$OUT/switch_layers.log"
           for v in 0 1; do timeout 90 python3 tools/expert_bench.py --reps 10 --define GVM_EXPERT_REG=$v --out "$OUT/expert_bench_reg$v.json" > "$OUT/expert_bench_reg$v.log" 2>&1; echo "expert_bench reg=$v rc=$?"; tail -9 "$OUT/expert_bench_reg$v.log"; done
           timeout ${T_EXPERTS_PROBE:-420} python3 tools/sched_probe.py --out "$OUT/experts_probe.json" --depths 1 --variants "base:,noreg:GVM_EXPERT_REG=0,tt1:GVM_GEMM_TT=1,r4:GVM_GEMM_F32_RN=4+GVM_GEMM_F32_TT=4,none:GVM_EXPERT_REG=0+GVM_GEMM_TT=1+GVM_GEMM_F32_RN=4+GVM_GEMM_F32_TT=4" --cases full-c1-t1,sliding-c1-t1,full-c32-t8 --step 1x1,32x8 > "$OUT/experts_probe.log" 2>&1; echo "experts probe rc=$?"; tail -20 "$OUT/experts_probe.log" ;;
    park) # parking (GVM_PARK 1, the default since f945f51) against ready first without it, all 12 layers and the six steps in one run, and the chain
           timeout ${T_PARK:-480} python3 tools/sched_probe.py --out "$OUT/park_probe.json" --depths 1 --variants "park:,nopark:GVM_PARK=0" --cases full-c1-t1,full-c1-t8,full-c16-t1,full-c16-t8,full-c32-t1,full-c32-t8,sliding-c1-t1,sliding-c1-t8,sliding-c16-t1,sliding-c16-t8,sliding-c32-t1,sliding-c32-t8 --step 1x1,1x8,16x1,16x8,32x1,32x8 > "$OUT/park_probe.log" 2>&1; echo "park probe rc=$?"; grep -v static "$OUT/park_probe.log" | tail -36
           timeout 90 python3 tools/dispatch_probe.py --chain --variants nap32,nopark,inorder --out "$OUT/chain.json" > "$OUT/chain.log" 2>&1; echo "chain rc=$?"; tail -14 "$OUT/chain.log" ;;
    ring) # the experts' weight ring (GVM_EXPR_RING_MIN 2 slots, the default) against the register path it replaces at 1-3 tokens (99)
           timeout 200 python3 tools/prebuild.py --trace base GVM_EXPR_RING_MIN=99; echo "prebuild rc=$?"
           timeout 120 python3 tools/ops_check.py --sizes small --only expert_up,expert_down > "$OUT/ring_ops_check.log" 2>&1; echo "ops_check rc=$?"; tail -2 "$OUT/ring_ops_check.log"
           for v in 3 99; do timeout 100 python3 tools/expert_bench.py --reps 10 --define GVM_EXPR_RING_MIN=$v --out "$OUT/expert_bench_ring$v.json" > "$OUT/expert_bench_ring$v.log" 2>&1; echo "expert_bench ring_min=$v rc=$?"; tail -9 "$OUT/expert_bench_ring$v.log"; done
           timeout ${T_RING_PROBE:-240} python3 tools/sched_probe.py --out "$OUT/ring_probe.json" --modes dynamic --depths 1 --variants "ring:,noring:GVM_EXPR_RING_MIN=99" --cases full-c1-t1,sliding-c1-t1,full-c1-t8,full-c16-t1,full-c32-t8 --step 1x1,1x8 > "$OUT/ring_probe.log" 2>&1; echo "ring probe rc=$?"; tail -14 "$OUT/ring_probe.log"
           timeout ${T_RING_SWEEP:-120} python3 -m gpuvm sweep --cases full-c1-t1,full-c1-t8,full-c16-t1 --out "$OUT/ring_sweep" --trace > "$OUT/ring_sweep.log" 2>&1; echo "ring sweep rc=$?"; tail -6 "$OUT/ring_sweep.log"
           (cd "$OUT/ring_sweep" && ls trace-*.npz >/dev/null 2>&1 && tar czf ../ring_traces.tgz trace-*.npz sweep.json && cd .. && rm -rf ring_sweep) ;;
    lists) # expert lists signalled by their finisher (GVM_LIST_SIGNAL 1, the default) against every worker signalling (0)
           timeout 200 python3 tools/prebuild.py --trace base GVM_LIST_SIGNAL=0; echo "prebuild rc=$?"
           timeout 120 python3 tools/ops_check.py --sizes small --only topk,expert_up,expert_down > "$OUT/lists_ops_check.log" 2>&1; echo "ops_check rc=$?"; tail -2 "$OUT/lists_ops_check.log"
           timeout ${T_LISTS_PROBE:-300} python3 tools/sched_probe.py --out "$OUT/lists_probe.json" --modes dynamic --depths 1 --variants "list:,workers:GVM_LIST_SIGNAL=0" --cases full-c1-t1,sliding-c1-t1,full-c1-t8,full-c16-t1,full-c32-t8,sliding-c32-t8 --step 1x1,1x8,32x8 > "$OUT/lists_probe.log" 2>&1; echo "lists probe rc=$?"; tail -16 "$OUT/lists_probe.log" ;;
    steptrace) # one traced step of 8 layers at 1x1 and a traced sweep of the 1- and 8-token layers (all in traces.tgz)
           mkdir -p "$OUT/tr"
           timeout 150 python3 tools/step_trace.py --layers 8 --shape 1x1 --out "$OUT/tr/step-trace-1x1.npz" > "$OUT/step_trace.log" 2>&1; echo "step trace rc=$?"; tail -18 "$OUT/step_trace.log"
           timeout 120 python3 -m gpuvm sweep --cases full-c1-t1,sliding-c1-t1,full-c1-t8 --out "$OUT/tr" --trace --no-plot > "$OUT/tr_sweep.log" 2>&1; echo "traced sweep rc=$?"; tail -5 "$OUT/tr_sweep.log"
           (cd "$OUT" && tar czf traces.tgz tr && rm -rf tr) ;;
    tiles) # GEMM tile bytes and attention chunk lengths at 1 and 8 tokens (and 256, where the defaults were tuned)
           timeout ${T_TILES:-330} python3 tools/sched_probe.py --out "$OUT/tiles_probe.json" --modes dynamic --depths 1 --variants base: --tiles "${TILES:-base:,g128:gemm_bytes=131072,g64:gemm_bytes=65536,c512:chunk=512,c256:chunk=256,c128:chunk=128}" --cases ${TILES_CASES:-full-c1-t1,sliding-c1-t1,full-c1-t8,sliding-c1-t8,full-c32-t8,sliding-c32-t8} --step ${TILES_STEPS:-1x1,1x8} > "$OUT/tiles_probe.log" 2>&1; echo "tiles probe rc=$?"; cat "$OUT/tiles_probe.log" | grep -v "^$" | tail -50 ;;
    rowpf) # RMSNORM / RESIDUAL prefetching their weight vectors into L2 as they start (GVM_ROW_PF 1, the default) against not (0)
           timeout 200 python3 tools/prebuild.py base GVM_ROW_PF=0; echo "prebuild rc=$?"
           timeout 120 python3 tools/ops_check.py --sizes small --only rmsnorm,residual > "$OUT/rowpf_ops_check.log" 2>&1; echo "ops_check rc=$?"; tail -1 "$OUT/rowpf_ops_check.log"
           timeout ${T_ROWPF:-300} python3 tools/sched_probe.py --out "$OUT/rowpf_probe.json" --modes dynamic --depths 1 --variants "pf:,nopf:GVM_ROW_PF=0" --cases full-c1-t1,sliding-c1-t1,full-c1-t8,full-c16-t1,full-c32-t8,sliding-c32-t8 --step 1x1,1x8,32x8 > "$OUT/rowpf_probe.log" 2>&1; echo "row pf probe rc=$?"; grep -v "^$" "$OUT/rowpf_probe.log" | tail -30 ;;
    fill) # GEMM tiles sized to fill the groups in one wave (Tiles.gemm_fill), the warmer on, the loader's prefetch off
           timeout 200 python3 tools/prebuild.py base GVM_PF_MAX_BYTES=0; echo "prebuild rc=$?"
           timeout ${T_FILL:-420} python3 tools/sched_probe.py --out "$OUT/fill_probe.json" --modes dynamic --depths 1 --variants "${FILL_VARIANTS:-base:,warm:warm=1,nopf:GVM_PF_MAX_BYTES=0}" --tiles "${FILL_TILES:-base:,fill:gemm_fill=264}" --cases ${FILL_CASES:-full-c1-t1,sliding-c1-t1,full-c1-t8,full-c32-t8,sliding-c32-t8} --step ${FILL_STEPS:-1x1,1x8,32x8} > "$OUT/fill_probe.log" 2>&1; echo "fill probe rc=$?"; grep -v "^$" "$OUT/fill_probe.log" | tail -50 ;;
    fill2) # one-wave GEMM tiles (now the default) against other fills and bounds; the loader's prefetch bytes; traced 8-layer steps with and without it
           timeout 200 python3 tools/prebuild.py --trace base GVM_PF_MAX_BYTES=0 GVM_PF_MAX_BYTES=8192 GVM_PF_MAX_BYTES=131072; echo "prebuild rc=$?"
           CASES=full-c1-t1,sliding-c1-t1,full-c1-t8,full-c16-t1,full-c32-t8,sliding-c32-t8
           timeout 300 python3 tools/sched_probe.py --out "$OUT/fill_tiles.json" --modes dynamic --depths 1 --variants base: --tiles "f264:,f528:gemm_fill=528,f132:gemm_fill=132,min32:gemm_min_bytes=32768,max256:gemm_max_bytes=262144" --cases $CASES --step 1x1,1x8,32x8 > "$OUT/fill_tiles.log" 2>&1; echo "fill tiles rc=$?"; grep -v "^$" "$OUT/fill_tiles.log" | tail -45
           timeout 300 python3 tools/sched_probe.py --out "$OUT/pf_probe.json" --modes dynamic --depths 1 --variants "pf32:,pf0:GVM_PF_MAX_BYTES=0,pf8:GVM_PF_MAX_BYTES=8192,pf128:GVM_PF_MAX_BYTES=131072" --cases $CASES --step 1x1,1x8,32x8 > "$OUT/pf_probe.log" 2>&1; echo "pf probe rc=$?"; grep -v "^$" "$OUT/pf_probe.log" | tail -36
           mkdir -p "$OUT/tr"
           timeout 100 python3 tools/step_trace.py --layers 8 --shape 1x1 --out "$OUT/tr/step-trace-1x1.npz" > "$OUT/step_trace.log" 2>&1; echo "step trace rc=$?"; tail -16 "$OUT/step_trace.log"
           timeout 100 python3 tools/step_trace.py --layers 8 --shape 1x1 --define GVM_PF_MAX_BYTES=0 --out "$OUT/tr/step-trace-1x1-pf0.npz" > "$OUT/step_trace_pf0.log" 2>&1; echo "step trace pf0 rc=$?"; tail -16 "$OUT/step_trace_pf0.log"
           (cd "$OUT" && tar czf traces.tgz tr && rm -rf tr) ;;
    xstage) # the experts' x staged GVM_EXPR_XB words a thread at a time (4, the default) against one (the old loop); the list alone, layers, steps
           timeout 200 python3 tools/prebuild.py base GVM_EXPR_XB=1; echo "prebuild rc=$?"
           timeout 120 python3 tools/ops_check.py --sizes small --only expert_up,expert_down > "$OUT/xstage_ops_check.log" 2>&1; echo "ops_check rc=$?"; tail -1 "$OUT/xstage_ops_check.log"
           for v in 4 1; do timeout 90 python3 tools/expert_bench.py --reps 10 --define GVM_EXPR_XB=$v --out "$OUT/expert_bench_xb$v.json" > "$OUT/expert_bench_xb$v.log" 2>&1; echo "expert_bench xb=$v rc=$?"; tail -9 "$OUT/expert_bench_xb$v.log"; done
           timeout 300 python3 tools/sched_probe.py --out "$OUT/xstage_probe.json" --modes dynamic --depths 1 --variants "xb4:,xb1:GVM_EXPR_XB=1" --cases full-c1-t1,sliding-c1-t1,full-c1-t8,full-c32-t8 --step 1x1,1x8,32x8 > "$OUT/xstage_probe.log" 2>&1; echo "xstage probe rc=$?"; grep -v "^$" "$OUT/xstage_probe.log" | tail -14 ;;
    trace62) # one traced whole step (62 layers) at 1 x 1, into traces62.tgz
           mkdir -p "$OUT/tr62"
           timeout 150 python3 tools/step_trace.py --layers 62 --shape 1x1 --out "$OUT/tr62/step-trace-1x1.npz" > "$OUT/step_trace62.log" 2>&1; echo "step trace 62 rc=$?"; tail -16 "$OUT/step_trace62.log"
           (cd "$OUT" && tar czf traces62.tgz tr62 && rm -rf tr62) ;;
    attstop) # where an attention chunk's time goes at one token: ATTN_CHUNK alone (ops_check --time: each case's first instruction; the fused sliding case is 1 token x 1,024 keys), cut after stage k (GVM_ATT_STOP 1 args, 2 the conversation row, 3 new keys, 4 Q staged, 5 the keys' loop; 0 whole; wrong numbers, times only)
           for v in 0 1 2 3 4 5; do timeout 100 python3 tools/ops_check.py --time 200 --only attn_chunk --define GVM_ATT_STOP=$v > "$OUT/attstop$v.log" 2>&1; echo "stop=$v rc=$?"; grep -E "fused" "$OUT/attstop$v.log" | head -3; done
           (cd "$OUT" && tar czf attstop.tgz attstop*.log && rm -f attstop*.log) ;;
    xprobe) # where an expert item's time goes: the list alone with parts cut out (GVM_EXPR_PROBE bits; wrong sums, times only)
           timeout 200 python3 tools/prebuild.py base GVM_EXPR_PROBE=3 GVM_EXPR_PROBE=4 GVM_EXPR_PROBE=8 GVM_EXPR_PROBE=16 GVM_EXPR_PROBE=32 GVM_EXPR_PROBE=64; echo "prebuild rc=$?"
           for v in 0 3 4 8 16 32 64; do timeout 60 python3 tools/expert_bench.py --quick --reps 10 --define GVM_EXPR_PROBE=$v --out "$OUT/xprobe$v.json" > "$OUT/xprobe$v.log" 2>&1; echo "expert_bench probe=$v rc=$?"; tail -5 "$OUT/xprobe$v.log"; done
           (cd "$OUT" && tar czf xprobe.tgz xprobe*.json xprobe*.log && rm -f xprobe*.json xprobe*.log) ;;
    smem) # the groups' scratch at 64 KB (the default) against 48 and 96 KB (GVM_GROUP_SMEM: the staged GEMM's stages, attention's and the experts' buffers grow with it); traced 2-layer 32x8 step at 96 KB
           timeout 200 python3 tools/prebuild.py base GVM_GROUP_SMEM=98304 GVM_GROUP_SMEM=49152; echo "prebuild rc=$?"
           timeout 260 python3 tools/sched_probe.py --out "$OUT/smem_probe.json" --modes dynamic --depths 1 --variants "s64:,s96:GVM_GROUP_SMEM=98304,s48:GVM_GROUP_SMEM=49152" --cases ${SMEM_CASES:-sliding-c32-t8,full-c32-t8,full-c1-t1,sliding-c1-t8,full-c16-t1} --step ${SMEM_STEPS:-32x8,1x1,16x1} > "$OUT/smem_probe.log" 2>&1; echo "smem probe rc=$?"; grep -v "^$" "$OUT/smem_probe.log" | tail -32
           mkdir -p "$OUT/tr"
           timeout 100 python3 tools/step_trace.py --layers 2 --shape 32x8 --define GVM_GROUP_SMEM=98304 --out "$OUT/tr/step-trace-32x8-s96.npz" > "$OUT/step_trace_s96.log" 2>&1; echo "step trace s96 rc=$?"; tail -17 "$OUT/step_trace_s96.log"
           (cd "$OUT" && tar czf traces.tgz tr && rm -rf tr) ;;
    tiles2) # the span tiling (one wave of 264, 64-token spans) against a fill of 528 and 128-token spans, at 128 and 256 tokens
           timeout 150 python3 tools/sched_probe.py --out "$OUT/tiles2_probe.json" --modes dynamic --depths 1 --variants base: --tiles "f264:,f528:gemm_fill=528,span128:gemm_span=128" --cases ${TILES2_CASES:-sliding-c32-t8,full-c16-t8} --step ${TILES2_STEPS:-32x8} > "$OUT/tiles2_probe.log" 2>&1; echo "tiles2 probe rc=$?"; grep -v "^$" "$OUT/tiles2_probe.log" | tail -10 ;;
    router) # the router's staged tiles cut over K (Tiles.router_span 32, router_ops 128: K parts, the last part of a tile adding them up)
            # against the tiles before (router_span=256, router_ops=1: 32 tiles at 256 tokens, 2-row register tiles below); gemm checked at the shard's size first
           timeout 60 python3 tools/ops_check.py --only gemm > "$OUT/router_ops_check.log" 2>&1; echo "ops_check gemm rc=$?"; grep -c " ok" "$OUT/router_ops_check.log"; grep "FAIL\|ALL" "$OUT/router_ops_check.log" | head -6
           timeout ${T_ROUTER:-300} python3 tools/sched_probe.py --out "$OUT/router_probe.json" --modes dynamic --depths 1 --variants base: --tiles "parts:,before:router_span=256+router_ops=1" --cases ${ROUTER_CASES:-full-c16-t8,full-c32-t8,sliding-c16-t8,sliding-c32-t8,full-c32-t1,sliding-c32-t1} --step ${ROUTER_STEPS:-16x8,32x8,32x1} > "$OUT/router_probe.log" 2>&1; echo "router probe rc=$?"; grep -v "^$" "$OUT/router_probe.log" | tail -24 ;;
    xbench) # expert_bench (the list alone) with probes (GVM_EXPR_PROBE: 4 no weight copies, 5 no copies nor decode, 16 the walk alone, 128 the argument check alone, 64 nothing;
            # the shared tile: 256 no x staging, 512 no decode nor MMA, 1024 no weight copies); XBENCH_ARGS (default --quick), e.g. "--shapes 32x16,8x64"
           for v in ${XBENCH:-GVM_EXPR_PROBE=0 GVM_EXPR_PROBE=4 GVM_EXPR_PROBE=5 GVM_EXPR_PROBE=16 GVM_EXPR_PROBE=128 GVM_EXPR_PROBE=64}; do timeout ${T_XBENCH:-60} python3 tools/expert_bench.py ${XBENCH_ARGS:---quick} --reps 10 --define $v --out "$OUT/xb_$v.json" > "$OUT/xb_$v.log" 2>&1; echo "expert_bench $v rc=$?"; tail -4 "$OUT/xb_$v.log"; done
           (cd "$OUT" && tar czf xbench.tgz xb_* && rm -f xb_*) ;;
    against) # this tree against the device code of an earlier commit in one run (AGAINST: a tar of `git archive <rev> isa ops runtime scheduler`
             # in the checkout, untracked), AGAINST_ROUNDS times alternating: the layers and steps of AGAINST_CASES / AGAINST_STEPS (one token by default),
             # then, unless AGAINST_XBENCH=0, expert_bench in the first round (AGAINST_XB_ARGS, default --quick; AGAINST_XB_PROBES, default probes 0 and 5: no copies nor decode)
           rm -rf /tmp/against && mkdir -p /tmp/against && cp -r gpuvm tools isa ops runtime scheduler pyproject.toml /tmp/against/ && tar -xf "${AGAINST:?}" -C /tmp/against
           xb=${AGAINST_XBENCH:-1}; pre=base; [ "$xb" = 1 ] && pre="base GVM_EXPR_PROBE=5"
           (cd /tmp/against && PYTHONPATH=/tmp/against timeout 200 python3 tools/prebuild.py $pre | sed 's/^/against: /') & timeout 200 python3 tools/prebuild.py --trace $pre; wait; echo "prebuild done"
           for r in $(seq ${AGAINST_ROUNDS:-1}); do for t in against here; do d=$PWD; [ $t = against ] && d=/tmp/against
             (cd $d && PYTHONPATH=$d timeout ${T_AGAINST_PROBE:-150} python3 tools/sched_probe.py --out "$OUT/${t}${r}_probe.json" --modes dynamic --depths 1 --variants base: --cases ${AGAINST_CASES:-full-c1-t1,sliding-c1-t1,full-c1-t8,sliding-c1-t8,full-c16-t1} --step ${AGAINST_STEPS:-1x1,1x8,16x1} > "$OUT/${t}${r}_probe.log" 2>&1; echo "$t round $r rc=$?"; grep -v "^$" "$OUT/${t}${r}_probe.log" | tail -8)
             [ "$xb" = 1 ] && [ "$r" = 1 ] && for v in ${AGAINST_XB_PROBES:-GVM_EXPR_PROBE=0 GVM_EXPR_PROBE=5}; do (cd $d && PYTHONPATH=$d timeout ${T_AGAINST_XB:-60} python3 tools/expert_bench.py ${AGAINST_XB_ARGS:---quick} --reps 10 --define $v --out "$OUT/xb_${t}_$v.json" > "$OUT/xb_${t}_$v.log" 2>&1; echo "$t expert_bench $v rc=$?"; grep -E "^(up|down) " "$OUT/xb_${t}_$v.log"); done
           done; done
           if [ "$xb" = 1 ]; then (cd "$OUT" && tar czf against.tgz xb_* && rm -f xb_*); fi ;;
    slots) # the experts' ring at 3 slots a warp (GVM_EXPR_RING, the default since de974fc) against 4 and 5
           timeout 200 python3 tools/prebuild.py base GVM_EXPR_RING=4 GVM_EXPR_RING=5; echo "prebuild rc=$?"
           timeout ${T_SLOTS_PROBE:-200} python3 tools/sched_probe.py --out "$OUT/slots_probe.json" --modes dynamic --depths 1 --variants "s3:,s4:GVM_EXPR_RING=4,s5:GVM_EXPR_RING=5" --cases ${SLOTS_CASES:-full-c1-t1,sliding-c1-t1,full-c1-t8,full-c16-t1} --step ${SLOTS_STEPS:-1x1,1x8} > "$OUT/slots_probe.log" 2>&1; echo "slots probe rc=$?"; grep -v "^$" "$OUT/slots_probe.log" | tail -18 ;;
    naps) # a group's counter poll napping 32 ns doubling to 256 (GVM_WAIT_NAP_MAX, the default) against a cap of 64 and a spin (0 / 0)
           timeout 200 python3 tools/prebuild.py base GVM_WAIT_NAP_MAX=64 GVM_WAIT_NAP_MIN=0+GVM_WAIT_NAP_MAX=0; echo "prebuild rc=$?"
           timeout ${T_NAPS_PROBE:-150} python3 tools/sched_probe.py --out "$OUT/naps_probe.json" --modes dynamic --depths 1 --variants "nap256:,nap64:GVM_WAIT_NAP_MAX=64,spin:GVM_WAIT_NAP_MIN=0+GVM_WAIT_NAP_MAX=0" --cases ${NAPS_CASES:-full-c1-t1,sliding-c1-t1} --step ${NAPS_STEPS:-1x1,1x8} > "$OUT/naps_probe.log" 2>&1; echo "naps probe rc=$?"; grep -v "^$" "$OUT/naps_probe.log" | tail -12 ;;
    icache) # what cold code costs: a straight-line body run three times (tools/icache_probe.py), and one-token op chains in the VM
           timeout ${T_ICACHE:-200} python3 tools/icache_probe.py --vm --out "$OUT/icache_probe.json" > "$OUT/icache_probe.log" 2>&1; echo "icache probe rc=$?"; tail -24 "$OUT/icache_probe.log" ;;
    workers) # expert work lists of 264 workers (Tiles.expert_workers, the default: one per group) against fewer, so that groups stay free to claim the next op's instructions while the up list runs
           timeout ${T_WORKERS_PROBE:-300} python3 tools/sched_probe.py --out "$OUT/workers_probe.json" --modes dynamic --depths 1 --variants base: --tiles "${WORKERS_TILES:-w264:,w232:expert_workers=232,w200:expert_workers=200,w132:expert_workers=132}" --cases ${WORKERS_CASES:-full-c1-t1,sliding-c1-t1,full-c1-t8,full-c16-t1,full-c32-t8,sliding-c32-t8} --step ${WORKERS_STEPS:-1x1,1x8,16x1,32x8} > "$OUT/workers_probe.log" 2>&1; echo "workers probe rc=$?"; grep -v "^$" "$OUT/workers_probe.log" | tail -40 ;;
    slices) # RESIDUAL cut into column ranges fed by Wo's / Wex's statistics (Tiles.residual_slices 8, the default) against whole rows (1); an 8-layer traced step at 1 x 1 of each
           timeout 150 python3 tools/ops_check.py --only gemm,residual > "$OUT/ops_gemm_residual.log" 2>&1; echo "ops_check gemm,residual rc=$?"; tail -1 "$OUT/ops_gemm_residual.log"; grep -i "statistics\|columns" "$OUT/ops_gemm_residual.log" | head -8
           timeout ${T_SLICES_PROBE:-400} python3 tools/sched_probe.py --out "$OUT/slices_probe.json" --modes dynamic --depths 1 --variants base: --tiles "${SLICES_TILES:-rs8:,rs1:residual_slices=1}" --cases ${SLICES_CASES:-full-c1-t1,sliding-c1-t1,full-c1-t8,full-c16-t1,full-c32-t1} --step ${SLICES_STEPS:-1x1,1x8,16x1,32x1} > "$OUT/slices_probe.log" 2>&1; echo "slices probe rc=$?"; grep -v "^$" "$OUT/slices_probe.log" | tail -40
           mkdir -p "$OUT/tr"
           for t in rs8 rs1; do timeout 100 python3 tools/step_trace.py --layers 8 --shape 1x1 $([ $t = rs1 ] && echo --tiles residual_slices=1) --out "$OUT/tr/step-trace-1x1-$t.npz" > "$OUT/step_trace_$t.log" 2>&1; echo "step trace $t rc=$?"; tail -16 "$OUT/step_trace_$t.log"; done
           (cd "$OUT" && tar czf traces.tgz tr && rm -rf tr) ;;
    statsprobe) # where a GEMM tile with statistics spends its extra time: 8-layer traced steps at 1 x 1 with whole-row RESIDUALs (rs1), the default,
                # and timing probes (GVM_GEMM_STATS_PROBE: 1 no s / alpha / beta loads, 4 no argument check of t3..t6; wrong sums)
           for v in ${STATS_VARIANTS:-rs1 base GVM_GEMM_STATS_PROBE=1 GVM_GEMM_STATS_PROBE=4}; do
             defs=""; [ "$v" = rs1 ] && defs="--tiles residual_slices=1"; [ "$v" != base ] && [ "$v" != rs1 ] && for d in ${v//+/ }; do defs="$defs --define $d"; done
             timeout 100 python3 tools/step_trace.py --layers 8 --shape 1x1 $defs --out "$OUT/st_$v.npz" > "$OUT/st_$v.log" 2>&1; echo "step trace $v rc=$?"; grep -E "^(Wo|Wex|Wr|residual1|residual2) " "$OUT/st_$v.log"
           done
           (cd "$OUT" && tar czf statsprobe.tgz st_* && rm -f st_*) ;;
    topkprobe) # where TOPK's time goes, alone (ops_check --time; GVM_TOPK_PROBE: 1 no routing table, 2 no score loads, 4 no pick rounds; wrong results)
           timeout 300 python3 tools/prebuild.py base GVM_TOPK_PROBE=1 GVM_TOPK_PROBE=2 GVM_TOPK_PROBE=4 GVM_TOPK_PROBE=6 GVM_TOPK_PROBE=7 2>&1 | tail -1
           for v in 0 1 2 4 6 7; do timeout 60 python3 tools/ops_check.py --time 200 --only topk --define GVM_TOPK_PROBE=$v > "$OUT/topk_probe$v.log" 2>&1; echo "topk probe $v rc=$?"; grep -i "topk" "$OUT/topk_probe$v.log" | head -4; done ;;
    layertrace) # traced steps of the first layers (default 2 at 32 x 8: layer 1 is full) in each build variant of LT_VARIANTS ("base MACRO=v+MACRO=v ..."):
                # per op, its median run in layer 0, layer 1 and the rest, e.g. to see which op a code change elsewhere slowed
           mkdir -p "$OUT/lt"
           for v in ${LT_VARIANTS:-base}; do defs=""; [ "$v" != base ] && for d in ${v//+/ }; do defs="$defs --define $d"; done
             timeout ${T_LT:-150} python3 tools/step_trace.py --layers ${LT_LAYERS:-2} --shape ${LT_SHAPE:-32x8} $defs --out "$OUT/lt/step-trace-${LT_SHAPE:-32x8}-${v//[=+]/_}.npz" > "$OUT/lt/step_trace_${v//[=+]/_}.log" 2>&1; echo "layer trace $v rc=$?"; tail -17 "$OUT/lt/step_trace_${v//[=+]/_}.log"
           done
           (cd "$OUT" && tar czf layertrace.tgz lt && rm -rf lt) ;;
    fusedqk) # ATTN_CHUNK's fused QK-norm/RoPE (Tiles.fuse_qk: no QK_ROPE_KV op) against the default: checked alone at the shard's size, the fused
             # layer tests (one and 128 tokens, both kinds), then layers and steps at few tokens (FUSE_QK: up to that many tokens a step)
           timeout 150 python3 tools/ops_check.py --only attn_chunk > "$OUT/ops_attn_fused.log" 2>&1; echo "ops_check attn_chunk rc=$?"; grep -E "fused|ALL" "$OUT/ops_attn_fused.log" | tail -4
           timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_muse_layer.py -k fused > "$OUT/fused_tests.log" 2>&1; echo "fused layer tests rc=$?"; tail -1 "$OUT/fused_tests.log"
           timeout ${T_FUSED_PROBE:-300} python3 tools/sched_probe.py --out "$OUT/fusedqk_probe.json" --modes dynamic --depths 1 --variants base: --tiles "base:,fq:fuse_qk=${FUSE_QK:-16}" --cases ${FUSED_CASES:-full-c1-t1,sliding-c1-t1,full-c1-t8,sliding-c1-t8,full-c16-t1} --step ${FUSED_STEPS:-1x1,1x8,16x1} > "$OUT/fusedqk_probe.log" 2>&1; echo "fused probe rc=$?"; grep -v "^$" "$OUT/fusedqk_probe.log" | tail -16 ;;
    oneop) # the one-token decode's single-instruction ops alone (11-12 us each in a layer at 34e08d1: QK-norm/RoPE, top-k, merge), us per instruction
           timeout ${T_ONEOP:-200} python3 tools/ops_check.py --time 200 --only qk_rope_kv,topk,attn_merge,rmsnorm,residual,expert_combine > "$OUT/oneop.log" 2>&1; echo "oneop rc=$?"; grep -iE "one token|T=1 |1 token|rmsnorm|residual|combine" "$OUT/oneop.log" | head -30 ;;
    ringbench) # the few-token expert lists alone (one round: --cap 4096, as Tiles.expert_cap_tokens makes them) at ring depths GVM_EXPR_RING 3 (the default) / 4 / 6,
               # and with probes 1 (no decode), 4 (no weight copies) and 5 (neither): is the loop issue-bound on its decode (NOTES session 24) or waiting on its copies?
           for v in GVM_EXPR_RING=3 GVM_EXPR_RING=4 GVM_EXPR_RING=6 GVM_EXPR_PROBE=1 GVM_EXPR_PROBE=4 GVM_EXPR_PROBE=5; do timeout 60 python3 tools/expert_bench.py --reps 10 --cap 4096 --shapes ${RB_SHAPES:-1x1,3x1,5x1,10x1} --define $v --out "$OUT/rb_$v.json" > "$OUT/rb_$v.log" 2>&1; echo "expert_bench $v rc=$?"; grep -E "^(up|down) " "$OUT/rb_$v.log"; done
           (cd "$OUT" && tar czf ringbench.tgz rb_* && rm -f rb_*) ;;
    ringprobe) # the expert ring's copies alone, by weight layout (rows as stored / packed in ring order / bulk), 2-4 slots
           timeout ${T_RINGPROBE:-200} python3 tools/ring_probe.py --out "$OUT/ring_layout_probe.json" > "$OUT/ring_layout_probe.log" 2>&1; echo "ring_probe rc=$?"; tail -10 "$OUT/ring_layout_probe.log" ;;
    opsgemm) timeout 150 python3 tools/ops_check.py --only gemm,qk_rope_kv > "$OUT/ops_gemm_qk.log" 2>&1; echo "ops_check gemm,qk_rope_kv rc=$?"; tail -2 "$OUT/ops_gemm_qk.log" ;;
    ncu) # Nsight Compute on the one-op kernels of the 256-token hot spots: the expert up / down lists at 32 experts x 16 tokens and
         # one full attention chunk alone: the sections (speed of light, scheduler, warp state, memory tables, ...) and the stall
         # reasons per issued instruction with the source counters (session 20: 50% excess sectors, 67% excess shared wavefronts)
         S="--section SpeedOfLight --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section InstructionStats --section SourceCounters --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio"
         for k in up down; do timeout 150 ncu --kernel-name gvm_check_expert_$k --launch-skip 2 --launch-count 1 $S python3 tools/expert_bench.py --shapes 32x16 --reps 3 --out /tmp/xb.json > "$OUT/ncu_$k.log" 2>&1; echo "ncu expert_$k rc=$?"; done
         timeout 200 ncu --kernel-name gvm_check_attn_chunk --launch-count 1 $S python3 tools/ops_check.py --time 3 --only attn_chunk > "$OUT/ncu_attn.log" 2>&1; echo "ncu attn_chunk rc=$?"
         for k in up down attn; do echo "== $k"; grep -E "Duration|Issue Slots Busy|Eligible Warps|excessive|bank conflict" "$OUT/ncu_$k.log" | head -8; grep "stalled" "$OUT/ncu_$k.log" | awk '$NF+0 > 0.1' | sort -k3 -g -r | head -8; done ;;
    tail) # the squeeze's last wave cut in halves (Tiles.gemm_tail 2) against one size (1, the default): layers and steps up to 32 tokens, one run
          timeout ${T_TAIL_PROBE:-360} python3 tools/sched_probe.py --out "$OUT/tail_probe.json" --modes dynamic --depths 1 --variants base: --tiles "${TAIL_TILES:-t1:,t2:gemm_tail=2,t4:gemm_tail=4}" --cases ${TAIL_CASES:-full-c1-t1,sliding-c1-t1,full-c1-t8,sliding-c1-t8,full-c16-t1,sliding-c32-t1} --step ${TAIL_STEPS:-1x1,1x8,16x1,32x1} > "$OUT/tail_probe.log" 2>&1; echo "tail probe rc=$?"; grep -v "^$" "$OUT/tail_probe.log" | tail -32 ;;
    fold) # 8-row one-token GEMM tiles folding their K range (GVM_GEMM_FOLD 1, the default) against not (0): the op on the GPU,
          # two alternating rounds of layers and steps, a traced 16-layer 1x1 step (Wqkvg's q|k|v tiles are the 8-row ones)
          timeout 200 python3 tools/prebuild.py --trace base GVM_GEMM_FOLD=0; echo "prebuild rc=$?"
          timeout 150 python3 tools/ops_check.py --only gemm > "$OUT/fold_ops_gemm.log" 2>&1; echo "ops_check gemm rc=$?"; grep -E "FAIL|ranges of|ALL" "$OUT/fold_ops_gemm.log" | tail -4
          timeout ${T_FOLD_PROBE:-330} python3 tools/sched_probe.py --out "$OUT/fold_probe.json" --modes dynamic --depths 1 --variants "fold:,nofold:GVM_GEMM_FOLD=0,fold2:,nofold2:GVM_GEMM_FOLD=0" --cases full-c1-t1,sliding-c1-t1,full-c1-t8 --step 1x1,1x8 > "$OUT/fold_probe.log" 2>&1; echo "fold probe rc=$?"; grep -v "^$" "$OUT/fold_probe.log" | tail -24
          mkdir -p "$OUT/tr"; timeout 150 python3 tools/step_trace.py --layers 16 --shape 1x1 --out "$OUT/tr/step-trace-1x1.npz" > "$OUT/step_trace.log" 2>&1; echo "step trace rc=$?"; head -16 "$OUT/step_trace.log"
          (cd "$OUT" && tar czf steptrace.tgz tr && rm -rf tr) ;;
    next) # session 38's open questions in one call: tests/gpu (with the sweep's end-to-end test), the layer sweep with its static
          # traces (then, here: gpuvm trace trace-full-c16-t8.npz --against trace-full-c16-t8-static.npz), the sliding chunk length at one token twice
           timeout 200 python3 tools/prebuild.py --trace base; echo "prebuild rc=$?"
           timeout ${T_GPUTESTS:-200} python3 -m pytest -q -p no:cacheprovider tests/gpu > "$OUT/tests_gpu.log" 2>&1; echo "tests/gpu rc=$?"; tail -3 "$OUT/tests_gpu.log"
           timeout 200 python3 -m gpuvm sweep --out "$OUT" --trace > "$OUT/sweep.log" 2>&1; echo "sweep rc=$?"; tail -17 "$OUT/sweep.log"
           (cd "$OUT" && ls trace-*.npz >/dev/null 2>&1 && tar czf traces.tgz trace-*.npz && rm -f trace-*.npz)
           for r in 1 2; do timeout 120 python3 tools/sched_probe.py --out "$OUT/sc_r$r.json" --modes dynamic --depths 1 --variants base: --tiles "base:,sc64:sliding_chunk=64,sc256:sliding_chunk=256" --cases sliding-c1-t1,sliding-c1-t8 --step 1x1,1x8 > "$OUT/sc_r$r.log" 2>&1; echo "chunk probe $r rc=$?"; grep -v "^$" "$OUT/sc_r$r.log" | tail -12; done
           (cd "$OUT" && tar czf chunk_probe.tgz sc_r* && rm -f sc_r*) ;;
    attntail) # attention's tail in half chunks (Tiles.attn_tail 132, the default) against none: tests/gpu's layer tests and ATTN_MERGE alone
          # first, then the full layers with two waves of chunks and their steps, two rounds (order swapped), and the four layers swept with traces
           timeout 200 python3 tools/prebuild.py --trace base; echo "prebuild rc=$?"
           timeout 60 python3 tools/ops_check.py --only attn_merge > "$OUT/ops_merge.log" 2>&1; echo "ops_check attn_merge rc=$?"; tail -1 "$OUT/ops_merge.log"
           timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_muse_layer.py tests/gpu/test_step_chain.py > "$OUT/tests_layer.log" 2>&1; echo "layer tests rc=$?"; tail -1 "$OUT/tests_layer.log"
           ab_rounds tail tiles "tail:,notail:attn_tail=0" 150 --cases full-c16-t8,full-c32-t8,full-c16-t1,full-c32-t1 --step 16x8,32x8,16x1,32x1
           timeout 120 python3 -m gpuvm sweep --cases full-c16-t8,full-c32-t8,full-c16-t1,full-c32-t1 --out "$OUT/sw" --trace --no-plot > "$OUT/tail_sweep.log" 2>&1; echo "sweep rc=$?"; tail -7 "$OUT/tail_sweep.log"
           (cd "$OUT" && tar czf tail.tgz sw tail_r* && rm -rf sw tail_r*.json) ;;
    qksplit) # QK-norm/RoPE one new token an op (Tiles.qk_tokens 1, the default since 660cedc) against a conversation's all (0): QK_ROPE_KV alone,
             # tests/gpu's layer tests, then the 128/256-token layers and steps, two rounds (order swapped)
           timeout 200 python3 tools/prebuild.py --trace base; echo "prebuild rc=$?"
           timeout 60 python3 tools/ops_check.py --only qk_rope_kv > "$OUT/ops_qk.log" 2>&1; echo "ops_check qk_rope_kv rc=$?"; tail -1 "$OUT/ops_qk.log"
           timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_muse_layer.py > "$OUT/tests_layer_qk.log" 2>&1; echo "layer tests rc=$?"; tail -1 "$OUT/tests_layer_qk.log"
           AB_TAIL=12 ab_rounds qk tiles "qk1:,qkall:qk_tokens=0" 150 --cases full-c16-t8,full-c32-t8,sliding-c16-t8,sliding-c32-t8 --step 16x8,32x8
           (cd "$OUT" && tar czf qksplit.tgz qk_r* && rm -f qk_r*.json) ;;
    clocks) # the SM clock and power while layers and a step run (nvidia-smi every 50 ms beside sched_probe), and attn_chunk's full case
            # (every chunk, two groups a block) under ncu at the clocks the GPU picks: what a chunk costs at full occupancy outside the VM
           nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw --format=csv,noheader,nounits -lms 50 > "$OUT/smi.csv" & smi=$!
           timeout 200 python3 tools/sched_probe.py --out "$OUT/clocks_probe.json" --modes dynamic --depths 1 --variants base: --cases full-c32-t8,full-c16-t8,sliding-c1-t1 --step 32x8 > "$OUT/clocks_probe.log" 2>&1; echo "probe rc=$?"; tail -4 "$OUT/clocks_probe.log"
           kill $smi; python3 - "$OUT/smi.csv" <<'PY'
import sys, statistics
rows = [[x.strip() for x in l.split(",")] for l in open(sys.argv[1]) if l.count(",") == 2]
busy = [(float(r[0]), float(r[2])) for r in rows if r[2].replace(".", "").isdigit() and float(r[2]) > 250]
print(f"{len(rows)} samples, {len(busy)} above 250 W")
if busy:
    clk = sorted(b[0] for b in busy)
    print(f"SM clock above 250 W: min {clk[0]:.0f} median {statistics.median(clk):.0f} max {clk[-1]:.0f} MHz; power median {statistics.median(b[1] for b in busy):.0f} W")
PY
           timeout 150 ncu --clock-control none --kernel-name gvm_check_attn_chunk --launch-skip 1 --launch-count 1 --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum.per_second,launch__grid_size python3 tools/ops_check.py --only attn_chunk > "$OUT/ncu_clk.log" 2>&1; echo "ncu rc=$?"
           grep -E "duration|per_second|grid_size" "$OUT/ncu_clk.log" ;;
    ncuattn) # ncu on attn_chunk's 'full' case as ops_check runs it the second time (every chunk, two groups a block): pipe use and stall reasons per issued instruction
           M="--metrics regex:sm__inst_executed_pipe_(alu|fma|xu|lsu|tensor_op_gmma).avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio"
           timeout 200 ncu --kernel-name gvm_check_attn_chunk --launch-skip 1 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats $M python3 tools/ops_check.py --only attn_chunk > "$OUT/ncu_attn_full.log" 2>&1; echo "ncu attn rc=$?"
           grep -E "Duration|Grid Size|Block Size|Issue Slots|Eligible|Active Warps Per|Warp Cycles Per Issued|pipe_.*pct" "$OUT/ncu_attn_full.log" | head -16; grep "stalled" "$OUT/ncu_attn_full.log" | awk '$NF+0 > 0.05' | sort -k3 -g -r | head -12 ;;
    lazygemm) # the dense GEMM tiles with GVM_FLAG_LAZY (Tiles.lazy_gemm 1: their block claims next only with a group free; 2: the router's and squeeze's only, the default since 0b8dfb8) against without (0):
              # the VM tests (the controller changed) and the layer tests first, then two rounds in swapped order (static's times: the README's tables)
           timeout 200 python3 tools/prebuild.py --trace base; echo "prebuild rc=$?"
           timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_vm.py tests/gpu/test_muse_layer.py > "$OUT/tests_lazy.log" 2>&1; echo "vm + layer tests rc=$?"; tail -1 "$OUT/tests_lazy.log"
           AB_TAIL=24 ab_rounds lazy tiles "base:,lazy:lazy_gemm=1,lazysq:lazy_gemm=2" 200 --cases sliding-c16-t8,full-c16-t8,full-c32-t8,sliding-c32-t8,full-c16-t1,sliding-c1-t1 --step 16x8,32x8
           (cd "$OUT" && tar czf lazy.tgz lazy_r* && rm -f lazy_r*.json) ;;
    codewarm) # what cold code costs the sweep's layers and what the code warmer wins back (tools/code_warm_probe.py: cold / code / hot / warmer, two rounds)
           timeout ${T_CODEWARM:-300} python3 tools/code_warm_probe.py --out "$OUT/code_warm.json" > "$OUT/code_warm.log" 2>&1; echo "code_warm rc=$?"; tail -10 "$OUT/code_warm.log" ;;
    lazyone) # every attention chunk of a one-wave layer (1 conversation) with GVM_FLAG_LAZY (Tiles.lazy_attn all) against none (the default):
             # the block of the code warmer's attention instance (~30 us cold) otherwise holds a chunk claimed behind it (full-c1-t1 trace, session 45); two dynamic rounds
           AB_TAIL=12 ab_rounds lazyone tiles "base:,aall:lazy_attn=100000" 200 --cases full-c1-t1,sliding-c1-t1,full-c1-t8,sliding-c1-t8 --step 1x1,1x8 ;;
    lazyall) # every dense GEMM tile lazy (Tiles.lazy_gemm 1) against the router's and squeeze's only (2, the default) at one conversation, with the code warmer and one-wave lazy attention; two dynamic rounds
           AB_TAIL=12 ab_rounds lazyall tiles "base:,g1:lazy_gemm=1" 200 --cases full-c1-t1,sliding-c1-t1,full-c1-t8 --step 1x1,1x8 ;;
    toolcheck) # the probes on L2Flush.restoring: sched_probe (one case, base) and code_warm_probe (one case, one round)
           timeout 120 python3 tools/sched_probe.py --out "$OUT/toolcheck_sched.json" --modes dynamic --depths 1 --variants base: --cases sliding-c1-t1 --step '' > "$OUT/toolcheck.log" 2>&1; echo "sched_probe rc=$?"
           timeout 150 python3 tools/code_warm_probe.py --out "$OUT/toolcheck_warm.json" --cases sliding-c1-t1 --rounds 1 >> "$OUT/toolcheck.log" 2>&1; echo "code_warm_probe rc=$?"; tail -4 "$OUT/toolcheck.log" ;;
    gearly) # Wqkvg's g tiles ordered with its q|k|v tiles above 8 tokens (Tiles.g_early 1, the default) against the depth order alone (0): two dynamic rounds, then static once
           AB_TAIL=20 ab_rounds gearly tiles "base:,g0:g_early=0" 250 --cases sliding-c32-t8,full-c32-t8,sliding-c16-t8,full-c16-t8,full-c32-t1,sliding-c32-t1 --step 32x8 ;;
    glate) # the late g tiles (one-token layers: g beside the attention chunks) on at most 64 groups (Tiles.g_late_groups 64, the default since f6f3cff: 64 tiles of 256 KB) against every group the chunks leave (all: 0, 128 of 128 KB at sliding) and g with q|k|v (g_late 0); two dynamic rounds
           AB_TAIL=16 ab_rounds glate tiles "base:,all:g_late_groups=0,g0:g_late=0" 220 --cases sliding-c1-t1,sliding-c1-t8,full-c1-t1 --step 1x1,1x8 ;;
    glate16) # g late (after q|k|v, beside the chunks, on 64 groups) up to 16 tokens (Tiles.g_late 16) against up to 8 (the default): the 16-token layers and step; two dynamic rounds
           AB_TAIL=12 ab_rounds glate16 tiles "base:,gl16:g_late=16" 200 --cases full-c16-t1,sliding-c16-t1 --step 16x1 ;;
    fixed16) # why fully static leads dynamic by ~2% at 16 tokens (session 46's table): the expert items dealt round robin (Tiles.expert_fixed 1) against claimed,
             # each in both modes (dynamic + fixed isolates the dealing from the host's lists), two rounds in swapped order; then the two layers traced three ways
           for r in 1 2; do l="base:,fx:expert_fixed=1"; [ "$r" = 2 ] && l="fx:expert_fixed=1,base:"
             timeout 200 python3 tools/sched_probe.py --out "$OUT/fixed16_r$r.json" --modes dynamic,static --depths 1 --variants base: --tiles "$l" --cases full-c16-t1,sliding-c16-t1,full-c32-t1 --step 16x1 > "$OUT/fixed16_r$r.log" 2>&1
             echo "fixed16 probe $r rc=$?"; grep -v "^$" "$OUT/fixed16_r$r.log" | tail -16; done
           timeout 200 python3 -m gpuvm sweep --cases full-c16-t1,sliding-c16-t1 --out "$OUT/sweep16" --trace > "$OUT/sweep16.log" 2>&1; echo "sweep16 rc=$?"; tail -8 "$OUT/sweep16.log"
           (cd "$OUT/sweep16" && tar czf ../traces16.tgz trace-*.npz sweep.json && cd .. && rm -rf sweep16) ;;
    dispdepth) # test_dispatch_overhead's figure at the VM's claim depth (1) and at every slot held (the test's), dynamic and static, three times each
           timeout 150 python3 -c "
from gpuvm.device import VM
from gpuvm.device.bench import dispatch_overhead
vm = VM(0, groups=2, trace=False, warm=True)
for rep in range(3):
    for d in (1, 2, 3):
        for m in ('dynamic', 'static'):
            print(rep, 'depth', d, m, round(dispatch_overhead(vm, m, claim_depth=d)['us_per_instr_per_block'], 4), flush=True)
" > "$OUT/dispdepth.log" 2>&1; echo "dispdepth rc=$?"; cat "$OUT/dispdepth.log" | tail -20 ;;
    shares) # the expert lists' items sized by each expert's token-weighted share of the workers (GVM_EXP_WEIGHTED 1, the default) against equal shares (0): the layers and steps whose lists are one round; two dynamic rounds
           AB_TAIL=16 ab_rounds shares variants "w:,eq:GVM_EXP_WEIGHTED=0" 280 --cases full-c16-t1,sliding-c16-t1,full-c32-t1,full-c1-t8,sliding-c1-t8 --step 16x1,1x8 ;;
    cap33) # one round of weighted items up to 32 tokens (Tiles.expert_cap_tokens 33) against items capped at 64 rows from 17 (the default); two dynamic rounds
           AB_TAIL=8 ab_rounds cap33 tiles "base:,c33:expert_cap_tokens=33" 150 --cases full-c32-t1,sliding-c32-t1 --step 32x1 ;;
    weightcal) # the expert lists alone by an expert's tokens (experts hit alike, uncapped: one round of equal items), to refit GVM_EXPERT_SHARE_*: 8 hit at 1..32 tokens
               # (the list at T tokens over the list at 1), and 4 and 16 hit at a few, whose items have twice and half the rows (an item's fixed part against its per-row part)
           timeout ${T_WEIGHTCAL:-360} python3 tools/expert_bench.py --reps 10 --cap 1048576 --shapes 8x1,8x2,8x3,8x4,8x5,8x6,8x7,8x8,8x10,8x12,8x16,8x20,8x24,8x32,4x1,4x4,4x8,4x16,16x1,16x4,16x8,16x16 --out "$OUT/weightcal.json" > "$OUT/weightcal.log" 2>&1; echo "weightcal rc=$?"; tail -50 "$OUT/weightcal.log" ;;
    bare) # the register path without a weight ring (5-8 tokens at 4,096 wide), run at f26dc8c: DOWN on the shared tile (GVM_EXPR_BARE_DOWN 0, now the default; 1 the
          # ringless register path) and a 64 / 72 / 80 KB group scratch (72 the default since): the lists alone, then two dynamic rounds
           for v in base: reg:GVM_EXPR_BARE_DOWN=1 s64:GVM_GROUP_SMEM=65536 s80:GVM_GROUP_SMEM=81920; do
             variant "$v"
             timeout 150 python3 tools/expert_bench.py --reps 10 --cap 1048576 --shapes 8x1,8x4,8x5,8x6,8x7,8x8,8x12,16x8 "${args[@]}" --out "$OUT/bare_$n.json" > "$OUT/bare_$n.log" 2>&1; echo "bare $n rc=$?"; tail -16 "$OUT/bare_$n.log"; done
           AB_TAIL=40 ab_rounds bare variants "base:,reg:GVM_EXPR_BARE_DOWN=1,s64:GVM_GROUP_SMEM=65536,s80:GVM_GROUP_SMEM=81920" ${T_BARE:-340} --cases full-c16-t1,sliding-c16-t1,full-c1-t8,sliding-c1-t8,full-c1-t1,sliding-c32-t8 --step 1x1,16x1 ;;
    stagger) # the shared tile's items staggered over K (GVM_EXP_STAGGER 1, the default) against every item from step 0 (st0): the lists alone, then two
             # dynamic rounds of the layers whose experts reach the shared tile (9+ tokens)
           for v in st1: st0:GVM_EXP_STAGGER=0; do
             variant "$v"
             timeout 120 python3 tools/expert_bench.py --reps 10 --shapes 32x16,skew256 "${args[@]}" --out "$OUT/stagger_$n.json" > "$OUT/stagger_$n.log" 2>&1; echo "$n rc=$?"; tail -5 "$OUT/stagger_$n.log"
             timeout 120 python3 tools/expert_bench.py --reps 10 --cap 1048576 --shapes 8x16,8x32 "${args[@]}" --out "$OUT/stagger1_$n.json" > "$OUT/stagger1_$n.log" 2>&1; echo "$n one round rc=$?"; tail -5 "$OUT/stagger1_$n.log"; done
           AB_TAIL=24 ab_rounds stagger variants "base:,st0:GVM_EXP_STAGGER=0" ${T_STAGGER:-300} --cases full-c32-t8,sliding-c32-t8,full-c16-t8,sliding-c16-t8,full-c16-t1 ;;
    tileprobe) # the shared tile's capped lists taken apart (GVM_EXPR_PROBE: 256 no x staging, 1024 no weight copies, 512 no decode nor MMA, 1280 neither
               # copies nor staging): where the 256-token layers' expert time goes
           for v in base: nox:GVM_EXPR_PROBE=256 now:GVM_EXPR_PROBE=1024 nomma:GVM_EXPR_PROBE=512 nocopy:GVM_EXPR_PROBE=1280; do
             variant "$v"
             timeout 100 python3 tools/expert_bench.py --reps 10 --shapes skew256,32x16 "${args[@]}" --out "$OUT/tp_$n.json" > "$OUT/tp_$n.log" 2>&1; echo "$n rc=$?"; tail -5 "$OUT/tp_$n.log"; done ;;
    dbl2) # run at a2bb128 and 57b00e9 (their switches GVM_EXP_DBL2 / GVM_EXP_DBL_DOWN since removed: two units a warp on both lists): the lists
          # alone, then two dynamic rounds of the 128- and 256-token layers (results/h200-s50/dbl2-a2bb128, dbldown-57b00e9); now the down list's cap
          # (Tiles.expert_cap_down, 128) against 64: the lists alone at both, then two rounds of every capped layer (17+ tokens) and step 32 x 1
          # (at 64 rows a down item has four units, one a warp, yet takes the two-unit pass, whose second unit's MMAs run on zeros: d64 is not
          # the down list as it ran at 64 before; see ops/experts.cuh gvm_expert_tile)
           for cap in 64 128; do
             timeout 120 python3 tools/expert_bench.py --reps 10 --cap $cap --shapes 32x16,32x24,32x32,skew256,32x2 --out "$OUT/caps_$cap.json" > "$OUT/caps_$cap.log" 2>&1; echo "cap $cap rc=$?"; tail -11 "$OUT/caps_$cap.log"; done
           AB_TAIL=40 ab_rounds caps tiles "base:,d64:expert_cap_down=64" ${T_CAPS:-420} --cases full-c32-t1,sliding-c32-t1,full-c32-t8,sliding-c32-t8,full-c16-t8,sliding-c16-t8 --step 32x1 ;;
    heavy) # half the cap for an expert of more than HEAVY_T tokens (Tiles.expert_heavy_up / _down, the lists' a6; the up list's at 64
           # by default since session 72, the down list's off): the skewed lists alone, then two dynamic rounds of the 128- and
           # 256-token layers and steps, one kernel: heavy down lists too (hv), no heavy experts (none), against the defaults
           for h in 0 ${HEAVY_T:-64}; do
             timeout 120 python3 tools/expert_bench.py --reps 10 --heavy $h --shapes skew256,32x8,32x16 --out "$OUT/heavy_bench_$h.json" > "$OUT/heavy_bench_$h.log" 2>&1; echo "bench heavy $h rc=$?"; tail -7 "$OUT/heavy_bench_$h.log"; done
           AB_TAIL=40 ab_rounds heavy tiles "base:,hv:expert_heavy_up=${HEAVY_T:-64}+expert_heavy_down=${HEAVY_T:-64},none:expert_heavy_up=0" ${T_HEAVY:-240} \
             --cases full-c32-t8,sliding-c32-t8,full-c16-t8,sliding-c16-t8 --step 32x8,16x8 ;;
    capup) # the up list's items at 64 rows (Tiles.expert_cap_up, the default; 128 at de3ce21, where this ran as base against u64) against 128:
           # two dynamic rounds of the capped layers
           AB_TAIL=30 ab_rounds capup tiles "base:,u128:expert_cap_up=128" ${T_CAPUP:-300} --cases full-c32-t8,sliding-c32-t8,full-c16-t8,sliding-c16-t8,full-c32-t1,sliding-c32-t1 --step "" ;;
    c16t1) # sliding-c16-t1 and full-c16-t1, dynamic against the expert items in a fixed round robin (Tiles.expert_fixed, the sweep's fully static
           # lists run dynamically here): two rounds, static mode too
           AB_TAIL=30 ab_rounds c16t1 tiles "base:,fx:expert_fixed=1" ${T_C16T1:-200} --modes dynamic,static --cases ${C16T1_CASES:-sliding-c16-t1,full-c16-t1} --step "${C16T1_STEPS:-}" ;;
    refit) # the share weights refit to 0caa460's weightcal (72 KB scratch), run at bac33a3 against its ISA weights (4 / 5 / 7 quarters to 3 / 5 tokens): wA 4 quarters
           # to 4 tokens, 7 to 8, 8 above (the ISA's since 5a84568, so base is wA now); wC the same from 3 tokens;
           # the layers and steps whose lists are one round, two dynamic rounds
           AB_TAIL=24 ab_rounds refit variants "base:,wA:GVM_EXPERT_SHARE_T1=4+GVM_EXPERT_SHARE_T2=8+GVM_EXPERT_SHARE_W2=7+GVM_EXPERT_SHARE_W3=8,wC:GVM_EXPERT_SHARE_T2=8+GVM_EXPERT_SHARE_W2=7+GVM_EXPERT_SHARE_W3=8" ${T_REFIT:-300} --cases full-c16-t1,sliding-c16-t1,full-c1-t8,sliding-c1-t8 --step 16x1,1x8 ;;
    kparts) # Wqkvg's staged tiles in K parts (Tiles.gemm_parts 4, the default) and its g tiles ordered early (g_early 1) against neither (p1g0) and parts alone off (p1):
            # GEMM on the GPU (ops_check: the bf16 K-part cases), then two dynamic rounds on the 128/256-token layers and step 16 x 8
           timeout 200 python3 tools/ops_check.py --only gemm > "$OUT/ops_gemm.log" 2>&1; echo "ops_check gemm rc=$?"; grep -i "parts\|fail\|all ok" "$OUT/ops_gemm.log" | tail -10
           AB_TAIL=16 ab_rounds kparts tiles "base:,p1:gemm_parts=1,p1g0:gemm_parts=1+g_early=0" 250 --cases sliding-c16-t8,full-c16-t8,sliding-c32-t8,full-c32-t8 --step 16x8 ;;
    kpartslayers) # kparts without the step (device time short): ops_check gemm, then the three variants on the four 128/256-token layers, two rounds
           timeout 200 python3 tools/ops_check.py --only gemm > "$OUT/ops_gemm.log" 2>&1; echo "ops_check gemm rc=$?"; grep -i "parts\|fail\|all ok" "$OUT/ops_gemm.log" | tail -10
           AB_TAIL=12 ab_rounds kparts tiles "base:,p1:gemm_parts=1,p1g0:gemm_parts=1+g_early=0" 200 --cases sliding-c16-t8,full-c16-t8,sliding-c32-t8,full-c32-t8 --step '' ;;
    lazyexperts) # the expert lists' workers with GVM_FLAG_LAZY (Tiles.lazy_experts 1) against eager (0), two dynamic rounds in swapped order
           AB_TAIL=24 ab_rounds lazyexp tiles "base:,lazy:lazy_experts=1" 250 --cases sliding-c16-t8,full-c16-t8,full-c32-t8,sliding-c32-t8,full-c1-t8,full-c32-t1 --step 16x8,32x8 ;;
    lazyattn) # the last Tiles.lazy_attn attention chunks with GVM_FLAG_LAZY (0: none, the default) against 132 / 264 / all, and 264 without attn_tail's half chunks;
              # two dynamic rounds in swapped order, then static once for the third target's comparison
           timeout 200 python3 tools/prebuild.py --trace base; echo "prebuild rc=$?"
           LA_CASES=sliding-c16-t8,full-c16-t8,full-c32-t8,sliding-c32-t8
           AB_TAIL=32 ab_rounds lazyattn tiles "a0:,a132:lazy_attn=132,a264:lazy_attn=264,aall:lazy_attn=100000,a264t0:lazy_attn=264+attn_tail=0" 250 --cases $LA_CASES --step 16x8,32x8
           timeout 120 python3 tools/sched_probe.py --out "$OUT/lazyattn_static.json" --modes static --variants base: --cases $LA_CASES --step 16x8,32x8 > "$OUT/lazyattn_static.log" 2>&1; echo "static rc=$?"; tail -8 "$OUT/lazyattn_static.log"
           (cd "$OUT" && tar czf lazyattn.tgz lazyattn_* && rm -f lazyattn_r*.json lazyattn_static.json) ;;
    lazyctl) # what the lazy rule costs the controller when no instruction has the flag: GVM_LAZY_CLAIMS 1 against 0 (main's controller but for the ballot's place; main: 0.481 / 0.448 us, session 41),
             # empty-instruction dispatch on the Muse kernel (test_dispatch_overhead's measure) in three alternating rounds, then one-token layers and steps
           timeout 200 python3 tools/prebuild.py base GVM_LAZY_CLAIMS=0; echo "prebuild rc=$?"
           timeout 150 python3 - > "$OUT/lazyctl_dispatch.log" 2>&1 <<'PY'
from gpuvm.device import VM
from gpuvm.device.bench import dispatch_overhead
vms = {"lazy": VM(0, groups=2, warm=True), "nolazy": VM(0, groups=2, warm=True, defines=(("GVM_LAZY_CLAIMS", "0"),))}
for r in range(3):
    for name, vm in (vms.items() if r % 2 == 0 else reversed(vms.items())):
        for mode in ("dynamic", "static"):
            print(f"round {r} {name:7s} {mode:8s} {dispatch_overhead(vm, mode)['us_per_instr_per_block']:.3f} us", flush=True)
PY
           echo "dispatch rc=$?"; cat "$OUT/lazyctl_dispatch.log" | tail -12
           timeout 200 python3 tools/sched_probe.py --out "$OUT/lazyctl_probe.json" --modes dynamic --depths 1 --variants "lazy:,nolazy:GVM_LAZY_CLAIMS=0" --cases full-c1-t1,sliding-c1-t1 --step 1x1,1x8 > "$OUT/lazyctl_probe.log" 2>&1; echo "probe rc=$?"; grep -v "^$" "$OUT/lazyctl_probe.log" | tail -8 ;;
    ncusrc) # Nsight Compute's per-instruction view of one op's test kernel: every SASS line with its warp-stall samples and
            # executed instructions, as CSV (gzipped). NCUSRC_OP=expert_up (default: the up list at 32 experts x 16 tokens,
            # the shared tile) or attn_chunk (its 'full' case as ops_check runs it the second time: every chunk, two groups a block)
            if [ "${NCUSRC_OP:-expert_up}" = attn_chunk ]; then K=gvm_check_attn_chunk; SKIP=1; CMD=(tools/ops_check.py --only attn_chunk)
            else K=gvm_check_expert_up; SKIP=2; CMD=(tools/expert_bench.py --shapes 32x16 --reps 3 --out /tmp/xb.json); fi
            timeout ${T_NCUSRC:-150} ncu --clock-control none --kernel-name $K --launch-skip $SKIP --launch-count 1 --section SourceCounters --section WarpStateStats -f -o /tmp/ncusrc python3 "${CMD[@]}" > "$OUT/ncusrc_$K.log" 2>&1; echo "ncu rc=$?"; tail -3 "$OUT/ncusrc_$K.log"
            ncu --import /tmp/ncusrc.ncu-rep --page source --csv --print-source sass 2> "$OUT/ncusrc_import.err" | gzip > "$OUT/ncu_source_$K.csv.gz"; echo "source page rc=${PIPESTATUS[0]}"; zcat "$OUT/ncu_source_$K.csv.gz" | head -3 | cut -c1-300 ;;
    chunks) # one conversation's full layers: 162 chunks of 1,024 keys beside the 64 late g tiles leave 38 of the 264
            # groups idle, and at 8 tokens attention is the longest phase (cacac56's full-c1-t8 trace: 21.1 -> 57.7 us,
            # 32.9 us a chunk; full-c1-t1: 16.8 a chunk, g done 3.6 us before the last). 896 keys (184 chunks) and
            # 832 (198) fill those groups; two rounds (Tiles.chunk, no rebuild). Session 58, H100: lost or level
            # (full-c1-t1 201.4 / 202.6 / 212.9 us, results/h100-s58/tilings-505a2a5/)
        AB_TAIL=8 ab_rounds chunks tiles "c1024:,c896:chunk=896,c832:chunk=832" ${T_CHUNKS:-120} \
            --cases ${CHUNKS_CASES:-full-c1-t1,full-c1-t8} --step "${CHUNKS_STEPS:-}" ;;
    bounds) # tests/gpu's two timing bounds (the GEMM stream at 1 and 8 tokens, the empty instruction) on the Muse kernel against the plain one, alternating rounds
        timeout ${T_BOUNDS:-150} python3 tools/bounds_ab.py --rounds 2 --out "$OUT/bounds_ab.json" > "$OUT/bounds_ab.log" 2>&1; echo "bounds_ab rc=$?"; tail -6 "$OUT/bounds_ab.log" ;;
    pfbound) # the loader's prefetch bound (GVM_PF_MAX_BYTES 8 KB, the default since session 8) against 16 / 4 / 0 KB: the one-token layers and step, two dynamic rounds
        timeout 200 python3 tools/prebuild.py base GVM_PF_MAX_BYTES=16384 GVM_PF_MAX_BYTES=4096 GVM_PF_MAX_BYTES=0 > "$OUT/prebuild_pf.log" 2>&1; echo "prebuild rc=$?"; cat "$OUT/prebuild_pf.log"
        ab_rounds pf variants "pf8:,pf16:GVM_PF_MAX_BYTES=16384,pf4:GVM_PF_MAX_BYTES=4096,pf0:GVM_PF_MAX_BYTES=0" ${T_PF:-170} \
            --cases ${PF_CASES:-full-c1-t1,sliding-c1-t1,full-c16-t1} --step "${PF_STEPS:-1x1}" ;;
    resched) # ptxas's reschedule alone (GVM_RESCHED_PROBE n: a never-run block of n live float4 in ATTN_CHUNK moves
             # the whole kernel's register allocation, so every op's hot loops are scheduled anew, nothing else changed):
             # the default build and two such draws of it, two rounds (session 61); add --draws to any A/B the same way
             timeout 200 python3 tools/prebuild.py base GVM_RESCHED_PROBE=16 GVM_RESCHED_PROBE=8 > "$OUT/prebuild_resched.log" 2>&1; cat "$OUT/prebuild_resched.log"
             AB_TAIL=40 ab_rounds resched variants "base:" ${T_RESCHED:-200} --draws 16,8 \
                 --cases ${RESCHED_CASES:-full-c32-t8,sliding-c32-t8,full-c1-t8,full-c1-t1} --step "${RESCHED_STEPS:-}" ;;
    partsprobe) # what holds a K-cut tile's last part ~12 us (NOTES.md session 62, Next 2): traced 4-layer 32 x 8 steps of
                # main's build, GVM_GEMM_PARTS_PROBE 1 (the last part stores zeros, reads no parts) and 2 (no ticket
                # either), each with staged_l2's parts: first / last us (the outputs are zeros: times only)
           for v in base: p1:GVM_GEMM_PARTS_PROBE=1 p2:GVM_GEMM_PARTS_PROBE=2; do
             variant "$v"
             timeout 120 python3 tools/step_trace.py --layers 4 --shape 32x8 --out "$OUT/pp_$n.npz" "${args[@]}" > "$OUT/pp_$n.log" 2>&1; echo "$n rc=$?"
             python3 tools/staged_l2.py "$OUT/pp_$n.npz" --bf16-pass-rows 128 | tee -a "$OUT/pp_$n.log" | grep "L2\."; done
           (cd "$OUT" && tar czf partsprobe.tgz pp_*.npz && rm -f pp_*.npz) ;;
    treeab) # this tree against a copy of it with ab/<dir>%<file> put back at <dir>/<file> (e.g. main's ops/experts.cuh:
            # git show main:ops/experts.cuh > ab/ops%experts.cuh before the call): the expert lists alone, then dynamic
            # layers and step 32 x 8 in four runs, trees alternated (base, new, new, base); end the steps with pack
            ls ab/*%* > /dev/null 2>&1 || { echo "treeab: no ab/<dir>%<file> to put back (both trees would be this one)"; exit 2; }
            M=/tmp/gvm_base_tree; tree_copy $M ab/*%*
            for t in new base; do d=$PWD; [ $t = base ] && d=$M; tree_bench $t $d; done
            for r in base1 new1 new2 base2; do d=$PWD; [ ${r%?} = base ] && d=$M; tree_probe $r $d; done ;;
    trees) # this tree ("new") against the trees ab/<name>/ describe (tools/ab_trees.sh name=ref ...: this one with
           # <dir>/<file> put back from ab/<name>/<dir>%<file>): their kernels built in parallel, the expert lists
           # alone (AB_SHAPES), then dynamic layers and steps (AB_CASES, AB_STEPS) in two rounds, the second in
           # reverse order, so that a drift over the call shows as a swap; end the steps with pack
           tree_names trees || exit 2
           for t in "${names[@]}"; do d=$(treedir "$t"); (cd "$d" && PYTHONPATH=$d python3 tools/prebuild.py base > "$OUT/prebuild_$t.log" 2>&1) & done; wait
           for t in "${names[@]}"; do echo "prebuild $t: $(tail -1 "$OUT/prebuild_$t.log")"; done
           for t in "${names[@]}"; do tree_bench "$t" "$(treedir "$t")"; done
           order=("${names[@]}"); for ((i = ${#names[@]} - 1; i >= 0; i--)); do order+=("${names[$i]}"); done
           r=0; for t in "${order[@]}"; do r=$((r + 1)); tree_probe "${r}_$t" "$(treedir "$t")"; done ;;
    treetrace) # each tree of `trees` traced in one step of TT_LAYERS layers (default 4) at TT_SHAPE (default 32x8), then
               # each ab tree's trace against new's, op by op (gpuvm trace --against): which phase a change moved (one run
               # a tree: read a phase's change against the layers' spread)
           tree_names treetrace || exit 2
           for t in "${names[@]}"; do d=$(treedir "$t")
             (cd "$d" && PYTHONPATH=$d timeout ${T_TT:-150} python3 tools/step_trace.py --layers ${TT_LAYERS:-4} --shape ${TT_SHAPE:-32x8} --out "$OUT/tt_$t.npz" > "$OUT/tt_$t.log" 2>&1)
             echo "step trace $t rc=$?"; tail -4 "$OUT/tt_$t.log"
           done
           for t in "${names[@]:1}"; do
             python3 -m gpuvm trace "$OUT/tt_$t.npz" --against "$OUT/tt_new.npz" > "$OUT/tt_${t}_against_new.txt" 2>&1
             echo "trace $t against new rc=$?"; cut -c1-220 "$OUT/tt_${t}_against_new.txt" | head -${TT_ROWS:-40}
           done
           (cd "$OUT" && tar czf treetrace.tgz tt_*.npz && rm -f tt_*.npz) ;;
    m2) # the staged GEMM's passes of two 64-row halves on one x stage (GVM_GEMM_XS_M2 1, the default) against 64 rows a
        # pass (0): GEMM ops_check at the shard's sizes, both builds in parallel, two rounds of the many-token layers
        # (session 58 on an H100, within prepared/many-tokens' tree: 256-token layers 1.1-2.0% faster, 128 level; session 59 on the H200: -1.7 / -2.2%, 128 level)
        timeout 120 python3 tools/ops_check.py --only gemm > "$OUT/ops_gemm.log" 2>&1; echo "ops_check gemm rc=$?"; tail -2 "$OUT/ops_gemm.log"
        timeout 200 python3 tools/prebuild.py base GVM_GEMM_XS_M2=0 > "$OUT/prebuild_m2.log" 2>&1; echo "prebuild rc=$?"; cat "$OUT/prebuild_m2.log"
        AB_TAIL=24 ab_rounds m2 variants "m2:,m1:GVM_GEMM_XS_M2=0" ${T_M2:-200} \
            --cases ${M2_CASES:-full-c32-t8,sliding-c32-t8,full-c16-t8,sliding-c16-t8} --step "${M2_STEPS:-}" ;;
    qktok) # QK_ROPE_KV ops of 2 / 4 new tokens (Tiles.qk_tokens) against 1: in 7c15528's H200 trace of full-c32-t8 its
           # phase is 16.3 us (9.5 in 8dfffa7's), and the op on the critical path ran after another of the 256 on the same
           # group (claimed 1.4 us after Wqkvg's signal, started 11.3 us later); two dynamic rounds (a tiling: one build)
        AB_TAIL=24 ab_rounds qktok tiles "qk1:,qk2:qk_tokens=2,qk4:qk_tokens=4" ${T_QKTOK:-150} \
            --cases ${QKTOK_CASES:-full-c32-t8,sliding-c32-t8,full-c16-t8,sliding-c16-t8} --step "${QKTOK_STEPS:-32x8}" ;;
    xdirect) # the shared tile's x path bounded (session 68): GVM_EXPR_PROBE 4096 (x copied straight into a second tile: no staging
             # pass, one barrier a K step; wrong values), 12288 (three tiles, two K steps ahead), 20480 (a tile by one bulk copy of a
             # stand-in region: a producer-laid-out x), 256 (no x): the lists alone and the many-token layers,
             # two rounds (XD_PROBES: the probe values)
           xp=${XD_PROBES:-4096 20480 12288 256}
           timeout 150 python3 tools/prebuild.py base $(for v in $xp; do echo GVM_EXPR_PROBE=$v; done) > "$OUT/prebuild_xd.log" 2>&1; cat "$OUT/prebuild_xd.log"
           for v in 0 $xp; do timeout 100 python3 tools/expert_bench.py --shapes 8x16,32x16,32x32,skew256 --reps 10 --define GVM_EXPR_PROBE=$v --out "$OUT/xb_$v.json" > "$OUT/xb_$v.log" 2>&1; echo "expert_bench $v rc=$?"; tail -9 "$OUT/xb_$v.log"; done
           AB_TAIL=20 ab_rounds xdirect variants "base:$(for v in $xp; do echo -n ",p$v:GVM_EXPR_PROBE=$v"; done)" ${T_XDIRECT:-150} \
               --cases full-c32-t8,sliding-c32-t8,full-c16-t8,sliding-c16-t8 --step '' ;;
    lpt) # the expert lists' walk order (session 68): GVM_EXP_LPT 2 (the default, most chunks of 32 tokens first) against 1
         # (most tokens first) and 0 (expert order), two rounds with reschedule draws
           timeout 200 python3 tools/prebuild.py base GVM_RESCHED_PROBE=8 GVM_RESCHED_PROBE=16 GVM_EXP_LPT=1 GVM_EXP_LPT=1+GVM_RESCHED_PROBE=8 \
               GVM_EXP_LPT=1+GVM_RESCHED_PROBE=16 GVM_EXP_LPT=0 GVM_EXP_LPT=0+GVM_RESCHED_PROBE=8 GVM_EXP_LPT=0+GVM_RESCHED_PROBE=16 > "$OUT/prebuild_lpt.log" 2>&1
           cat "$OUT/prebuild_lpt.log"
           AB_TAIL=40 ab_rounds lpt variants "ch:,tok:GVM_EXP_LPT=1,ord:GVM_EXP_LPT=0" ${T_LPT:-200} --draws 8,16 \
               --cases ${LPT_CASES:-full-c16-t8,sliding-c16-t8,full-c32-t8,sliding-c32-t8,full-c32-t1} --step "${LPT_STEPS:-32x8,16x8}"
           python3 tools/draws.py lpt="$OUT/lpt_r1.json,$OUT/lpt_r2.json" | tail -24 ;;
    pack) # every file under $OUT into one archive (the device tool returns eight files a call): last in the list of steps
          t=$(mktemp /tmp/gvm_pack.XXXXXX); tar czf "$t" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$t" "$OUT/all.tgz"; echo "packed: $OUT/all.tgz" ;;
    gputests) timeout ${T_GPUTESTS:-200} python3 -m pytest -q -p no:cacheprovider tests/gpu > "$OUT/tests_gpu.log" 2>&1; echo "tests/gpu rc=$?"; tail -4 "$OUT/tests_gpu.log" ;;
    vmtest) timeout ${T_VMTEST:-150} python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_vm.py > "$OUT/test_vm.log" 2>&1; echo "test_vm rc=$?"; tail -8 "$OUT/test_vm.log" ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
