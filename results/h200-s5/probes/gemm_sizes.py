import torch, json, sys
from gpuvm.device import VM
from gpuvm.device.bench import StreamRead, gemm_bandwidth
vm = VM(0, groups=2, trace=False, warm=True)
res = []
for rep in range(2):
    fl = StreamRead(vm).measure()
    fl1 = StreamRead(vm, nbytes=1 << 30).measure()
    print(f"stream read 2 GiB {fl['tb_s']:.3f}  1 GiB {fl1['tb_s']:.3f}", flush=True)
    for n, rows, depth in ((131072, 64, 2), (262144, 64, 2), (262144, 32, 2), (262144, 64, 1), (262144, 128, 2)):
        for t in (1, 8):
            r = gemm_bandwidth(vm, t, n=n, rows=rows, claim_depth=depth)
            print(f"GEMM {n*4096*2>>20} MiB rows {rows} depth {depth} T={t}: {r['tb_s']:.3f} TB/s = {r['tb_s']/fl['tb_s']:.1%} (of 1 GiB read {r['tb_s']/fl1['tb_s']:.1%})", flush=True)
            res.append(dict(n=n, rows=rows, depth=depth, t=t, tb_s=r['tb_s'], read2=fl['tb_s'], read1=fl1['tb_s']))
json.dump(res, open(sys.argv[1], "w"), indent=1)
