"""Compile the kernel variants a GPU session will time, in parallel, into the
build cache (GPUVM_CACHE), so that the timed steps that follow load them at
once instead of each waiting for NVRTC in turn.

    PYTHONPATH=. python3 tools/prebuild.py [--trace] [MACRO=value[+MACRO=value] ...]

Each positional argument is one variant of the Muse kernel ('' or 'base' for
the default build; groups=N: built for N compute groups; a 'trace:' prefix
builds its traced version, e.g. trace:GVM_EXP_LPT=1 for tools/step_trace.py
--define GVM_EXP_LPT=1); --trace adds the traced build of the default.
"""
from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from gpuvm.device.build import BuildOptions, build
from tools.variants import parse_defines

Spec = tuple[bool, tuple[tuple[str, str], ...]]  # (traced, defines) of one kernel variant


def _one(spec: Spec) -> str:
    trace, defines = spec
    groups = int(dict(defines).get("groups", BuildOptions().max_groups))
    defines = tuple(d for d in defines if d[0] != "groups")
    t0 = time.time()
    try:
        b = build(BuildOptions(trace=trace, max_groups=groups, defines=defines))
    except Exception as e:  # reported, not raised: the other variants still build
        return f"FAIL {'trace ' if trace else ''}{defines}: {str(e).splitlines()[0]}"
    return f"ok   {'trace ' if trace else ''}{defines or 'default'}: {b.kernel.registers} registers, {time.time() - t0:.0f} s{' (cached)' if b.cached else ''}"


def specs_of(variants: list[str], trace: bool) -> list[Spec]:
    """(traced, defines) of each variant argument, and the traced default with trace."""
    out: list[Spec] = []
    for v in variants or [""]:
        traced = v.startswith("trace:")
        v = v.removeprefix("trace:")
        try:
            out.append((traced, () if v == "base" else parse_defines(v)))
        except ValueError as e:
            raise SystemExit(f"prebuild: {e}") from None
    if trace and (True, ()) not in out:
        out.append((True, ()))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="store_true", help="also the traced default build")
    ap.add_argument("variants", nargs="*", help="[trace:]MACRO=value[+MACRO=value] per variant (base: the default)")
    a = ap.parse_args()
    specs = specs_of(a.variants, a.trace)
    with ProcessPoolExecutor(max_workers=len(specs)) as ex:
        lines = list(ex.map(_one, specs))
    print("\n".join(lines), flush=True)
    return 1 if any(x.startswith("FAIL") for x in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
