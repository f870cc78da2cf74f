"""The `gpuvm` command: sweep, trace, info."""
from __future__ import annotations

import argparse
import sys


class UserError(Exception):
    """Bad input from the command line: printed as one line, exit code 2."""


def _sweep(argv: list[str]) -> int:
    from .sweep import sweep_main

    return sweep_main(argv)


def _trace(argv: list[str]) -> int:
    from .trace.cli import trace_main

    return trace_main(argv)


def _info(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="gpuvm info", description="What gpuvm sees on this machine.").parse_args(argv)
    from .env import describe

    print(describe())
    return 0


COMMANDS = {
    "sweep": (_sweep, "measure the decode cases (GPU) or check and model them (CPU)"),
    "trace": (_trace, "turn a trace file into Perfetto JSON, an HTML timeline and a summary"),
    "info": (_info, "show the device, toolchain and kernel build report"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = ["usage: gpuvm COMMAND [ARGS]", "", "commands:"]
        lines += [f"  {name:<8}{help_}" for name, (_, help_) in COMMANDS.items()]
        print("\n".join(lines), file=sys.stdout if argv and argv[0] in ("-h", "--help") else sys.stderr)
        if argv and argv[0] not in ("-h", "--help"):
            print(f"gpuvm: error: unknown command {argv[0]!r}", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    fn, _ = COMMANDS[argv[0]]
    try:
        return fn(argv[1:])
    except UserError as e:
        print(f"gpuvm: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpuvm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # run as gpuvm.cli, so that UserError is the one submodules raise
    from gpuvm.cli import main as _main

    sys.exit(_main())
