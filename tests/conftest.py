"""Session-wide test settings.

- Workers: with `-n auto` (pytest-xdist; the README's test command) the CPU
  tests run on min(cores, 8) workers, each taking whole files (`--dist
  loadfile`: a file's compiled kernels are module fixtures, built once). Where
  a CUDA device is visible it is 0 workers, one process as before: the GPU
  tests' timing bounds must not share the machine with other tests.
- The CI log's resource report: tests record lines through the `ci_report`
  fixture (a user property) and the session's summary prints them. A print
  with capture disabled would not reach the log from an xdist worker.
"""
from __future__ import annotations

import os
from typing import Callable

import pytest

REPORT = "ci_report"  # the user property of the lines the summary prints


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    import torch

    return 0 if torch.cuda.is_available() else min(os.cpu_count() or 1, 8)


@pytest.fixture
def ci_report(record_property: Callable[[str, object], None]) -> Callable[[str], None]:
    """Records a line for the session summary's resource report."""
    return lambda line: record_property(REPORT, line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = [value for reports in terminalreporter.stats.values() for r in reports
             if getattr(r, "when", None) == "call" for key, value in getattr(r, "user_properties", ()) if key == REPORT]
    if lines:
        terminalreporter.section("device build: registers, shared memory, code, spills")
        for line in lines:
            terminalreporter.write_line(line)
