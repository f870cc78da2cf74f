import json, sys
from gpuvm.device import VM
from gpuvm.device.bench import dispatch_overhead
res = {}
vms = {a: VM(groups=2, muse_ops=False, defines=(("GVM_CLAIM_AHEAD", str(a)),)) for a in (3, 2, 1)}
for rep in range(3):
    for a, vm in vms.items():
        for mode in ("dynamic", "static"):
            r = dispatch_overhead(vm, mode)
            res.setdefault(f"ahead{a}/{mode}", []).append(r["us_per_instr_per_block"])
for k, v in res.items():
    print(f"{k:16s} " + " ".join(f"{x:.3f}" for x in v), flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
