"""The Python mirror of isa/gvm_isa.h agrees with what a C compiler makes of it."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from gpuvm import isa


def _probe_source() -> str:
    lines = ['#include <stdio.h>', '#include <stddef.h>', f'#include "{isa.HEADER}"', "int main(void) {"]
    for rec, dt in isa.RECORDS.items():
        lines.append(f'printf("size {rec} %zu\\n", sizeof({rec}));')
        for field in dt.names:
            lines.append(f'printf("offset {rec}.{field} %zu\\n", offsetof({rec}, {field}));')
            lines.append(f'printf("fsize {rec}.{field} %zu\\n", sizeof((({rec}*)0)->{field}));')
    enums = [("GVM_OP_", isa.Op), ("GVM_DT_", isa.DType), ("GVM_STAMP_", isa.Stamp), ("GVM_ERR_", isa.ErrorCode)]
    for prefix, en in enums:
        for m in en:
            lines.append(f'printf("enum {prefix}{m.name} %d\\n", (int){prefix}{m.name});')
    for name, value in isa.DEFINES.items():
        if isinstance(value, int):
            lines.append(f'printf("define {name} %lld\\n", (long long)({name}));')
    lines += ["return 0;", "}"]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on this machine")
    d = tmp_path_factory.mktemp("isa")
    src, exe = d / "probe.c", d / "probe"
    src.write_text(_probe_source())
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in out.splitlines()}


def test_record_layouts_match_header(probe: dict[str, int]) -> None:
    for rec, dt in isa.RECORDS.items():
        assert probe[f"size {rec}"] == dt.itemsize, rec
        for field in dt.names:
            sub, off = dt.fields[field][0], dt.fields[field][1]
            assert probe[f"offset {rec}.{field}"] == off, f"{rec}.{field} offset"
            assert probe[f"fsize {rec}.{field}"] == sub.itemsize, f"{rec}.{field} size"


def test_enums_and_defines_match_header(probe: dict[str, int]) -> None:
    for prefix, en in [("GVM_OP_", isa.Op), ("GVM_DT_", isa.DType), ("GVM_STAMP_", isa.Stamp), ("GVM_ERR_", isa.ErrorCode)]:
        for m in en:
            assert probe[f"enum {prefix}{m.name}"] == int(m), m
    for name, value in isa.DEFINES.items():
        if isinstance(value, int):
            assert probe[f"define {name}"] == value, name


def test_float_args_round_trip() -> None:
    for x in (0.0, 1.0, -2.5, 1e-6, 3.0e38):
        assert isa.i2f(isa.f2i(x)) == pytest.approx(x, rel=1e-7)
