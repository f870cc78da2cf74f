"""A tour of the gpuvm API on the small model; runs anywhere (GPU optional).

    PYTHONPATH=. python3 tools/example.py [--out DIR]

1. a generic program: declare tensors and counters, add ops, build, run on the
   CPU backend (and on the GPU VM when one is present);
2. one Muse decode layer lowered to the instruction set, run on the CPU
   backend and checked against the formula-level reference;
3. the scheduler model's timeline of the real shard's layer, exported for
   ui.perfetto.dev and as an HTML timeline;
4. a whole decode step of the small model (4 layers, LM head, argmax) decoding
   several steps, each step's tokens fed to the next.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch

from gpuvm import DType, Op, Program, f2i
from gpuvm.cpu import run_stream
from gpuvm.env import has_gpu
from gpuvm.muse import SHARD, SMALL, bind_layer, lower_layer, make_inputs, make_layer_weights, make_state, reference_layer
from gpuvm.sim import simulate
from gpuvm.trace.html import write_html
from gpuvm.trace.perfetto import write_perfetto
from gpuvm.trace.summary import summarize


def generic_program() -> None:
    p = Program("axpy")
    x = p.tensor("x", (4096,), DType.F32)
    y = p.tensor("y", (4096,), DType.F32)
    copied = p.counter("y = x")
    for i0 in range(0, 4096, 1024):  # four tiles, each signals the counter once
        p.op(Op.COPY, [y, x], [i0, 1024], signal=copied, label=f"copy[{i0}]")
    p.op(Op.SCALE_ADD, [y, x, y], [0, 4096, f2i(2.0), f2i(1.0)], waits=[copied], label="y = 2x + y")
    stream = p.build()
    print(stream.summary())
    bufs = {"x": torch.randn(4096), "y": torch.zeros(4096)}
    run_stream(stream, bufs, step=0, order="random", rng=random.Random(0))
    assert torch.allclose(bufs["y"], 3 * bufs["x"])
    if has_gpu():
        from gpuvm.device import VM

        gbufs = {"x": bufs["x"].cuda(), "y": torch.zeros(4096, device="cuda")}
        VM().load(stream, gbufs).run(step=0)
        torch.cuda.synchronize()
        assert torch.allclose(gbufs["y"].cpu(), 3 * bufs["x"])
        print("  same answer on the GPU VM")


def muse_layer() -> None:
    w = make_layer_weights(SMALL, layer=0, seed=1)  # layer 0 is a sliding layer
    state = make_state(SMALL, "sliding", conversations=4, tokens_each=2, context=100, seed=2)
    s = make_inputs(SMALL, state, seed=3)
    ref = reference_layer(SMALL, w, state.clone(), s.clone(), "sliding")
    lp = lower_layer(SMALL, "sliding", 4, 2, state.slots)
    print(lp.stream.summary())
    bufs = bind_layer(lp, w, state, s)
    run_stream(lp.stream, bufs, step=0, order="random", rng=random.Random(4))
    err = float((bufs["s"] - ref.s_out).norm() / ref.s_out.norm())
    print(f"  CPU backend vs reference: relative error {err:.2e}")
    assert err < 1e-2


def model_timeline(out: Path) -> None:
    lp = lower_layer(SHARD, "full", 1, 1, 81_984)
    r = simulate(lp.stream)
    print(f"  model: shard full layer, 1 token: {r.makespan_ns / 1e3:.1f} µs over {len(lp.stream)} instructions")
    out.mkdir(parents=True, exist_ok=True)
    write_perfetto(r.trace, out / "model_full_t1.perfetto.json")
    write_html(r.trace, out / "model_full_t1.html")
    print("\n".join(summarize(r.trace).splitlines()[:8]))


def decode_steps(steps: int = 4) -> None:
    from gpuvm.muse.step import bind_step, lower_step, make_step_state
    from gpuvm.muse.weights import make_model_weights

    weights = make_model_weights(SMALL, seed=1)
    state = make_step_state(SMALL, conversations=2, tokens_each=1, context=70, seed=2, steps=steps)
    sp = lower_step(SMALL, 2, 1, state.context_capacity)
    print(sp.stream.summary())
    tokens = torch.tensor([5, 9], dtype=torch.int32)  # EMBED reads it, ARGMAX overwrites it
    bufs = bind_step(sp, weights, state, tokens)
    schedule = state.convs_schedule(steps)  # positions of each step
    counters = None
    for k in range(steps):
        state.convs.copy_(schedule[k])
        counters = run_stream(sp.stream, bufs, step=k, counters=counters)  # counters carry over
        print(f"  step {k}: tokens {tokens.tolist()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out", help="folder for the exported traces")
    a = ap.parse_args()
    print("1. a generic program")
    generic_program()
    print("2. a Muse decode layer on the small model")
    muse_layer()
    print("3. the scheduler model's timeline of the real shard")
    model_timeline(Path(a.out))
    print("4. decoding with the whole-step program of the small model")
    decode_steps()


if __name__ == "__main__":
    main()
