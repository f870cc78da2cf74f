"""`gpuvm trace FILE [--perfetto OUT.json] [--html OUT.html] [--summary] [--against OTHER]`.

trace_main gets the arguments after "trace". With no output option it prints
the summary; with --against, FILE and OTHER compared op by op. Bad input
(usage, a missing or corrupt trace, an unwritable output, two traces of
different programs) prints one line "gpuvm: error: ..." to stderr and returns 2.
"""
from __future__ import annotations

import argparse
import sys

from .format import Trace, TraceError
from .html import write_html
from .perfetto import write_perfetto
from .summary import compare, summarize


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gpuvm trace", description="Turn a gpuvm trace (.npz) into a Perfetto trace, an HTML timeline or a text summary.")
    p.add_argument("file", help="trace file written by Trace.save (GPU run or scheduler model)")
    p.add_argument("--perfetto", metavar="OUT.json", help="write a Chrome JSON trace for ui.perfetto.dev")
    p.add_argument("--html", metavar="OUT.html", help="write a self-contained per-op timeline page")
    p.add_argument("--summary", action="store_true", help="print the text summary (the default when no output is asked for)")
    p.add_argument("--against", metavar="OTHER.npz", help="compare with another trace of the same program op by op (e.g. static against dynamic)")
    p.add_argument("--bw", type=float, metavar="TB/s", help="streaming-read bandwidth of the per-op floors (default: the trace's own, else 4.42)")
    return p


def trace_main(argv: list[str]) -> int:
    """Run `gpuvm trace` on argv (the arguments after "trace"); returns the exit code."""
    try:
        args = _parser().parse_args(argv)
        trace = Trace.load(args.file)
        if args.perfetto:
            n = write_perfetto(trace, args.perfetto)
            print(f"wrote {args.perfetto} ({n} events)", file=sys.stderr)
        if args.html:
            write_html(trace, args.html)
            print(f"wrote {args.html}", file=sys.stderr)
        if args.against:
            sys.stdout.write(compare(trace, Trace.load(args.against), ("this", "other")))
        if args.summary or not (args.perfetto or args.html or args.against):
            sys.stdout.write(summarize(trace, args.bw))
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except (_UsageError, TraceError, ValueError) as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "))
    return 0


def _fail(message: str) -> int:
    print(f"gpuvm: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(trace_main(sys.argv[1:]))
