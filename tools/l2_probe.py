"""Can weights be put into L2 ahead of the op that reads them (issue 6)?

At one token the HBM idles through every latency-bound op of a layer (norms,
RoPE, merge, top-k, combine: ~60 us of ~146), while each GEMM phase streams
its weights at ~2-3 TB/s. This asks, outside the VM, with every time taken by
%globaltimer inside the kernels (L2 flushed by a 256 MB write before each):

1. read: a weight-sized buffer read with evict-first 16-byte loads by every
   SM (as the GEMM tiles do), cold; and again once it is in L2 (hot).
2. prefetch: `cp.async.bulk.prefetch.L2` of the buffer by G blocks in 8 KB
   chunks, then the same read after a delay: does the read run at the hot
   speed, and how long after the prefetch's issue?
3. latency: one thread chasing pointers through 2 MB of L2-resident lines
   (what the latency-bound ops feel), binned over time while a prefetch or a
   read of 48 MB from HBM runs on other SMs.

    PYTHONPATH=. python3 tools/l2_probe.py --out out/l2_probe.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

SRC = r"""
__device__ __forceinline__ unsigned long long gt() {
    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
__device__ __forceinline__ void spin_until(unsigned long long t) {
    while (gt() < t) asm volatile("nanosleep.u32 100;");
}
// stamps[2b], stamps[2b+1]: block b's start (after the delay) and end.
extern "C" __global__ void __launch_bounds__(256) rd(const int4* w, unsigned long long n16, unsigned long long delay_ns,
                                                     unsigned long long* stamps, int* sink) {
    __shared__ unsigned long long t0;
    if (threadIdx.x == 0) { if (delay_ns) spin_until(gt() + delay_ns); t0 = gt(); }
    __syncthreads();
    unsigned long long pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    int acc = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n16; i += 4 * step) {
        int4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const unsigned long long j = i + u * step;
            if (j < n16)
                asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.s32 {%0,%1,%2,%3}, [%4], %5;"
                             : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(w + j), "l"(pol));
            else v[u] = make_int4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    __syncthreads();
    if (threadIdx.x == 0) { stamps[2 * blockIdx.x] = t0; stamps[2 * blockIdx.x + 1] = gt(); }
    if (acc == 0x7a5b3c1d) sink[0] = acc;
}
// Each block takes a contiguous share of [w, w + bytes); its threads issue
// chunk-byte bulk prefetches; pace_ns > 0: one 64 KB round every pace_ns.
extern "C" __global__ void __launch_bounds__(128) pf(const char* w, unsigned long long bytes, unsigned chunk,
                                                     unsigned long long pace_ns, unsigned long long* stamps) {
    const unsigned long long share = (bytes / gridDim.x + 15) & ~15ull;
    const unsigned long long b = share * blockIdx.x, e = b + share < bytes ? b + share : bytes;
    const unsigned long long t0 = gt();
    if (pace_ns == 0) {
        for (unsigned long long a = b + (unsigned long long)threadIdx.x * chunk; a < e; a += (unsigned long long)blockDim.x * chunk) {
            const unsigned n = e - a < chunk ? (unsigned)(e - a) : chunk;
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(w + a), "r"(n) : "memory");
        }
    } else if (threadIdx.x == 0) {
        unsigned long long round = 0;
        for (unsigned long long a = b; a < e; a += 65536, ++round) {
            spin_until(t0 + round * pace_ns);
            for (unsigned long long c = a; c < a + 65536 && c < e; c += chunk) {
                const unsigned n = e - c < chunk ? (unsigned)(e - c) : chunk;
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(w + c), "r"(n) : "memory");
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) { stamps[2 * blockIdx.x] = t0; stamps[2 * blockIdx.x + 1] = gt(); }
}
// One thread follows next[] for n hops, stamping the time every 16 hops.
extern "C" __global__ void chase(const unsigned* next, unsigned n, unsigned long long delay_ns, unsigned long long* t, unsigned* sink) {
    if (delay_ns) spin_until(gt() + delay_ns);
    unsigned j = 0;
    for (unsigned i = 0; i < n; ++i) {
        if ((i & 15) == 0) t[i >> 4] = gt();
        asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(j) : "l"(next + j) : "memory");
    }
    sink[0] = j;
}
"""


class Probe:
    def __init__(self) -> None:
        from cuda.core import Device, ObjectCode

        from gpuvm.device.build import compile_source

        self.dev = Device()
        self.dev.set_current()
        self.s1 = self.dev.create_stream()
        self.s2 = self.dev.create_stream()
        cubin, _ = compile_source(SRC, "l2_probe.cu", [], [])
        mod = ObjectCode.from_cubin(cubin)
        self.k = {n: mod.get_kernel(n) for n in ("rd", "pf", "chase")}
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.flushbuf = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        self.sink = torch.zeros(4, dtype=torch.int32, device="cuda")

    def _launch(self, stream, name: str, grid: int, block: int, *args) -> None:
        from cuda.core import LaunchConfig, launch

        launch(stream, LaunchConfig(grid=grid, block=block), self.k[name], *args)

    def flush(self) -> None:
        torch.cuda.synchronize()
        self.flushbuf.fill_(1)
        torch.cuda.synchronize()

    def read(self, w: torch.Tensor, delay_ns: int = 0, stream=None, blocks: int | None = None) -> torch.Tensor:
        blocks = blocks or 2 * self.sms
        st = torch.zeros(2 * blocks, dtype=torch.int64, device="cuda")
        self._launch(stream or self.s1, "rd", blocks, 256, w.data_ptr(), np.uint64(w.numel() // 16),
                     np.uint64(delay_ns), st.data_ptr(), self.sink.data_ptr())
        return st

    def prefetch(self, w: torch.Tensor, blocks: int, chunk: int = 8192, pace_ns: int = 0, stream=None) -> torch.Tensor:
        st = torch.zeros(2 * blocks, dtype=torch.int64, device="cuda")
        self._launch(stream or self.s1, "pf", blocks, 128, w.data_ptr(), np.uint64(w.numel()), np.uint32(chunk),
                     np.uint64(pace_ns), st.data_ptr())
        return st


def span_us(st: torch.Tensor) -> float:
    """First block's start to last block's end of a kernel's stamps, us."""
    a = st.view(-1, 2).cpu().numpy().astype(np.int64)
    return float(a[:, 1].max() - a[:, 0].min()) / 1e3


def run(out: Path) -> dict:
    p = Probe()
    res: dict[str, object] = {}
    s1 = p.s1

    def sync() -> None:
        s1.sync()
        p.s2.sync()

    for mb in (16, 32, 48):
        w = torch.ones(mb << 20, dtype=torch.uint8, device="cuda")
        r: dict[str, object] = {}
        cold = []
        hot = []
        for _ in range(5):
            p.flush()
            st = p.read(w); sync(); cold.append(span_us(st))
            st = p.read(w); sync(); hot.append(span_us(st))
        r["cold_us"], r["hot_us"] = float(np.median(cold)), float(np.median(hot))
        for blocks, pace in ((132, 0), (32, 0), (8, 0), (132, 2000), (32, 500)):
            for delay in (5_000, 20_000, 60_000):
                ts, iss = [], []
                for _ in range(5):
                    p.flush()
                    sp = p.prefetch(w, blocks, pace_ns=pace)
                    st = p.read(w, delay_ns=delay)
                    sync()
                    iss.append(span_us(sp))
                    ts.append(span_us(st))
                r[f"pf{blocks}/pace{pace}/delay{delay // 1000}us"] = {"read_us": float(np.median(ts)), "issue_us": float(np.median(iss))}
        res[f"{mb}MB"] = r
        print(f"{mb} MB: cold {r['cold_us']:.1f} us ({mb * 1.048576 / r['cold_us']:.2f} TB/s), hot {r['hot_us']:.1f} us", flush=True)
        for k, v in r.items():
            if isinstance(v, dict):
                print(f"   {k:28s} read {v['read_us']:6.1f} us  issue {v['issue_us']:6.1f} us", flush=True)

    # latency of an L2-resident chase, binned against another load's start
    lines = (2 << 20) // 128
    perm = np.random.default_rng(0).permutation(lines)
    nxt = np.zeros(lines * 32, dtype=np.uint32)
    order = np.roll(perm, -1)
    nxt[perm * 32] = order * 32
    nxt_t = torch.from_numpy(nxt.view(np.int32)).cuda()
    hops = 20000
    tt = torch.zeros(hops // 16, dtype=torch.int64, device="cuda")
    w = torch.ones(48 << 20, dtype=torch.uint8, device="cuda")
    lat: dict[str, object] = {}
    for name in ("alone", "prefetch132", "prefetch32", "prefetch32-paced", "read100", "read32"):
        bins_all = []
        for _ in range(3):
            p.flush()
            p._launch(p.s2, "chase", 1, 1, nxt_t.data_ptr(), np.uint32(hops), np.uint64(0), tt.data_ptr(), p.sink.data_ptr())
            p.s2.sync()  # warm: the chase's lines now in L2
            p._launch(p.s2, "chase", 1, 1, nxt_t.data_ptr(), np.uint32(hops), np.uint64(0), tt.data_ptr(), p.sink.data_ptr())
            if name == "prefetch132":
                st = p.prefetch(w, 132)
            elif name == "prefetch32":
                st = p.prefetch(w, 32)
            elif name == "prefetch32-paced":
                st = p.prefetch(w, 32, pace_ns=500)
            elif name == "read100":
                st = p.read(w, delay_ns=20_000, blocks=100)
            elif name == "read32":
                st = p.read(w, delay_ns=20_000, blocks=32)
            else:
                st = None
            sync()
            t = tt.cpu().numpy().astype(np.int64)
            ref = t[0] if st is None else int(st.view(-1, 2)[:, 0].min().item())
            per_hop = np.diff(t) / 16.0
            mid = (t[:-1] - ref) / 1e3
            bins = {}
            for lo in range(-10, 80, 5):
                m = (mid >= lo) & (mid < lo + 5)
                if m.any():
                    bins[lo] = float(np.median(per_hop[m]))
            bins_all.append(bins)
        keys = sorted(set().union(*bins_all))
        lat[name] = {k: float(np.median([b[k] for b in bins_all if k in b])) for k in keys}
        print(f"chase ns/hop, {name}: " + " ".join(f"{k}:{v:.0f}" for k, v in lat[name].items()), flush=True)
    res["chase_ns_per_hop_by_us_from_start"] = lat
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/l2_probe.json")
    a = ap.parse_args()
    run(Path(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
